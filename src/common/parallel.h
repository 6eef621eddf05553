// parallel_for: threads take chunks of [0, n) from an atomic counter.
//
// Work items must be independent; the result of each item may not depend on which thread ran
// it, so outputs are the same for any thread count.
//
// The threads are a persistent pool, started on first use and parked (blocked on a condition
// variable, after a short spin) between calls, so a call costs a wake-up rather than thread
// creation, and the caller takes chunks itself from the start: a helper still waking when the
// chunks run out is not waited for (parallel.cc); one caller uses the pool at a time, and a call
// made while it is busy (from another thread, or from inside a work item) starts threads of its
// own as before. A call with one thread runs inline. Hand-written rather than OpenMP: OpenMP's
// runtime would be a second pool beside the ones OpenBLAS and libtorch start in the same process,
// and its static schedule waits for the slowest thread where the counter lets a thread slowed by
// other jobs take fewer items.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace attnscale {

// The thread count to use: `requested` if > 0, else $ATTNSCALE_THREADS if set, else every
// hardware thread. Never more than `items` (and at least 1).
int resolve_threads(int requested, std::int64_t items = INT64_MAX);

// A non-owning reference to a callable fn(begin, end, thread_index): unlike std::function it
// never allocates (the callable outlives the call it is passed to).
class ChunkFn {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, ChunkFn>>>
  ChunkFn(F&& f)  // NOLINT: implicit, so that a lambda can be passed directly
      : obj_(const_cast<void*>(static_cast<const void*>(&f))), call_([](void* o, std::int64_t b, std::int64_t e, int t) {
          (*static_cast<std::remove_reference_t<F>*>(o))(b, e, t);
        }) {}
  void operator()(std::int64_t b, std::int64_t e, int t) const { call_(obj_, b, e, t); }

 private:
  void* obj_;
  void (*call_)(void*, std::int64_t, std::int64_t, int);
};

// Calls fn(begin, end, thread_index) over chunks of `chunk` items until [0, n) is covered.
void parallel_for(std::int64_t n, std::int64_t chunk, int threads, ChunkFn fn);

namespace detail {
// Scratch objects kept between calls (see PerThread): a type S that says which construction
// arguments it can serve (`bool fits(args...) const`) is reused instead of reallocated. Each is
// kept with the thread index that last used it and goes back to that index first: thread t of
// the next call then writes memory its own core's cache still holds, where an object of thread
// t' would have its lines fetched from the other core (a short decode call on two threads, warm,
// GQA 32/8, 64 keys: docs/performance.md).
template <class S>
class ScratchCache {
 public:
  template <class... Args>
  static std::unique_ptr<S> take(int t, const Args&... args) {
    std::lock_guard<std::mutex> lock(mutex());
    auto& v = items();
    std::size_t found = v.size();
    for (std::size_t i = v.size(); i-- > 0;)
      if (v[i].second->fits(args...)) {
        if (found == v.size()) found = i;  // the newest that fits, unless one of thread t's does
        if (v[i].first == t) {
          found = i;
          break;
        }
      }
    if (found == v.size()) return nullptr;
    std::unique_ptr<S> s = std::move(v[found].second);
    v.erase(v.begin() + static_cast<std::ptrdiff_t>(found));
    return s;
  }
  static void put(int t, std::unique_ptr<S> s) {
    std::lock_guard<std::mutex> lock(mutex());
    auto& v = items();
    if (v.size() >= kKeep) v.erase(v.begin());  // the oldest goes
    v.emplace_back(t, std::move(s));
  }

 private:
  static constexpr std::size_t kKeep = 8;
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<std::pair<int, std::unique_ptr<S>>>& items() {
    static std::vector<std::pair<int, std::unique_ptr<S>>> v;
    return v;
  }
};
}  // namespace detail

// Per-thread scratch for parallel_for, built on a thread's first item (a thread that gets no
// work allocates nothing): `PerThread<S> s(threads); ... S& mine = s.get(t, ctor args...);`.
// When S has `bool fits(ctor args...) const`, objects are taken from and returned to a cache
// shared by all calls, so repeated calls of the same shape allocate nothing.
template <class S>
class PerThread {
 public:
  explicit PerThread(int threads) {
    if (threads > kInline) extra_.resize(static_cast<std::size_t>(threads - kInline));
  }
  PerThread(const PerThread&) = delete;
  PerThread& operator=(const PerThread&) = delete;
  ~PerThread() {
    if constexpr (kRecycled) {
      for (std::size_t t = 0; t < inline_.size(); ++t)
        if (inline_[t]) detail::ScratchCache<S>::put(static_cast<int>(t), std::move(inline_[t]));
      for (std::size_t t = 0; t < extra_.size(); ++t)
        if (extra_[t]) detail::ScratchCache<S>::put(kInline + static_cast<int>(t), std::move(extra_[t]));
    }
  }
  template <class... Args>
  S& get(int t, Args&&... args) {
    auto& slot = t < kInline ? inline_[static_cast<std::size_t>(t)] : extra_[static_cast<std::size_t>(t - kInline)];
    if (!slot) {
      if constexpr (kRecycled) slot = detail::ScratchCache<S>::take(t, args...);
      if (!slot) slot = std::make_unique<S>(std::forward<Args>(args)...);
    }
    return *slot;
  }

 private:
  template <class U, class = void>
  struct Fits : std::false_type {};
  template <class U>
  struct Fits<U, std::void_t<decltype(&U::fits)>> : std::true_type {};
  static constexpr bool kRecycled = Fits<S>::value;
  static constexpr int kInline = 8;
  std::array<std::unique_ptr<S>, kInline> inline_{};
  std::vector<std::unique_ptr<S>> extra_;
};

}  // namespace attnscale
