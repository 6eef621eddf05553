// Seed 000 says softmax is applied to each *column* of Q Kᵀ/√d_k; the other seeds (and the
// engine) normalise each *row*, over the keys. This measures what the column-wise reading would
// compute, on seed 001's setting (Q, K, V with N(0, 1) entries), so the report can show the
// difference instead of asserting it.
#pragma once
#include <cstdint>

#include "lab/stats.h"

namespace attnscale::report {

struct ColumnSoftmaxEvidence {
  std::int64_t n = 0, d = 0, trials = 0;
  // Row-wise P (the engine's probs): max |Σ_j P_ij − 1| over rows, and the smallest and largest
  // column sum Σ_i P_ij (per trial, then mean and CI over trials).
  lab::Summary row_sum_error_rowwise, col_sum_min_rowwise, col_sum_max_rowwise;
  // Column-wise P': its columns sum to 1; its rows do not: smallest and largest row sum.
  lab::Summary col_sum_error_colwise, row_sum_min_colwise, row_sum_max_colwise;
  // ‖P'V − PV‖_F / ‖PV‖_F: how far the column-wise output is from attention's.
  lab::Summary output_rel_diff;
  // With a causal mask: change only the last query row; the largest change in the outputs of all
  // earlier rows. Row-wise this is exactly 0 (a query never sees later positions); column-wise a
  // column's normaliser sums over every later query, so the future leaks into the past.
  lab::Summary causal_leak_rowwise, causal_leak_colwise;
};

ColumnSoftmaxEvidence measure_column_softmax(std::uint64_t seed, std::int64_t n, std::int64_t d,
                                             std::int64_t trials, int threads);

}  // namespace attnscale::report
