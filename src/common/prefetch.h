// Asking for memory before it is read: the cache lines of a byte range, into the first-level
// cache (near) or the second (far).
//
// Written as asm on x86, not __builtin_prefetch (nor _mm_prefetch or hwy::Prefetch, which expand
// to it): GCC 12 counts a prefetch as an instruction without effect, so a function or lambda whose
// only work is prefetching counts as one without effect too, and its calls are removed before they
// are inlined. The decode kernel's prefetch lambda (kv_stream_row.cc) compiled to nothing that way;
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

// The lines of rows [0, n) of `bytes` each, prefetched a few at a time (into the cache level
// feed_level() names for this CPU, prefetch.cc):
// a kernel given a feed calls pace() with the number of steps of its inner loop and next() once
// a step, so that a tile's prefetches are spread over the arithmetic instead of asked for in one
// burst, which fills the queue of outstanding misses and stalls the core until it drains (the
// arithmetic and the memory traffic then add up rather than overlap; docs/performance.md); the
// caller ends with rest() for what the steps left. A kernel copies the feed into a local, so that
// its position lives in registers. A default feed has nothing to fetch.
CacheLevel feed_level();

class LineFeed {
 public:
  LineFeed() = default;
  LineFeed(const void* const* rows, std::int64_t n, std::int64_t bytes)
      : rows_(rows), n_(n), bytes_(bytes), row_lines_((bytes + 63) / 64), level_(feed_level()) {
    // Rows that follow each other in memory (a contiguous cache, whatever the tile) are walked as
    // one run by a pointer: a line's prefetch then costs an add and a test, not a row lookup.
    // GQA 32/4, d = 128, two threads, calls alternated in one process: 0.717-0.730 of a copy
    // against 0.689-0.691 from DRAM, MQA 8/1 0.727-0.732 against 0.665-0.690; one thread, K and V
    // in cache, 38.3 / 41.6 ns a key against 39.9 / 42.6 (docs/performance.md).
    if (n > 0) {
      const auto at = [&](std::int64_t r) { return reinterpret_cast<std::uintptr_t>(rows[r]); };
      bool run = true;
      for (std::int64_t r = 1; r < n && run; ++r) run = at(r) == at(0) + static_cast<std::uintptr_t>(r * bytes);
      if (run) p_ = at(0), end_ = p_ + static_cast<std::uintptr_t>(n * bytes), row_ = n;  // no rows left to walk
    }
  }

  void pace(std::int64_t steps) {
    const std::int64_t left = end_ ? (p_ < end_ ? static_cast<std::int64_t>(end_ - p_ + 63) / 64 : 0)
                                   : (n_ - row_) * row_lines_ - off_ / 64;
    per_ = steps > 0 && left > 0 ? (left + steps - 1) / steps : 0;
  }
  // A run's step: one test, then per_ prefetches (the last step may ask for up to per_ - 1 lines
  // past the run's end, and a prefetch never faults); a walk over rows tests each line. Against a
  // step that tested the run's end before each line (the same lines asked for; Zen 3, GQA 32/4,
  // d = 128, both kernels' feeds, calls alternated in one process): Nkv = 65536, two threads,
  // float32 0.938-0.956 of the time, bf16 0.946-0.970, int8 0.967-0.969; Nkv = 2048, one thread,
  // 0.958-0.975 (docs/performance.md).
  // (The level is tested once a step, each loop with its own instruction.)
  void next() {
    if (p_ < end_) {
      if (level_ == CacheLevel::near)
        for (std::int64_t i = 0; i < per_; ++i) prefetch_line(line(64 * static_cast<std::uintptr_t>(i)), CacheLevel::near);
      else
        for (std::int64_t i = 0; i < per_; ++i) prefetch_line(line(64 * static_cast<std::uintptr_t>(i)), CacheLevel::far);
      p_ += 64 * static_cast<std::uintptr_t>(per_);
      return;
    }
    if (row_ < n_)
      for (std::int64_t i = 0; i < per_; ++i) one();
  }
  void rest() {
    for (; p_ < end_; p_ += 64) prefetch_line(line(0), level_);
    while (row_ < n_) one();
  }

 private:
  const void* line(std::uintptr_t off) const { return reinterpret_cast<const void*>(p_ + off); }
  void one() {
    if (row_ >= n_) return;
    prefetch_line(static_cast<const char*>(rows_[row_]) + off_, level_);
    if ((off_ += 64) >= bytes_) off_ = 0, ++row_;
  }

  const void* const* rows_ = nullptr;
  std::int64_t n_ = 0, bytes_ = 0, row_lines_ = 0, row_ = 0, off_ = 0, per_ = 0;
  // Rows one run of memory: the address of the next line, and of the run's end (0 and 0 otherwise).
  std::uintptr_t p_ = 0, end_ = 0;
  CacheLevel level_ = CacheLevel::near;
};

}  // namespace attnscale::detail
