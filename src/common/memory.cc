#include "common/memory.h"

#include <sys/mman.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "attnscale/error.h"

namespace attnscale::detail {

std::int64_t memory_limit_bytes() {
  struct sysinfo info {};
  if (sysinfo(&info) != 0) return std::int64_t{1} << 50;
  const double bytes = (static_cast<double>(info.totalram) + static_cast<double>(info.totalswap)) * info.mem_unit;
  return bytes > 0x1p62 ? std::int64_t{1} << 62 : static_cast<std::int64_t>(bytes);
}

std::string format_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

void check_allocation(const std::string& what, double bytes) {
  const std::int64_t limit = memory_limit_bytes();
  if (bytes > static_cast<double>(limit))
    throw Error(what + " needs " + format_bytes(bytes) + ", more than the " + format_bytes(static_cast<double>(limit)) +
                " of memory (RAM + swap) this machine has");
}

void* allocate_block(std::size_t bytes) {
  const bool huge = bytes >= (std::size_t{4} << 20);
  const std::size_t align = huge ? std::size_t{2} << 20 : 64;
  const std::size_t size = (std::max<std::size_t>(bytes, 1) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size);
#ifdef MADV_HUGEPAGE
  if (p && huge) madvise(p, size, MADV_HUGEPAGE);  // advice only: a refusal changes nothing
#endif
  return p;
}

}  // namespace attnscale::detail
