// See column_softmax.h.
//
// Row-wise (attention):  P_ij  = exp(s_ij) / Σ_j' exp(s_ij'),  rows of P sum to 1, O = P V.
// Column-wise (seed 000's wording): P'_ij = exp(s_ij) / Σ_i' exp(s_i'j), columns sum to 1.
// P' is the transpose of the row-wise softmax of Sᵀ: keys distributing weight over queries.
// The row-wise P comes from the engine (attnscale::forward, float64, probs output); P' is
// computed here with the same max subtraction (per column).
#include "report/column_softmax.h"

#include <cmath>
#include <limits>
#include <vector>

#include "attnscale/attention.h"
#include "common/parallel.h"
#include "lab/rng.h"

namespace attnscale::report {
namespace {

constexpr std::uint32_t kStream = 0xC0150000u;  // this measurement's own random streams

struct Trial {
  double row_err, col_min, col_max, col_err, row_min, row_max, rel_diff, leak_row, leak_col;
};

// P' (column-wise softmax of s, optionally causal: entry (i, j) exists when j <= i), then P'V.
void column_softmax_output(const std::vector<double>& s, const std::vector<double>& v, std::int64_t n,
                           std::int64_t dv, bool causal, std::vector<double>& p, std::vector<double>& o) {
  p.assign(n * n, 0.0);
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int64_t i0 = causal ? j : 0;  // rows that can see key j
    double m = -INFINITY, l = 0;
    for (std::int64_t i = i0; i < n; ++i) m = std::max(m, s[i * n + j]);
    for (std::int64_t i = i0; i < n; ++i) l += std::exp(s[i * n + j] - m);
    for (std::int64_t i = i0; i < n; ++i) p[i * n + j] = std::exp(s[i * n + j] - m) / l;
  }
  o.assign(n * dv, 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t c = 0; c < dv; ++c) o[i * dv + c] += p[i * n + j] * v[j * dv + c];
}

void scores(const std::vector<double>& q, const std::vector<double>& k, std::int64_t n, std::int64_t d,
            std::vector<double>& s) {
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  s.assign(n * n, 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double dot = 0;
      for (std::int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
      s[i * n + j] = dot * scale;
    }
}

void engine_forward(std::vector<double>& q, std::vector<double>& k, std::vector<double>& v, std::int64_t n,
                    std::int64_t d, bool causal, std::vector<double>& p, std::vector<double>& o) {
  p.assign(n * n, 0.0);
  o.assign(n * d, 0.0);
  Options opt;
  opt.mask.causal = causal;
  opt.threads = 1;
  Outputs out{TensorView::contiguous(o.data(), DType::f64, {n, d}), TensorView(),
              TensorView::contiguous(p.data(), DType::f64, {n, n})};
  forward(TensorView::contiguous(q.data(), DType::f64, {n, d}), TensorView::contiguous(k.data(), DType::f64, {n, d}),
          TensorView::contiguous(v.data(), DType::f64, {n, d}), out, opt);
}

double max_abs_diff_before_last(const std::vector<double>& a, const std::vector<double>& b, std::int64_t n,
                                std::int64_t d) {
  double m = 0;
  for (std::int64_t i = 0; i + 1 < n; ++i)
    for (std::int64_t c = 0; c < d; ++c) m = std::max(m, std::abs(a[i * d + c] - b[i * d + c]));
  return m;
}

Trial one_trial(std::uint64_t seed, std::int64_t n, std::int64_t d, std::int64_t t) {
  const lab::Stream rng(seed, kStream, static_cast<std::uint32_t>(t));
  std::vector<double> q(n * d), k(n * d), v(n * d);
  for (std::int64_t i = 0; i < n * d; ++i) {
    q[i] = rng.normal(i);
    k[i] = rng.normal(n * d + i);
    v[i] = rng.normal(2 * n * d + i);
  }
  Trial r{};
  std::vector<double> p, o, s, pc, oc;
  engine_forward(q, k, v, n, d, false, p, o);
  scores(q, k, n, d, s);
  column_softmax_output(s, v, n, d, false, pc, oc);
  r.col_min = r.row_min = INFINITY;
  r.col_max = r.row_max = -INFINITY;
  for (std::int64_t i = 0; i < n; ++i) {
    double row = 0, col = 0, rowc = 0, colc = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      row += p[i * n + j];
      col += p[j * n + i];
      rowc += pc[i * n + j];
      colc += pc[j * n + i];
    }
    r.row_err = std::max(r.row_err, std::abs(row - 1));
    r.col_min = std::min(r.col_min, col);
    r.col_max = std::max(r.col_max, col);
    r.col_err = std::max(r.col_err, std::abs(colc - 1));
    r.row_min = std::min(r.row_min, rowc);
    r.row_max = std::max(r.row_max, rowc);
  }
  double num = 0, den = 0;
  for (std::size_t i = 0; i < o.size(); ++i) {
    num += (oc[i] - o[i]) * (oc[i] - o[i]);
    den += o[i] * o[i];
  }
  r.rel_diff = std::sqrt(num / den);

  // Causality: outputs before and after replacing the last query with fresh numbers.
  std::vector<double> o0, o1, oc0, oc1;
  engine_forward(q, k, v, n, d, true, p, o0);
  scores(q, k, n, d, s);
  column_softmax_output(s, v, n, d, true, pc, oc0);
  for (std::int64_t c = 0; c < d; ++c) q[(n - 1) * d + c] = rng.normal(3 * n * d + c);
  engine_forward(q, k, v, n, d, true, p, o1);
  scores(q, k, n, d, s);
  column_softmax_output(s, v, n, d, true, pc, oc1);
  r.leak_row = max_abs_diff_before_last(o0, o1, n, d);
  r.leak_col = max_abs_diff_before_last(oc0, oc1, n, d);
  return r;
}

}  // namespace

ColumnSoftmaxEvidence measure_column_softmax(std::uint64_t seed, std::int64_t n, std::int64_t d,
                                             std::int64_t trials, int threads) {
  std::vector<Trial> all(static_cast<std::size_t>(trials));
  parallel_for(trials, 1, resolve_threads(threads, trials), [&](std::int64_t a, std::int64_t b, int) {
    for (std::int64_t t = a; t < b; ++t) all[t] = one_trial(seed, n, d, t);
  });
  auto col = [&](double Trial::*field) {
    std::vector<double> x;
    for (const Trial& t : all) x.push_back(t.*field);
    return lab::mean_ci(x);
  };
  ColumnSoftmaxEvidence e;
  e.n = n;
  e.d = d;
  e.trials = trials;
  e.row_sum_error_rowwise = col(&Trial::row_err);
  e.col_sum_min_rowwise = col(&Trial::col_min);
  e.col_sum_max_rowwise = col(&Trial::col_max);
  e.col_sum_error_colwise = col(&Trial::col_err);
  e.row_sum_min_colwise = col(&Trial::row_min);
  e.row_sum_max_colwise = col(&Trial::row_max);
  e.output_rel_diff = col(&Trial::rel_diff);
  e.causal_leak_rowwise = col(&Trial::leak_row);
  e.causal_leak_colwise = col(&Trial::leak_col);
  return e;
}

}  // namespace attnscale::report
