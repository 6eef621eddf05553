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

// Batcher's network for 16 elements (63 compare-exchanges), for the sorts done in registers.
struct Net16 {
  std::uint8_t i[63], j[63];
};
constexpr Net16 MakeNet16() {
  Net16 net{};
  int c = 0;
  for (int p = 1; p < 16; p += p)
    for (int k = p; k >= 1; k /= 2)
      for (int j = k % p; j + k < 16; j += 2 * k)
        for (int i = 0; i < k && i + j + k < 16; ++i)
          if ((i + j) / (2 * p) == (i + j + k) / (2 * p)) {
            net.i[c] = static_cast<std::uint8_t>(i + j);
            net.j[c] = static_cast<std::uint8_t>(i + j + k);
            ++c;
          }
  return net;
}
constexpr Net16 kNet16 = MakeNet16();

// One block of NV·L rows (NV = 1..4 vectors): element (row l, key j) at col[j·ld + l]; sorted
// descending in place. Per row: ent = −Σ p ln p, s2 = Σ p², below = #{j : c_j < 0.95} with c_j the
// float64 cumulative sum of the sorted row (so top_p_95 = min(below + 1, n)). The NV vectors (and
// the 2·NV float64 halves of the cumulative sums) advance together: independent dependency chains
// for the core, one loop overhead per step.
template <std::size_t NV>
void BlockMetricsN(float* HWY_RESTRICT col, std::size_t ld, std::size_t n, std::size_t full16, const std::int32_t* pairs,
                   std::size_t npairs, float* HWY_RESTRICT ent, float* HWY_RESTRICT s2, double* HWY_RESTRICT below) {
  const hn::ScalableTag<float> df;
  using VF = hn::Vec<decltype(df)>;
  const std::size_t L = hn::Lanes(df);
  const auto zero = hn::Zero(df), one = hn::Set(df, 1.0f);
  VF h[NV], q[NV];
  for (std::size_t u = 0; u < NV; ++u) h[u] = q[u] = zero;
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t u = 0; u < NV; ++u) {
      const auto v = hn::LoadU(df, col + j * ld + u * L);
      q[u] = hn::MulAdd(v, v, q[u]);
      // −p ln p, 0 for p = 0 (Log is evaluated on 1 there: no inf or NaN).
      const auto lg = hn::Log(df, hn::IfThenElse(hn::Gt(v, zero), v, one));
      h[u] = hn::NegMulAdd(v, lg, h[u]);
    }
  }
  for (std::size_t u = 0; u < NV; ++u) {
    hn::StoreU(h[u], df, ent + u * L);
    hn::StoreU(q[u], df, s2 + u * L);
  }
  // Batcher's first four stages (p = 1, 2, 4, 8) sort each aligned group of 16 keys on its own:
  // for the full groups that runs in 16 registers per vector; the rest of the network (the
  // partial group's first stages, then the merges p >= 16) comes in `pairs`, as element offsets
  // (i·ld, j·ld).
  for (std::size_t g = 0; g < full16; ++g)
    for (std::size_t u = 0; u < NV; ++u) {
      float* base = col + 16 * g * ld + u * L;
      VF v[16];
      for (std::size_t e = 0; e < 16; ++e) v[e] = hn::LoadU(df, base + e * ld);
#pragma GCC unroll 63
      for (int c = 0; c < 63; ++c) {
        const VF x = v[kNet16.i[c]], y = v[kNet16.j[c]];
        v[kNet16.i[c]] = hn::Max(x, y);
        v[kNet16.j[c]] = hn::Min(x, y);
      }
      for (std::size_t e = 0; e < 16; ++e) hn::StoreU(v[e], df, base + e * ld);
    }
  for (std::size_t c = 0; c < npairs; ++c) {
    float* a = col + pairs[2 * c];
    float* b = col + pairs[2 * c + 1];
    VF x[NV], y[NV];
    for (std::size_t u = 0; u < NV; ++u) {
      x[u] = hn::LoadU(df, a + u * L);
      y[u] = hn::LoadU(df, b + u * L);
    }
    for (std::size_t u = 0; u < NV; ++u) {
      hn::StoreU(hn::Max(x[u], y[u]), df, a + u * L);
      hn::StoreU(hn::Min(x[u], y[u]), df, b + u * L);
    }
  }
  // Cumulative sums down the sorted columns in float64, P = NV·L / L64 halves at once.
  const hn::ScalableTag<double> dd;
  using VD = hn::Vec<decltype(dd)>;
  const hn::Rebind<float, decltype(dd)> dh;
  const std::size_t L64 = hn::Lanes(dd);
  constexpr std::size_t kMaxParts = 4 * 2 * NV;  // L / L64 is 2 on SIMD targets, 1 on scalar
  const std::size_t parts = NV * L / L64;
  const auto limit = hn::Set(dd, 0.95), one64 = hn::Set(dd, 1.0);
  VD cum[kMaxParts], count[kMaxParts];
  for (std::size_t k = 0; k < parts; ++k) cum[k] = count[k] = hn::Zero(dd);
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t k = 0; k < parts; ++k) {
      cum[k] = hn::Add(cum[k], hn::PromoteTo(dd, hn::LoadU(dh, col + j * ld + k * L64)));
      count[k] = hn::Add(count[k], hn::IfThenElseZero(hn::Lt(cum[k], limit), one64));
    }
  }
  for (std::size_t k = 0; k < parts; ++k) hn::StoreU(count[k], dd, below + k * L64);
}

void BlockMetrics(float* HWY_RESTRICT col, std::size_t ld, std::size_t n, std::size_t full16, std::size_t nv,
                  const std::int32_t* pairs,
                  std::size_t npairs, float* HWY_RESTRICT ent, float* HWY_RESTRICT s2, double* HWY_RESTRICT below) {
  switch (nv) {
    case 4: return BlockMetricsN<4>(col, ld, n, full16, pairs, npairs, ent, s2, below);
    case 3: return BlockMetricsN<3>(col, ld, n, full16, pairs, npairs, ent, s2, below);
    case 2: return BlockMetricsN<2>(col, ld, n, full16, pairs, npairs, ent, s2, below);
    default: return BlockMetricsN<1>(col, ld, n, full16, pairs, npairs, ent, s2, below);
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
namespace {
// The network with each comparator's stage p (the size of the sorted runs it merges).
struct Comparator {
  std::int32_t i, j;
  std::int64_t p;
};
std::vector<Comparator> network_stages(std::int64_t n) {
  std::vector<Comparator> out;
  for (std::int64_t p = 1; p < n; p += p)
    for (std::int64_t k = p; k >= 1; k /= 2)
      for (std::int64_t j = k % p; j + k < n; j += 2 * k)
        for (std::int64_t i = 0; i < k && i + j + k < n; ++i)
          if ((i + j) / (2 * p) == (i + j + k) / (2 * p))
            out.push_back({static_cast<std::int32_t>(i + j), static_cast<std::int32_t>(i + j + k), p});
  return out;
}
}  // namespace

std::vector<std::pair<std::int32_t, std::int32_t>> sorting_network(std::int64_t n) {
  std::vector<std::pair<std::int32_t, std::int32_t>> pairs;
  for (const auto& c : network_stages(n)) pairs.emplace_back(c.i, c.j);
  return pairs;
}

void row_metrics_columns(float* cols, std::int64_t ld, std::int64_t rows, std::int64_t n, double* out) {
  if (rows <= 0 || n <= 0) return;
  const std::size_t L = HWY_DYNAMIC_DISPATCH(BlockLanes)();
  if (ld % static_cast<std::int64_t>(L) != 0 || ld < rows) throw Error("row_metrics_columns: bad ld");
  // The network of the last (n, ld) as element offsets (i·ld, j·ld, ...); one per thread.
  thread_local std::int64_t net_n = -1, net_ld = -1;
  thread_local std::vector<std::int32_t> pairs;
  if (net_n != n || net_ld != ld) {
    if (n * ld > INT32_MAX) throw Error("row_metrics_columns: block too large");
    // Stages p <= 8 of the full groups of 16 run in registers (BlockMetrics); here: those of the
    // partial last group, then every merge stage p >= 16, in network order.
    pairs.clear();
    const auto net = network_stages(n);
    const std::int64_t first_partial = n / 16 * 16;
    for (int pass = 0; pass < 2; ++pass)
      for (const auto& c : net) {
        const bool head = c.p <= 8;
        if (pass == 0 ? !(head && c.i >= first_partial) : head) continue;
        pairs.push_back(static_cast<std::int32_t>(c.i * ld));
        pairs.push_back(static_cast<std::int32_t>(c.j * ld));
      }
    net_n = n;
    net_ld = ld;
  }
  auto ent = hwy::AllocateAligned<float>(4 * L), s2 = hwy::AllocateAligned<float>(4 * L);
  auto below = hwy::AllocateAligned<double>(4 * L);
  const std::int64_t lanes = static_cast<std::int64_t>(L);
  for (std::int64_t r0 = 0; r0 < rows;) {
    const std::int64_t nv = std::min<std::int64_t>({4, (ld - r0) / lanes, (rows - r0 + lanes - 1) / lanes});
    HWY_DYNAMIC_DISPATCH(BlockMetrics)(cols + r0, static_cast<std::size_t>(ld), static_cast<std::size_t>(n),
                                       static_cast<std::size_t>(n / 16), static_cast<std::size_t>(nv), pairs.data(), pairs.size() / 2, ent.get(),
                                       s2.get(), below.get());
    const std::int64_t nb = std::min(nv * lanes, rows - r0);
    for (std::int64_t l = 0; l < nb; ++l) {
      double* o = out + (r0 + l) * kRowMetrics;
      o[0] = std::min(below[l] + 1, static_cast<double>(n));  // the Simulation note's top_p_95
      o[1] = ent[l];
      o[2] = cols[r0 + l];  // the largest weight, first after sorting
      o[3] = 1 / static_cast<double>(s2[l]);
    }
    r0 += nv * lanes;
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
