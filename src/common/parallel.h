// parallel_for: threads take chunks of [0, n) from an atomic counter.
//
// Work items must be independent; the result of each item may not depend on which thread ran
// it, so outputs are the same for any thread count.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace attnscale {

// The thread count to use: `requested` if > 0, else $ATTNSCALE_THREADS if set, else every
// hardware thread. Never more than `items` (and at least 1).
int resolve_threads(int requested, std::int64_t items = INT64_MAX);

// Calls fn(begin, end, thread_index) over chunks of `chunk` items until [0, n) is covered.
void parallel_for(std::int64_t n, std::int64_t chunk, int threads,
                  const std::function<void(std::int64_t, std::int64_t, int)>& fn);

// Per-thread scratch for parallel_for, built on a thread's first item (a thread that gets no
// work allocates nothing): `PerThread<S> s(threads); ... S& mine = s.get(t, ctor args...);`
template <class S>
class PerThread {
 public:
  explicit PerThread(int threads) : slots_(static_cast<std::size_t>(threads)) {}
  template <class... Args>
  S& get(int t, Args&&... args) {
    auto& slot = slots_[static_cast<std::size_t>(t)];
    if (!slot) slot = std::make_unique<S>(std::forward<Args>(args)...);
    return *slot;
  }

 private:
  std::vector<std::unique_ptr<S>> slots_;
};

}  // namespace attnscale
