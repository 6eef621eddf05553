// A sweep spread over the ranks of an MPI job (built when CMake finds MPI).
//
// The points still to run (those the journal does not hold on rank 0) are dealt round-robin:
// the j-th of them runs on rank j mod K, with that rank's threads as local_points() would use
// them. Each finished point's rows go to rank 0 at once (exactly: lab/row_codec.h), which reports
// them in point order (journal, progress bar) and finally sends every rank the whole table. No
// rank draws from a stream another uses (the streams are counter-based per point and trial), so
// the table is byte-identical to a single-process run for any K.
#pragma once
#include <mpi.h>

#include "lab/point_scheduler.h"

namespace attnscale::lab {

class MpiPoints final : public PointScheduler {
 public:
  explicit MpiPoints(MPI_Comm comm);  // every rank of comm must call run() for the same sweep
  std::vector<std::vector<Row>> run(std::size_t n, int threads, const RunPoint& run_point,
                                    const CompletedPoints& completed, const Progress& progress) const override;
  bool writes_results() const override { return rank_ == 0; }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace attnscale::lab
