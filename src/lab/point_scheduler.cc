#include "lab/point_scheduler.h"

#include <algorithm>
#include <mutex>
#include <string>

#include "attnscale/error.h"
#include "common/parallel.h"

namespace attnscale::lab {
namespace {

class LocalPoints final : public PointScheduler {
 public:
  std::vector<std::vector<Row>> run(std::size_t n, int threads, const RunPoint& run_point,
                                    const CompletedPoints& completed, const Progress& progress) const override {
    // Points run in parallel; a point gets the threads left over (for its own trial chunks) when
    // there are fewer points than threads.
    const int outer = std::max(1, static_cast<int>(std::min<std::size_t>(threads, std::max<std::size_t>(n, 1))));
    const int inner = std::max(1, threads / outer);
    std::vector<std::vector<Row>> results(n);
    std::vector<char> done(n, 0);
    std::size_t next = 0;  // points [0, next) have been reported, in order
    std::mutex mutex;
    for (const auto& [i, rows] : completed)
      if (i >= n) throw Error("resumed rows name point " + std::to_string(i) + " of a sweep of " + std::to_string(n));
    parallel_for(static_cast<std::int64_t>(n), 1, outer, [&](std::int64_t b, std::int64_t end, int) {
      for (std::int64_t i = b; i < end; ++i) {
        const auto previous = completed.find(static_cast<std::size_t>(i));
        // The last point starts when no point is left for the other threads, which go idle as they
        // finish theirs: it gets all the threads for its trial chunks (trials are counter-based, so
        // the rows do not depend on the thread count).
        auto rows = previous != completed.end()
                        ? previous->second
                        : run_point(static_cast<std::size_t>(i), static_cast<std::size_t>(i) + 1 == n ? threads : inner);
        std::lock_guard<std::mutex> lock(mutex);
        results[i] = std::move(rows);
        done[i] = 1;
        while (next < n && done[next]) {
          if (progress) progress(next + 1, n, results[next]);
          ++next;
        }
      }
    });
    return results;
  }
};

const PointScheduler* installed = nullptr;

}  // namespace

void PointScheduler::agree(const SweepDefinition&, const std::string& error) const {
  if (!error.empty()) throw Error(error);
}

const PointScheduler& local_points() {
  static const LocalPoints local;
  return local;
}

void set_point_scheduler(const PointScheduler* scheduler) { installed = scheduler; }

const PointScheduler& point_scheduler() { return installed != nullptr ? *installed : local_points(); }

}  // namespace attnscale::lab
