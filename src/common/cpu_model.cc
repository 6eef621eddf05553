#include "common/cpu_model.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace attnscale::detail {

const CpuModel& cpu_model() {
  static const CpuModel model = [] {
    CpuModel m;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return m;
    m.intel = b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;  // "GenuineIntel"
    m.amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;    // "AuthenticAMD"
    __get_cpuid(1, &a, &b, &c, &d);
    const unsigned base = (a >> 8) & 0xf;
    m.family = base == 0xf ? base + ((a >> 20) & 0xff) : base;
#endif
    return m;
  }();
  return model;
}

}  // namespace attnscale::detail
