// What the float32 and bf16 backwards share about query rows: per-row statistics computed once
// per backward (lse, D = dO·o, the normaliser factor), and the writes of gradient rows and of the
// sinks' gradient.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <limits>
#include <vector>

#include "attention/kernels.h"
#include "attention/params.h"
#include "attention/score_transforms.h"
#include "attention/tiles.h"
#include "common/bfloat_rows.h"
#include "common/parallel.h"

namespace attnscale::detail {

// What every tile needs from a query row, computed once per backward: lse (+inf for a fully
// masked row, lse = -inf, so that e^(t − lse) = 0 for every score, where subtracting -inf would
// give e^(+inf) or NaN), D_i = dO_i·o_i − dlse_i (dlse: Options::dlse, else 0), and the factor 1/σ_i that makes the row's
// recomputed P sum to 1 (see normalisers()). Row (b, h, i) is at (b·Hq + h)·Nq + i.
template <class T>
struct RowStats {
  std::vector<T> lse, D, mul;
  std::vector<char> finite;  // q_i and dO_i hold only finite values
  std::int64_t at(const Params& p, std::int64_t b, std::int64_t h, std::int64_t i) const {
    return (b * p.Hq + h) * p.Nq + i;
  }
};
// Row (b, h, i) of a [B, H, N, d] view as d doubles (exact for every float dtype): through a row
// pointer when the row is contiguous, else element by element.
inline void row_doubles(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d,
                        double* out) {
  if (t.strides[3] == 1 && t.dtype == DType::f32) {
    const float* row = at<const float>(t, b, h, i, 0);
    for (std::int64_t c = 0; c < d; ++c) out[c] = row[c];
  } else if (t.strides[3] == 1 && t.dtype == DType::bf16) {
    const std::uint16_t* row = at<const std::uint16_t>(t, b, h, i, 0);
    for (std::int64_t c = 0; c < d; ++c) {
      const std::uint32_t u = static_cast<std::uint32_t>(row[c]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      out[c] = f;
    }
  } else {
    for (std::int64_t c = 0; c < d; ++c) out[c] = value<double>(t, b, h, i, c);
  }
}

// Whether each of x[0, n) is finite as a T: NaN, ±inf and (float64 inputs) values that round to
// ±inf as a T are not. A float64 rounds to a finite float iff |x| < 2^128 − 2^103 (halfway from
// FLT_MAX = 2^128 − 2^104 to 2^128, where the tie goes to the even 2^128), i.e. iff |x| is at most
// the double just below that, 0x1.fffffefffffffp+127. One compare a value, which GCC vectorizes,
// where std::isfinite(static_cast<T>(x)) went value by value.
template <class T>
bool all_finite_as(const double* x, std::int64_t n) {
  const double limit = std::is_same_v<T, float> ? 0x1.fffffefffffffp+127 : std::numeric_limits<double>::max();
  bool ok = true;
  for (std::int64_t c = 0; c < n; ++c) ok &= std::fabs(x[c]) <= limit;
  return ok;
}

// Rows whose D = dO·o chains row_stats runs side by side: each row's float64 sum stays one chain
// in column order (the same bits), but one chain's dependent adds (dv of them, 4 cycles each)
// had made the statistics 3-4% of the bf16 backward (N = 4096, d = 128; docs/performance.md).
inline constexpr std::int64_t kStatRows = 8;

// rows_finite: whether to test each row's q and dO (RowStats::finite); a caller that has tested
// every input already passes false, and every row is marked finite.
template <class T>
RowStats<T> row_stats(const BackwardParams& p, int threads, bool rows_finite = true) {
  RowStats<T> st;
  st.lse.resize(p.B * p.Hq * p.Nq);
  st.D.resize(p.B * p.Hq * p.Nq);
  st.mul.assign(p.B * p.Hq * p.Nq, T(1));
  st.finite.assign(p.B * p.Hq * p.Nq, 1);
  // float32 rows of unit stride: D by simd::row_dots8 (the same chains, eight rows side by side
  // in vectors of doubles) and the finiteness by the rows' bits, where the rows' copies into
  // doubles and a scalar chain a row took 15% of a small backward's samples (N = 128, d = 64,
  // H = 8, one thread; docs/performance.md).
  // bfloat16 rows of dO and out (the bf16 backward's; out in the float32 kernels' backward of a
  // bfloat16 call, bf16_as_float.h; q and dO too where that backward reads them as stored) take the
  // same route, widened to float32 rows first (exactly):
  // as doubles a row at a time they took 14.5% of the samples of such a backward (N = 64, d = 64,
  // H = 8, causal; docs/performance.md).
  const auto f32_rows = [](const TensorView& t) { return t.dtype == DType::f32 && t.strides[3] == 1; };
  const auto float_rows = [&](const TensorView& t) { return f32_rows(t) || (t.dtype == DType::bf16 && t.strides[3] == 1); };
  static_assert(kStatRows == 8, "simd::row_dots8 takes eight rows");
  const bool fast =
      std::is_same_v<T, float> && float_rows(p.dO) && float_rows(p.out) && (!rows_finite || float_rows(p.q));
  const bool widen = fast && (p.dO.dtype == DType::bf16 || p.out.dtype == DType::bf16 || p.q.dtype == DType::bf16);
  parallel_for(p.B * p.Hq, 1, threads, [&](std::int64_t t0, std::int64_t t1, int) {
    // fast: a zero row for the rows past a last block, bfloat16 rows widened into `widened`; else
    // the rows as doubles.
    const std::vector<float> zeros(fast ? p.dv : 0, 0.0f);
    std::vector<float> widened(widen ? 2 * kStatRows * p.dv + p.dk : 0);
    // Row i of (b, h) of t (d values) as float32: in place, or widened into `widened` from `slot`.
    const auto row = [&](const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t slot,
                         std::int64_t d) {
      if (t.dtype == DType::f32) return at<const float>(t, b, h, i, 0);
      float* w = widened.data() + slot;
      f32_row(static_cast<const std::uint16_t*>(element(t, b, h, i, 0)), d, w);
      return static_cast<const float*>(w);
    };
    std::vector<double> q(fast ? 0 : p.dk), dO(fast ? 0 : kStatRows * p.dv, 0.0), o(fast ? 0 : kStatRows * p.dv, 0.0);
    for (std::int64_t bh = t0; bh < t1; ++bh) {
      const std::int64_t b = bh / p.Hq, h = bh % p.Hq;
      for (std::int64_t i0 = 0; i0 < p.Nq; i0 += kStatRows) {
        const std::int64_t n = std::min(kStatRows, p.Nq - i0);
        for (std::int64_t r = 0; r < n; ++r) {
          const double lse = value<double>(p.lse, b, h, i0 + r, 0);
          st.lse[bh * p.Nq + i0 + r] = lse == -INFINITY ? std::numeric_limits<T>::infinity() : static_cast<T>(lse);
        }
        // In float64: one chain of dv products per row, whose float32 error would grow with dv
        // (4096 at the edge) and enter every dS of the row. Rows past n (a last block) go unused.
        double d[kStatRows] = {};
        if (fast) {
          const float *a[kStatRows], *c[kStatRows];
          for (std::int64_t r = 0; r < kStatRows; ++r) {
            a[r] = r < n ? row(p.dO, b, h, i0 + r, r * p.dv, p.dv) : zeros.data();
            c[r] = r < n ? row(p.out, b, h, i0 + r, (kStatRows + r) * p.dv, p.dv) : zeros.data();
          }
          if (rows_finite)
            for (std::int64_t r = 0; r < n; ++r)
              st.finite[bh * p.Nq + i0 + r] = all_finite(row(p.q, b, h, i0 + r, 2 * kStatRows * p.dv, p.dk), 0, 1, p.dk) &&
                                              all_finite(a[r], 0, 1, p.dv);
          simd::row_dots8(a, c, static_cast<std::size_t>(p.dv), d);
        } else {
          for (std::int64_t r = 0; r < n; ++r) {
            const std::int64_t i = i0 + r;
            row_doubles(p.dO, b, h, i, p.dv, dO.data() + r * p.dv);
            row_doubles(p.out, b, h, i, p.dv, o.data() + r * p.dv);
            if (rows_finite) {
              row_doubles(p.q, b, h, i, p.dk, q.data());
              st.finite[bh * p.Nq + i] = all_finite_as<T>(q.data(), p.dk) && all_finite_as<T>(dO.data() + r * p.dv, p.dv);
            }
          }
          for (std::int64_t c = 0; c < p.dv; ++c)
            for (std::int64_t r = 0; r < kStatRows; ++r) d[r] += dO[r * p.dv + c] * o[r * p.dv + c];
        }
        // A gradient w.r.t. lse enters here only: dS = P ∘ (dP − (D − dlse)) (Options::dlse).
        if (!p.dLse.empty())
          for (std::int64_t r = 0; r < n; ++r) d[r] -= value<double>(p.dLse, b, h, i0 + r, 0);
        for (std::int64_t r = 0; r < n; ++r) st.D[bh * p.Nq + i0 + r] = static_cast<T>(d[r]);
      }
    }
  });
  return st;
}

template <class T>
void write_rows(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t n,
                std::int64_t d, const T* x) {
  for (std::int64_t r = 0; r < n; ++r) {
    const T* row = x + r * d;
    if (t.strides[3] == 1 && t.dtype == DType::f32) {
      float* out = at<float>(t, b, h, i0 + r, 0);
      for (std::int64_t c = 0; c < d; ++c) out[c] = static_cast<float>(row[c]);
    } else if (t.strides[3] == 1 && t.dtype == DType::bf16 && std::is_same_v<T, float>) {
      // to_bf16's bits by vectors (bf16_row): element by element this loop was 2% of the bf16
      // backward (N = 4096, d = 128; docs/performance.md).
      if constexpr (std::is_same_v<T, float>) bf16_row(row, d, at<std::uint16_t>(t, b, h, i0 + r, 0));
    } else {
      for (std::int64_t c = 0; c < d; ++c) put(t, b, h, i0 + r, c, row[c]);
    }
  }
}

// dsink_h = −Σ_{b,i} P_sink·D_i with P_sink = e^(sink_h − lse_i)/σ_i (σ: normalisers()): the sink
// joins the softmax like a key whose value is zero, so its dP is 0 and dS_sink = P_sink·(0 − D).
template <class T>
void write_sink_grads(const BackwardParams& p, const RowStats<T>& stats) {
  for (std::int64_t h = 0; h < p.Hq; ++h) {
    const double sink = sink_logit(p, h);
    double g = 0;
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        const std::int64_t row = stats.at(p, b, h, i);
        g -= std::exp(sink - static_cast<double>(stats.lse[row])) * static_cast<double>(stats.mul[row]) *
             static_cast<double>(stats.D[row]);
      }
    store(p.dSinks, element1(p.dSinks, h), g);
  }
}

}  // namespace attnscale::detail
