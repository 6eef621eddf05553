// Where a sweep's points run: on this process's threads (local_points) or spread over the ranks of
// an MPI job (mpi_points.h). run_experiment asks the scheduler installed with set_point_scheduler
// (default: local), so the CLI, the report and Python distribute a sweep without knowing how.
//
// Every scheduler returns every point's rows in point order, on every process, and reports them to
// `progress` in point order on the process that writes results. A point's rows are a pure function
// of (seed, flags, point), so where a point ran never changes a byte of the result.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "lab/experiment.h"
#include "lab/results.h"

namespace attnscale::lab {

// What defines a sweep, by name ("experiment", "--d", "points", ...), each value as given.
using SweepDefinition = std::vector<std::pair<std::string, std::string>>;

// Rows of point i, computed with `threads` threads for its own trials.
using RunPoint = std::function<std::vector<Row>(std::size_t i, int threads)>;

class PointScheduler {
 public:
  virtual ~PointScheduler() = default;
  // Runs every point of [0, n) that `completed` does not hold (its rows are used as given) with up
  // to `threads` threads on this process; returns the rows of all n points.
  virtual std::vector<std::vector<Row>> run(std::size_t n, int threads, const RunPoint& run_point,
                                            const CompletedPoints& completed, const Progress& progress) const = 0;
  // Before anything of a sweep is run or written: every process of a job must run the same sweep
  // (ranks started with other flags or another binary would deal, run and write different points).
  // Throws on every process when any process passed an error ("" for none) or a definition that
  // differs; a single process only throws its own error.
  virtual void agree(const SweepDefinition& sweep, const std::string& error) const;
  // True on the one process that writes result files (rank 0 of an MPI job; always locally).
  virtual bool writes_results() const { return true; }
};

// Points run in parallel on this process's threads.
const PointScheduler& local_points();

// The scheduler run_experiment uses; nullptr restores local_points(). Not thread-safe: set it once
// at start-up (the CLI does, under mpirun).
void set_point_scheduler(const PointScheduler* scheduler);
const PointScheduler& point_scheduler();

}  // namespace attnscale::lab
