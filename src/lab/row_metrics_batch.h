// The saturation metrics of many probability rows at once (float32 rows, as the float32 engine
// writes them): the same definitions as row_metrics (attention_rows.h), computed with one row per
// SIMD lane.
//
//   top_p_95      the Simulation note's definition, unchanged: the row sorted descending (a Batcher odd-even
//                 merge sorting network run on the lanes of a column-major block of rows: each
//                 compare-exchange is one Max and one Min for all the rows of the block), then the
//                 cumulative sum in that order, in float64: the count of sums below 0.95, plus one,
//                 at most n (= the first count whose sum reaches 0.95, as the sums never decrease)
//   max_weight    the first element of the sorted row
//   entropy       −Σ p ln p (float32 Log, float32 sums: error ~1e-6 nats)
//   participation 1 / Σ p² (float32 sums)
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace attnscale::lab {

// Column-major rows, sorted in place: element (row r, key j) at cols[j·ld + r], r < rows <= ld, ld a
// multiple of 16. out: rows x kRowMetrics, as below. This is the layout the engine writes for a
// transposed probs view, so the metrics need no copy.
void row_metrics_columns(float* cols, std::int64_t ld, std::int64_t rows, std::int64_t n, double* out);

// probs: rows x n, row-major. out: rows x kRowMetrics (top_p_95, entropy, max_weight,
// participation), row-major, float64.
void row_metrics_batch(const float* probs, std::int64_t rows, std::int64_t n, double* out);

// The compare-exchange pairs (i, j), i < j, of Batcher's odd-even merge sort on n elements (any n;
// the pairs that would touch indices >= n of the next power of two are left out). After applying
// them in order with (max, min) -> (i, j), the elements are sorted descending.
std::vector<std::pair<std::int32_t, std::int32_t>> sorting_network(std::int64_t n);

}  // namespace attnscale::lab
