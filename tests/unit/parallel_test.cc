// parallel_for (common/parallel.h): every item once, thread indices below the count asked for,
// errors passed to the caller, calls from inside a work item, and calls whose helpers are parked
// or late (the caller returns once the chunks are done, without waiting for a helper that never
// joined; a helper that comes after must not touch the finished call).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/parallel.h"

namespace attnscale {
namespace {

// Runs parallel_for over n items and checks that each ran exactly once, on a valid thread index.
void expect_each_item_once(std::int64_t n, std::int64_t chunk, int threads) {
  std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n));
  std::atomic<int> bad_index{0};
  parallel_for(n, chunk, threads, [&](std::int64_t b, std::int64_t e, int t) {
    if (t < 0 || t >= threads) bad_index.fetch_add(1);
    for (std::int64_t i = b; i < e; ++i) runs[static_cast<std::size_t>(i)].fetch_add(1);
  });
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(runs[static_cast<std::size_t>(i)].load(), 1) << "item " << i << " of " << n;
  EXPECT_EQ(bad_index.load(), 0);
}

TEST(Parallel, EveryItemOnceForAwkwardSizesAndThreadCounts) {
  for (int threads : {1, 2, 3, 7})
    for (std::int64_t n : {1, 2, 3, 17, 64, 1000})
      for (std::int64_t chunk : {1, 3, 64}) expect_each_item_once(n, chunk, threads);
  parallel_for(0, 1, 4, [](std::int64_t, std::int64_t, int) { FAIL() << "no items, no calls"; });
}

TEST(Parallel, CallsAfterTheHelpersParkedOrWhileTheyAreLate) {
  // Idle gaps of 0 to 2 ms between calls: helpers spinning, parking, or waking after the caller
  // took every chunk (single-chunk-per-thread calls whose items take a few microseconds).
  for (int round = 0; round < 60; ++round) {
    std::this_thread::sleep_for(std::chrono::microseconds((round % 6) * 400));
    expect_each_item_once(2 + round % 5, 1, 2 + round % 3);
  }
  // Back to back, many small calls: a late helper of one call must not run the next one's items
  // twice or skip them.
  for (int round = 0; round < 2000; ++round) expect_each_item_once(1 + round % 4, 1, 3);
}

TEST(Parallel, TheFirstErrorReachesTheCaller) {
  EXPECT_THROW(parallel_for(100, 1, 3,
                            [](std::int64_t b, std::int64_t, int) {
                              if (b == 42) throw std::runtime_error("item 42");
                            }),
               std::runtime_error);
  expect_each_item_once(100, 1, 3);  // the pool still works
}

TEST(Parallel, ACallFromInsideAWorkItemRunsOnThreadsOfItsOwn) {
  std::atomic<std::int64_t> inner{0};
  parallel_for(4, 1, 2, [&](std::int64_t, std::int64_t, int) {
    parallel_for(10, 1, 2, [&](std::int64_t b, std::int64_t e, int) { inner.fetch_add(e - b); });
  });
  EXPECT_EQ(inner.load(), 40);
}

}  // namespace
}  // namespace attnscale
