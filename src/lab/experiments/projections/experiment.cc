// projections: Chuang (2023)'s setting. X [N, dx] with i.i.d. entries of mean --x-mean and standard
// deviation --x-std, optionally LayerNorm'd per row; W_q, W_k [dx, d] drawn fresh each trial with
//   normal N(0, 1) · scaled N(0, 1/dx) · xavier N(0, 2/(dx + d)) · he N(0, 2/dx) ·
//   uniform U(−1/√dx, 1/√dx) (variance 1/(3 dx), PyTorch's nn.Linear default);
// Q = X W_q, K = X W_k. Measured against Chuang (2023)'s assumptions:
//   (ii)  unit variance of q entries:   E q² = dx m₂ σ_w²   (m₂ = E x² = μ_x² + σ_x², 1 − 1e-5-ish after LayerNorm)
//   (iii) zero mean of q entries:       E q = 0 (W has zero mean; per trial the mean is that of X's columns through W)
//   (iv)  Cov(q_j, k_j) = 0 and Cov(q_j, q_l) = 0: measured as correlations pooled over tokens and components
//   Var(q_i · k_j) over token pairs i ≠ j: d (dx m₂)² σ_q² σ_k²  (q_j, k_j independent; cross terms vanish
//   because E[W_cj W_cl] = 0 for j ≠ l); the claim is d. And Var(q·k/√d), the claim 1.
#include <algorithm>
#include <cmath>

#include "lab/attention_rows.h"
#include "lab/registry.h"
#include "lab/rng.h"
#include "lab/sweep_memory.h"

namespace attnscale::lab {
namespace {

const std::vector<std::string> kInits = {"normal", "scaled", "xavier", "he", "uniform"};

double init_variance(const std::string& init, std::int64_t dx, std::int64_t d) {
  if (init == "normal") return 1;
  if (init == "scaled") return 1.0 / dx;
  if (init == "xavier") return 2.0 / (dx + d);
  if (init == "he") return 2.0 / dx;
  return 1.0 / (3.0 * dx);  // uniform
}

std::vector<Row> run(const Args& a, const std::vector<std::string>& p) {
  const std::string init = p[0], ln = p[1];
  const std::int64_t n = std::stoll(p[2]), dx = std::stoll(p[3]), d = std::stoll(p[4]);
  const double xm = a.doubles("x-mean")[0], xs = a.doubles("x-std")[0];
  const double sw2 = init_variance(init, dx, d);
  const std::size_t init_index = std::find(kInits.begin(), kInits.end(), init) - kInits.begin();
  // Per trial: mean q, mean q², corr(q_j, k_j), corr(q_j, q_l), Var(q_i·k_j) (i ≠ j).
  const auto cols = per_trial(a.threads, a.trials, 5, [&](std::int64_t t, double* out) {
    // X is shared by every init (same stream), so inits compare on the same inputs.
    const Stream sx(a.seed, stream_id(k_projections, {n, dx, 0}), static_cast<std::uint32_t>(t));
    const Stream sw(a.seed, stream_id(k_projections, {n, dx, d, static_cast<std::int64_t>(init_index) + 1}),
                    static_cast<std::uint32_t>(t));
    std::vector<double> x(n * dx), wq(dx * d), wk(dx * d);
    sx.fill_normal(0, n * dx, x.data());
    for (double& v : x) v = xm + xs * v;
    if (ln == "on") layer_norm_rows(x, n, dx);
    const std::uint64_t off = static_cast<std::uint64_t>(dx * d + 1) / 2 * 2;
    if (init == "uniform") {
      const double lim = 1 / std::sqrt(static_cast<double>(dx));
      for (std::int64_t i = 0; i < dx * d; ++i) {
        wq[i] = lim * (2 * sw.uniform(i) - 1);
        wk[i] = lim * (2 * sw.uniform(off + i) - 1);
      }
    } else {
      sw.fill_normal(0, dx * d, wq.data());
      sw.fill_normal(off, dx * d, wk.data());
      const double sd = std::sqrt(sw2);
      for (std::int64_t i = 0; i < dx * d; ++i) {
        wq[i] *= sd;
        wk[i] *= sd;
      }
    }
    std::vector<double> q(n * d, 0.0), k(n * d, 0.0);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t c = 0; c < dx; ++c) {
        const double xv = x[i * dx + c];
        for (std::int64_t j = 0; j < d; ++j) {
          q[i * d + j] += xv * wq[c * d + j];
          k[i * d + j] += xv * wk[c * d + j];
        }
      }
    double mq = 0, mq2 = 0, mk2 = 0, qk = 0, qq = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < d; ++j) {
        const double v = q[i * d + j];
        mq += v;
        mq2 += v * v;
        mk2 += k[i * d + j] * k[i * d + j];
        qk += v * k[i * d + j];
        if (j + 1 < d) qq += v * q[i * d + j + 1];
      }
    const double cells = static_cast<double>(n * d);
    out[0] = mq / cells;
    out[1] = mq2 / cells;
    out[2] = qk / std::sqrt(mq2 * mk2);
    // At d = 1 there is no pair of components: nothing measured, so NaN rather than a 0 [0, 0] that
    // would read as (iv) met exactly.
    out[3] = d > 1 ? qq / cells * d / (d - 1) / (mq2 / cells) : std::nan("");
    double s2 = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        if (i == j) continue;
        double dot = 0;
        for (std::int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
        s2 += dot * dot;
      }
    out[4] = s2 / (n * (n - 1));
  });
  const double m2 = ln == "on" ? 1.0 : xm * xm + xs * xs;
  const double var_q = dx * m2 * sw2;
  std::vector<Row> rows;
  const std::vector<std::string> params = {init, ln, p[2], p[3], p[4]};
  // Bounds the intervals stay in: a variance ≥ 0, a correlation in [−1, 1].
  rows.push_back(make_row(params, "mean_q", mean_ci(cols[0]), 0.0));
  rows.push_back(make_row(params, "var_q", bounded_mean_ci(cols[1], 0, INFINITY), var_q));
  rows.push_back(make_row(params, "corr_qk", bounded_mean_ci(cols[2], -1, 1), 0.0));
  rows.push_back(make_row(params, "corr_q_components", bounded_mean_ci(cols[3], -1, 1), 0.0));
  rows.push_back(make_row(params, "var_qk", bounded_mean_ci(cols[4], 0, INFINITY), d * var_q * var_q));
  std::vector<double> scaled(cols[4]);
  for (double& v : scaled) v /= d;
  rows.push_back(make_row(params, "var_qk_scaled", bounded_mean_ci(scaled, 0, INFINITY), var_q * var_q));
  return rows;
}

}  // namespace

Experiment make_projections() {
  Experiment e;
  e.name = "projections";
  e.summary = "Chuang (2023)'s setting Q = X W_q, K = X W_k: are q entries zero-mean, unit-variance, independent?";
  e.flags = {{"n", "50", "tokens N, each 2 to 4096"},
             {"dx", "64", "input widths dx, each 1 to 4096"},
             {"d", "64", "head dimensions d, each 1 to 4096"},
             {"init", "normal,scaled,xavier,he,uniform", "initialisations of W_q, W_k"},
             {"layernorm", "off,on", "LayerNorm on the rows of X (off, on)"},
             {"x-mean", "0.5", "mean of X's entries, |x-mean| <= 1e6"},
             {"x-std", "2", "standard deviation of X's entries, 1e-6 to 1e6"}};
  e.default_trials = 100;
  e.param_names = {"init", "layernorm", "n", "dx", "d"};
  e.points = [](const Args& a) {
    check_ints_in(a, "n", 2, 4096);
    check_ints_in(a, "dx", 1, 4096);
    check_ints_in(a, "d", 1, 4096);
    check_scalings(a.words("init"), kInits, "init");
    for (const auto& w : a.words("layernorm"))
      if (w != "on" && w != "off") throw Error("--layernorm: expected off or on, got '" + w + "'");
    check_component_moments(a, "x-mean", "x-std");
    // LayerNorm of a row of one entry is 0 (x minus its own mean): Q = K = 0, not the unit-variance
    // inputs the "on" setting stands for.
    const auto lns = a.words("layernorm");
    if (std::find(lns.begin(), lns.end(), "on") != lns.end())
      for (auto dx : a.ints("dx"))
        if (dx < 2) throw Error("--dx: LayerNorm (--layernorm on) of a row of 1 entry is 0; give dx >= 2");
    std::vector<std::vector<std::string>> pts;
    for (const auto& init : a.words("init"))
      for (const auto& ln : a.words("layernorm"))
        for (auto n : a.ints("n"))
          for (auto dx : a.ints("dx"))
            for (auto d : a.ints("d"))
              pts.push_back({init, ln, std::to_string(n), std::to_string(dx), std::to_string(d)});
    // Each point: 5 results a trial and a copy of one; each thread: a trial's X [N, dx], W_q and W_k
    // [dx, d], Q and K [N, d], in float64; 6 rows a point.
    const double n = largest(a, "n"), dx = largest(a, "dx"), d = largest(a, "d");
    check_sweep_memory(a, {"trials", "n", "dx", "d"},
                       trial_sweep_bytes(a, {.points = pts.size(),
                                             .width = 5,
                                             .trial_extra_bytes = 8,
                                             .thread_bytes = 8 * (n * dx + 2 * dx * d + 2 * n * d),
                                             .rows_per_point = 6}));
    return pts;
  };
  e.run_point = run;
  return e;
}

}  // namespace attnscale::lab
