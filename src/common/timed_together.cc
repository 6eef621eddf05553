#include "common/timed_together.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "common/parallel.h"

namespace attnscale {

namespace {
void pause() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}
// Pauses before a waiting thread starts yielding its CPU: about the pool's own spin (parallel.cc),
// long enough for an awake helper, short beside a loop of milliseconds.
constexpr int kSpins = 4000;
}  // namespace

bool StartBarrier::arrive_and_wait(int shares) {
  const Clock::rep now = Clock::now().time_since_epoch().count();
  Clock::rep unset = 0;
  first_.compare_exchange_strong(unset, now, std::memory_order_acq_rel);  // the first arrival's time
  const Clock::time_point deadline = Clock::time_point(Clock::duration(first_.load(std::memory_order_acquire))) + timeout_;
  if (arrived_.fetch_add(shares, std::memory_order_acq_rel) + shares >= participants_) {
    last_.store(now, std::memory_order_release);
    return !broken_.load(std::memory_order_acquire);
  }
  for (int spin = 0;; ++spin) {
    if (arrived_.load(std::memory_order_acquire) >= participants_) return true;
    if (broken_.load(std::memory_order_acquire)) return false;
    if (spin < kSpins) {
      pause();
      continue;
    }
    if (Clock::now() >= deadline) {
      broken_.store(true, std::memory_order_release);
      return false;
    }
    std::this_thread::yield();
  }
}

StartBarrier::Clock::duration StartBarrier::last_arrival_after_first() const {
  if (arrived_.load(std::memory_order_acquire) < participants_) return Clock::duration(0);
  return Clock::duration(last_.load(std::memory_order_acquire) - first_.load(std::memory_order_acquire));
}

TogetherTiming time_together(int threads, const std::function<void(int share)>& loop, TogetherOptions options) {
  using Clock = StartBarrier::Clock;
  threads = std::max(1, threads);
  const int attempts = std::max(1, options.attempts);
  TogetherTiming fastest;
  for (int attempt = 1; attempt <= attempts; ++attempt) {
    StartBarrier barrier(threads, options.timeout);
    std::vector<Clock::time_point> start(static_cast<std::size_t>(threads)), end(start.size());
    std::atomic<bool> broken{false};
    parallel_for(threads, 1, threads, [&](std::int64_t first, std::int64_t last, int) {
      // One share a thread, except where one thread runs them all (threads == 1): it arrives
      // with all of them, so that it never waits for itself.
      if (!barrier.arrive_and_wait(static_cast<int>(last - first))) broken.store(true, std::memory_order_relaxed);
      for (std::int64_t s = first; s < last; ++s) {
        start[static_cast<std::size_t>(s)] = Clock::now();
        loop(static_cast<int>(s));
        end[static_cast<std::size_t>(s)] = Clock::now();
      }
    });
    const auto [first_start, last_start] = std::minmax_element(start.begin(), start.end());
    const auto [first_end, last_end] = std::minmax_element(end.begin(), end.end());
    TogetherTiming t;
    t.seconds = std::chrono::duration<double>(*last_end - *first_start).count();
    t.start_wait = std::chrono::duration<double>(barrier.last_arrival_after_first()).count();
    t.attempts = attempt;
    // Apart: the barrier broke, or a thread started only after another had finished (descheduled
    // between the barrier and its loop for a whole loop's time), so that not all ran at once.
    t.together = !broken.load(std::memory_order_relaxed) && (threads == 1 || *last_start < *first_end);
    if (t.together) return t;
    if (attempt == 1 || t.seconds < fastest.seconds) fastest = t;
  }
  fastest.attempts = attempts;
  fastest.together = false;
  return fastest;
}

}  // namespace attnscale
