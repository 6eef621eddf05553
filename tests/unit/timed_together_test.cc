// time_together and its StartBarrier (common/timed_together.h): every share run once a timing, on
// threads started together; no hang or deadlock with more threads than the machine has, with one
// thread, from inside a work item of the pool, or when a share never comes (the barrier's deadline
// lets the others through, and the timing is marked apart).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/parallel.h"
#include "common/timed_together.h"

namespace attnscale {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A loop of about `us` microseconds of spinning.
void spin_for(int us) {
  const auto until = Clock::now() + std::chrono::microseconds(us);
  while (Clock::now() < until) {
  }
}

// Runs time_together over `threads` shares of ~1 ms each and checks that every share ran once per
// timing made, that the timing counts at most `attempts`, and that it took no longer than every
// attempt's deadline and loops together allow.
TogetherTiming expect_each_share_once_a_timing(int threads, TogetherOptions options) {
  std::vector<std::atomic<int>> runs(static_cast<std::size_t>(threads));
  const auto t0 = Clock::now();
  const TogetherTiming t = time_together(
      threads,
      [&](int share) {
        runs[static_cast<std::size_t>(share)].fetch_add(1);
        spin_for(1000);
      },
      options);
  const double wall = seconds_since(t0);
  EXPECT_GE(t.attempts, 1);
  EXPECT_LE(t.attempts, options.attempts);
  for (int s = 0; s < threads; ++s) EXPECT_EQ(runs[static_cast<std::size_t>(s)].load(), t.attempts) << "share " << s;
  EXPECT_GT(t.seconds, 0);
  EXPECT_LE(t.seconds, wall);
  EXPECT_GE(t.start_wait, 0);
  if (!t.together) {
    EXPECT_EQ(t.attempts, options.attempts) << "apart is kept only after the last attempt";
  }
  // Each attempt: at most its deadline, then every share's loop (1 ms) one after another, with a
  // wide margin for a loaded machine (its threads preempted by other jobs).
  const double bound = options.attempts * (std::chrono::duration<double>(options.timeout).count() + threads * 1e-3) + 30;
  EXPECT_LT(wall, bound);
  return t;
}

TEST(StartBarrier, OpensOnceEveryShareHasArrived) {
  StartBarrier barrier(3, std::chrono::seconds(60));
  std::vector<std::thread> threads;
  std::atomic<int> opened{0};
  for (int t = 0; t < 3; ++t) threads.emplace_back([&] { opened += barrier.arrive_and_wait(); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(opened.load(), 3);
  EXPECT_GE(barrier.last_arrival_after_first().count(), 0);
}

TEST(StartBarrier, AThreadCarryingEveryShareDoesNotWaitForItself) {
  StartBarrier barrier(4, std::chrono::seconds(60));
  const auto t0 = Clock::now();
  EXPECT_TRUE(barrier.arrive_and_wait(4));
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_EQ(barrier.last_arrival_after_first().count(), 0);
}

TEST(StartBarrier, BreaksAtItsDeadlineWhenAShareNeverComes) {
  StartBarrier barrier(2, milliseconds(20));
  const auto t0 = Clock::now();
  EXPECT_FALSE(barrier.arrive_and_wait());
  const double waited = seconds_since(t0);
  EXPECT_GE(waited, 0.020);
  EXPECT_LT(waited, 10.0);
  EXPECT_EQ(barrier.last_arrival_after_first().count(), 0) << "the second share has not arrived";
  // A share that comes after the barrier broke goes straight through, and is told so.
  const auto t1 = Clock::now();
  EXPECT_FALSE(barrier.arrive_and_wait());
  EXPECT_LT(seconds_since(t1), 10.0);
  EXPECT_GE(std::chrono::duration<double>(barrier.last_arrival_after_first()).count(), 0.020);
}

TEST(TimedTogether, OneThread) {
  const TogetherTiming t = expect_each_share_once_a_timing(1, {});
  EXPECT_TRUE(t.together);
  EXPECT_EQ(t.attempts, 1);
  EXPECT_EQ(t.start_wait, 0);
}

TEST(TimedTogether, MoreThreadsThanTheMachineHas) {
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int threads : {hardware + 1, 4 * hardware, 3 * hardware + 5}) expect_each_share_once_a_timing(threads, {});
}

TEST(TimedTogether, NoWaitAtAllNeverHangs) {
  // A deadline of 0: the barrier breaks unless every thread is already there, so timings are
  // often apart and repeated; whatever happens, each share runs once a timing and the call ends.
  TogetherOptions options;
  options.timeout = milliseconds(0);
  for (int threads : {2, 3, 8}) expect_each_share_once_a_timing(threads, options);
  options.attempts = 1;
  expect_each_share_once_a_timing(5, options);
}

TEST(TimedTogether, FromInsideAWorkItemOfThePool) {
  // The pool is busy with the outer call: the inner ones start threads of their own.
  parallel_for(2, 1, 2, [&](std::int64_t, std::int64_t, int) { expect_each_share_once_a_timing(3, {}); });
}

TEST(TimedTogether, TheTimeSpansFromTheFirstStartToTheLastEnd) {
  // Two shares of 20 and 40 ms: the timing holds the longer one whole.
  const TogetherTiming t = time_together(2, [](int share) { spin_for(share == 0 ? 20000 : 40000); });
  EXPECT_GE(t.seconds, 0.040);
}

}  // namespace
}  // namespace attnscale
