// A sweep spread over the ranks of an MPI job (built when CMake finds MPI).
//
// Points are dealt on demand: rank 0 holds the list of points still to run (those its journal does
// not hold) and hands out the next one, in point order, whenever a worker asks; a worker's request
// carries the rows of the point it just finished (exactly: lab/row_codec.h). So a rank that drew
// cheap points simply asks more often, and uneven point costs (a sweep over d, a training grid
// with d_head 256 runs among d_head 16 ones) leave no rank idle while points are left. Each rank
// runs as many workers as local_points() would run points in parallel (one per thread); rank 0
// runs its own workers on its main thread and serves the requests from a thread of its own.
// Rank 0 reports the points in order (journal, progress bar) and finally sends every rank the
// whole table. No rank draws from a stream another uses (the streams are counter-based per point
// and trial), so the table is byte-identical to a single-process run for any K.
#pragma once
#include <mpi.h>

#include "lab/point_scheduler.h"

namespace attnscale::lab {

class MpiPoints final : public PointScheduler {
 public:
  explicit MpiPoints(MPI_Comm comm);  // every rank of comm must call run() for the same sweep
  std::vector<std::vector<Row>> run(std::size_t n, int threads, const RunPoint& run_point,
                                    const CompletedPoints& completed, const Progress& progress) const override;
  // Compares the definitions of all ranks (distributed/same_values.h): an AgreedError on every rank.
  void agree(const SweepDefinition& sweep, const std::string& error) const override;
  bool writes_results() const override { return rank_ == 0; }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace attnscale::lab
