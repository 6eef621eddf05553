// Asking for memory before it is read: the cache lines of a byte range, into the first-level
// cache (near) or the second (far).
//
// Written as asm on x86, not __builtin_prefetch (nor _mm_prefetch or hwy::Prefetch, which expand
// to it): GCC 12 counts a prefetch as an instruction without effect, so a function or lambda whose
// only work is prefetching counts as one without effect too, and its calls are removed before they
// are inlined. The decode kernel's prefetch lambda (kv_kernels.cc) compiled to nothing that way;
// an asm statement marked volatile is kept. docs/performance.md has the measurements.
#pragma once
#include <cstdint>

namespace attnscale::detail {

enum class CacheLevel { near, far };  // prefetcht0 (first level and up), prefetcht1 (second and up)

inline void prefetch_line(const void* p, CacheLevel level) {
#if defined(__x86_64__) || defined(__i386__)
  if (level == CacheLevel::near)
    asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
  else
    asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
#else
  if (level == CacheLevel::near)
    __builtin_prefetch(p, 0, 3);
  else
    __builtin_prefetch(p, 0, 2);
#endif
}

// The lines of [p, p + bytes), one prefetch per 64 bytes from p.
inline void prefetch_bytes(const void* p, std::int64_t bytes, CacheLevel level) {
  for (std::int64_t c = 0; c < bytes; c += 64) prefetch_line(static_cast<const char*>(p) + c, level);
}

}  // namespace attnscale::detail
