// The CPU's vendor and family (CPUID leaves 0 and 1), read once: some kernels' shapes and some
// prefetches follow them (kernels.cc, prefetch.cc), each choice measured where it is made.
#pragma once

namespace attnscale::detail {

struct CpuModel {
  bool intel = false, amd = false;
  unsigned family = 0;
};
const CpuModel& cpu_model();

}  // namespace attnscale::detail
