// columns: one reference's definition applies the softmax to each *column* of Q Kᵀ/√d_k; the
// others (and the engine) normalise each *row*, over the keys. This measures what the column-wise
// reading would compute, on the saturation experiment's setting (Q, K, V with N(0, 1) entries), so
// the report can show the difference instead of asserting it.
//
// Row-wise (attention):  P_ij  = exp(s_ij) / Σ_j' exp(s_ij'),  rows of P sum to 1, O = P V.
// Column-wise:           P'_ij = exp(s_ij) / Σ_i' exp(s_i'j), columns sum to 1.
// P' is the transpose of the row-wise softmax of Sᵀ: keys distributing weight over queries.
// The row-wise P comes from the engine (attnscale::forward, float64, probs output); P' is
// computed here with the same max subtraction (per column).
//
// Rows (n, d, normalisation ∈ {row, column}):
//   row_sum_min, row_sum_max, col_sum_min, col_sum_max  smallest and largest sums of P's rows/columns
//   output_rel_diff   ‖P'V − PV‖_F / ‖PV‖_F (column rows only)
//   causal_leak       with a causal mask, change only the last query row: the largest change in the
//                     outputs of all earlier rows. Row-wise exactly 0 (a query never sees later
//                     positions); column-wise a column's normaliser sums over every later query.
#include <cmath>
#include <limits>
#include <vector>

#include "attnscale/attention.h"
#include "lab/registry.h"
#include "lab/rng.h"
#include "lab/sweep_memory.h"

namespace attnscale::lab {
namespace {

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
  const Stream rng(seed, stream_id(k_columns, {n, d}), static_cast<std::uint32_t>(t));
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

constexpr int kWidth = 9;  // the fields of Trial, in order

std::vector<Row> run(const Args& a, const std::vector<std::string>& point) {
  const std::int64_t n = std::stoll(point[0]), d = std::stoll(point[1]);
  const auto cols = per_trial(a.threads, a.trials, kWidth, [&](std::int64_t t, double* out) {
    const Trial r = one_trial(a.seed, n, d, t);
    const double f[kWidth] = {r.row_err, r.col_min, r.col_max, r.col_err, r.row_min,
                              r.row_max, r.rel_diff, r.leak_row, r.leak_col};
    std::copy(f, f + kWidth, out);
  });
  auto row = [&](const char* norm, const char* metric, int field, std::optional<double> theory = std::nullopt) {
    // Every field is ≥ 0 (errors, sums of probabilities, norms, largest changes); a row-wise causal
    // leak of exactly 0 in every trial has no interval (stats.h), and the report says "0 in every trial".
    return make_row({point[0], point[1], norm}, metric, bounded_mean_ci(cols[field], 0, INFINITY), theory);
  };
  return {row("row", "row_sum_error", 0, 0.0),     row("row", "col_sum_min", 1),
          row("row", "col_sum_max", 2),            row("row", "causal_leak", 7, 0.0),
          row("column", "col_sum_error", 3, 0.0),  row("column", "row_sum_min", 4),
          row("column", "row_sum_max", 5),         row("column", "output_rel_diff", 6),
          row("column", "causal_leak", 8)};
}

}  // namespace

Experiment make_columns() {
  Experiment e;
  e.name = "columns";
  e.summary = "softmax over each column instead of each row: what it computes, and the causal leak";
  e.flags = {{"n", "50", "sequence lengths (N queries, N keys), each 2 to 4096"},
             {"d", "64", "head dimensions, each 1 to 4096"}};
  e.default_trials = 200;
  e.param_names = {"n", "d", "normalisation"};
  e.points = [](const Args& a) {
    check_ints_in(a, "n", 2, 4096);
    check_ints_in(a, "d", 1, 4096);
    // Each point: its 9 results a trial; each thread: a trial's Q, K, V and four outputs [N, d] and
    // three [N, N] arrays, in float64.
    auto pts = n_d_points(a);
    const double n = largest(a, "n"), d = largest(a, "d");
    check_sweep_memory(a, {"trials", "n", "d"},
                       trial_sweep_bytes(a, {.points = pts.size(),
                                             .width = kWidth,
                                             .thread_bytes = 8 * (7 * n * d + 3 * n * n)}));
    return pts;
  };
  e.run_point = run;
  return e;
}

}  // namespace attnscale::lab
