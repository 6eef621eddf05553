// row_metrics_batch (row_metrics_batch.h): Highway compiles the block kernel once per SIMD target
// (foreach_target.h re-includes this file) and dispatches at run time.
//
// A block is L rows (L = float32 lanes) stored column-major, col[j·L + l] = p[row l][j], so that
// every step is one vector operation for all L rows; a compare-exchange (i, j) of the sorting
// network is col_i, col_j <- max(col_i, col_j), min(col_i, col_j). Rows never mix: each lane's
// results depend only on its own row, so any blocking gives the same numbers.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lab/row_metrics_batch.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <cstddef>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace attnscale::lab::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

std::size_t BlockLanes() { return hn::Lanes(hn::ScalableTag<float>()); }

// One block of L rows: element (lane l, key j) at col[j·ld + l]; sorted descending in place.
// Per lane: ent = −Σ p ln p, s2 = Σ p², below = #{j : c_j < 0.95} with c_j the float64 cumulative
// sum of the sorted row (so top_p_95 = min(below + 1, n)).
void BlockMetrics(float* HWY_RESTRICT col, std::size_t ld, std::size_t n, const std::int32_t* pairs,
                  std::size_t npairs, float* HWY_RESTRICT ent, float* HWY_RESTRICT s2, double* HWY_RESTRICT below) {
  const hn::ScalableTag<float> df;
  const std::size_t L = hn::Lanes(df);
  const auto zero = hn::Zero(df), one = hn::Set(df, 1.0f);
  auto h = zero, q = zero;
  for (std::size_t j = 0; j < n; ++j) {
    const auto v = hn::LoadU(df, col + j * ld);
    q = hn::MulAdd(v, v, q);
    // −p ln p, 0 for p = 0 (Log is evaluated on 1 there: no inf or NaN).
    const auto lg = hn::Log(df, hn::IfThenElse(hn::Gt(v, zero), v, one));
    h = hn::NegMulAdd(v, lg, h);
  }
  hn::StoreU(h, df, ent);
  hn::StoreU(q, df, s2);
  for (std::size_t c = 0; c < npairs; ++c) {
    float* a = col + static_cast<std::size_t>(pairs[2 * c]) * ld;
    float* b = col + static_cast<std::size_t>(pairs[2 * c + 1]) * ld;
    const auto x = hn::LoadU(df, a), y = hn::LoadU(df, b);
    hn::StoreU(hn::Max(x, y), df, a);
    hn::StoreU(hn::Min(x, y), df, b);
  }
  // Cumulative sums down the sorted columns in float64: lanes of a float64 vector, L64 at a time.
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dh;
  const std::size_t L64 = hn::Lanes(dd);
  const auto limit = hn::Set(dd, 0.95), one64 = hn::Set(dd, 1.0);
  for (std::size_t part = 0; part < L; part += L64) {
    auto cum = hn::Zero(dd), count = hn::Zero(dd);
    for (std::size_t j = 0; j < n; ++j) {
      cum = hn::Add(cum, hn::PromoteTo(dd, hn::LoadU(dh, col + j * ld + part)));
      count = hn::Add(count, hn::IfThenElseZero(hn::Lt(cum, limit), one64));
    }
    hn::StoreU(count, dd, below + part);
  }
}

}  // namespace attnscale::lab::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>

#include <hwy/aligned_allocator.h>

#include "attnscale/error.h"
#include "lab/attention_rows.h"
#include "lab/row_metrics_batch.h"

namespace attnscale::lab {
HWY_EXPORT(BlockLanes);
HWY_EXPORT(BlockMetrics);

// Batcher's odd-even merge sort for any n (Knuth, TAOCP 5.2.2, Algorithm M, in the iterative form):
// comparators of the power-of-two network that touch an index >= n are dropped, which is exact
// because padding with values below every real one (descending order) never moves.
std::vector<std::pair<std::int32_t, std::int32_t>> sorting_network(std::int64_t n) {
  std::vector<std::pair<std::int32_t, std::int32_t>> pairs;
  for (std::int64_t p = 1; p < n; p += p)
    for (std::int64_t k = p; k >= 1; k /= 2)
      for (std::int64_t j = k % p; j + k < n; j += 2 * k)
        for (std::int64_t i = 0; i < k && i + j + k < n; ++i)
          if ((i + j) / (2 * p) == (i + j + k) / (2 * p))
            pairs.emplace_back(static_cast<std::int32_t>(i + j), static_cast<std::int32_t>(i + j + k));
  return pairs;
}

void row_metrics_columns(float* cols, std::int64_t ld, std::int64_t rows, std::int64_t n, double* out) {
  if (rows <= 0 || n <= 0) return;
  const std::size_t L = HWY_DYNAMIC_DISPATCH(BlockLanes)();
  if (ld % static_cast<std::int64_t>(L) != 0 || ld < rows) throw Error("row_metrics_columns: bad ld");
  // The network of the last n, flattened to (i, j, i, j, ...); one per thread.
  thread_local std::int64_t net_n = -1;
  thread_local std::vector<std::int32_t> pairs;
  if (net_n != n) {
    pairs.clear();
    for (const auto& [i, j] : sorting_network(n)) {
      pairs.push_back(i);
      pairs.push_back(j);
    }
    net_n = n;
  }
  auto ent = hwy::AllocateAligned<float>(L), s2 = hwy::AllocateAligned<float>(L);
  auto below = hwy::AllocateAligned<double>(L);
  for (std::int64_t r0 = 0; r0 < rows; r0 += static_cast<std::int64_t>(L)) {
    HWY_DYNAMIC_DISPATCH(BlockMetrics)(cols + r0, static_cast<std::size_t>(ld), static_cast<std::size_t>(n),
                                       pairs.data(), pairs.size() / 2, ent.get(), s2.get(), below.get());
    const std::int64_t nb = std::min<std::int64_t>(static_cast<std::int64_t>(L), rows - r0);
    for (std::int64_t l = 0; l < nb; ++l) {
      double* o = out + (r0 + l) * kRowMetrics;
      o[0] = std::min(below[l] + 1, static_cast<double>(n));  // seed 001's top_p_95
      o[1] = ent[l];
      o[2] = cols[r0 + l];  // the largest weight, first after sorting
      o[3] = 1 / static_cast<double>(s2[l]);
    }
  }
}

void row_metrics_batch(const float* probs, std::int64_t rows, std::int64_t n, double* out) {
  if (rows <= 0 || n <= 0) return;
  const std::int64_t ld = (rows + 15) / 16 * 16;
  std::vector<float> cols(static_cast<std::size_t>(ld * n), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < n; ++j) cols[j * ld + r] = probs[r * n + j];
  row_metrics_columns(cols.data(), ld, rows, n, out);
}

}  // namespace attnscale::lab
#endif  // HWY_ONCE
