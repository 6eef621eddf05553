// gradients: does an unscaled softmax have "extremely small gradients" (Vaswani et al.)?
//
// The softmax Jacobian of a row p is J = diag(p) − p pᵀ, so
//   ‖J‖_F² = Σ_i (p_i − p_i²)² + Σ_{i≠j} p_i² p_j² = Σ p² − 2 Σ p³ + (Σ p²)².
// Rows of a saturated softmax (one p_i → 1) have ‖J‖_F → 0; the mean over rows hides that
// collapse when a few rows stay soft, the median shows it. Annealed REM theory (σ < σ_c/2, logits
// σ z with σ² = s² d): Σp² ≈ e^{σ²}/N, Σp³ ≈ e^{3σ²}/N², so ‖J‖_F ≈ √(e^{σ²}/N − 2e^{3σ²}/N² + e^{2σ²}/N²),
// given only where it is accurate (see run: within 5% of the measured mean and median rows,
// LabTheory.GradientTheoryMatchesWhereGiven).
//
// End to end: L = Σ O ⊙ G with G i.i.d. N(0, 1), so dL/dO = G; dL/dQ and dL/dK by
// attnscale::backward (float64), reported as Frobenius norms per trial.
#include <algorithm>
#include <cmath>

#include "attnscale/attention.h"
#include "lab/attention_rows.h"
#include "lab/registry.h"
#include "lab/rng.h"
#include "lab/sweep_memory.h"
#include "lab/theory.h"

namespace attnscale::lab {
namespace {

double jacobian_frobenius(const double* p, std::int64_t n) {
  double s2 = 0, s3 = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    s2 += p[j] * p[j];
    s3 += p[j] * p[j] * p[j];
  }
  return std::sqrt(std::max(0.0, s2 - 2 * s3 + s2 * s2));
}

std::vector<Row> run(const Args& a, const std::vector<std::string>& p) {
  const std::int64_t n = std::stoll(p[0]), d = std::stoll(p[1]);
  const auto names = a.words("scaling");
  const std::size_t ns = names.size();
  // Per trial and scaling: mean ‖J‖_F over rows, median over rows, ‖dQ‖_F, ‖dK‖_F.
  const auto cols = per_trial(a.threads, a.trials, ns * 4, [&](std::int64_t t, double* out) {
    const Stream s(a.seed, stream_id(k_gradients, {n, d}), static_cast<std::uint32_t>(t));
    std::vector<double> q, k, probs, v(n * d), g(n * d), o(n * d), lse(n), dq(n * d), dk(n * d), dv(n * d);
    sample_qk_direct(s, n, d, q, k);
    const std::uint64_t base = 4 * static_cast<std::uint64_t>((n * d + 1) / 2 * 2);
    s.fill_normal(base, n * d, v.data());
    s.fill_normal(base + 2 * static_cast<std::uint64_t>((n * d + 1) / 2 * 2), n * d, g.data());
    for (std::size_t c = 0; c < ns; ++c) {
      const double scale = scaling_factor(names[c], d, n);
      attention_probs(q, k, n, d, scale, probs);
      std::vector<double> fro(n);
      double sum = 0;
      for (std::int64_t i = 0; i < n; ++i) sum += fro[i] = jacobian_frobenius(probs.data() + i * n, n);
      std::sort(fro.begin(), fro.end());
      out[c * 4 + 0] = sum / n;
      out[c * 4 + 1] = n % 2 ? fro[n / 2] : 0.5 * (fro[n / 2 - 1] + fro[n / 2]);
      Options opt;
      opt.scale = Scale::value(scale);
      opt.threads = 1;
      auto view = [](std::vector<double>& x, std::int64_t r, std::int64_t cdim) {
        return TensorView::contiguous(x.data(), DType::f64, {r, cdim});
      };
      Outputs outs{view(o, n, d), TensorView::contiguous(lse.data(), DType::f64, {n})};
      forward(view(q, n, d), view(k, n, d), view(v, n, d), outs, opt);
      backward(view(q, n, d), view(k, n, d), view(v, n, d), view(o, n, d),
               TensorView::contiguous(lse.data(), DType::f64, {n}), view(g, n, d),
               Gradients{view(dq, n, d), view(dk, n, d), view(dv, n, d)}, opt);
      double nq = 0, nk = 0;
      for (std::int64_t i = 0; i < n * d; ++i) {
        nq += dq[i] * dq[i];
        nk += dk[i] * dk[i];
      }
      out[c * 4 + 2] = std::sqrt(nq);
      out[c * 4 + 3] = std::sqrt(nk);
    }
  });
  std::vector<Row> rows;
  for (std::size_t c = 0; c < ns; ++c) {
    const double scale = scaling_factor(names[c], d, n);
    // A row's σ is s|q| with |q|² ~ χ²_d, not s√d: as for rem_row_theory, the hot formula is used
    // only where σ's 99% quantile is at most σ_c/2. And the expansion needs its cubic term at most
    // a third of its leading one, 2e^{3σ²}/N² ≤ e^{σ²}/(3N) (Σp² ≪ 1 is not enough: at N = 8,
    // σ = 1 the sum under the root is negative; at N = 30, where the ratio is 0.49, it is 6% low).
    // Where it holds, ‖J‖_F grows with σ, so the median row is the row of median σ: the mean row
    // gets the formula at σ = s√d, the median row at s √(median of χ²_d). Before, s√d < σ_c/2
    // alone decided: d = 1 (|q| anywhere in [0, 2.6]) had a theory 18% above the median row at
    // N = 50, and N = 8 had 0 against a measured 0.35–0.37.
    const double nn = static_cast<double>(n);
    auto jacobian_norm = [nn](double sigma) {
      const double e1 = std::exp(sigma * sigma);
      return std::sqrt(e1 / nn - 2 * e1 * e1 * e1 / (nn * nn) + e1 * e1 / (nn * nn));
    };
    const double sigma = scale * std::sqrt(static_cast<double>(d)), e2 = std::exp(2 * sigma * sigma);
    std::optional<double> th_mean, th_median;
    if (row_sigma_quantile(d, scale, 0.99) <= theory::rem_sigma_c(n) / 2 && 2 * e2 / nn <= 1.0 / 3) {
      th_mean = jacobian_norm(sigma);
      th_median = jacobian_norm(row_sigma_quantile(d, scale, 0.5));
    }
    const std::vector<std::string> params = {p[0], p[1], names[c]};
    // Norms: ≥ 0 (the medians' order-statistic intervals stay within the sample already).
    rows.push_back(make_row(params, "jacobian_fro_mean", bounded_mean_ci(cols[c * 4 + 0], 0, INFINITY), th_mean));
    rows.push_back(make_row(params, "jacobian_fro_median", median_ci(cols[c * 4 + 1]), th_median));
    rows.push_back(make_row(params, "grad_q_fro", bounded_mean_ci(cols[c * 4 + 2], 0, INFINITY)));
    rows.push_back(make_row(params, "grad_q_fro_median", median_ci(cols[c * 4 + 2])));
    rows.push_back(make_row(params, "grad_k_fro", bounded_mean_ci(cols[c * 4 + 3], 0, INFINITY)));
    rows.push_back(make_row(params, "grad_k_fro_median", median_ci(cols[c * 4 + 3])));
  }
  return rows;
}

}  // namespace

Experiment make_gradients() {
  Experiment e;
  e.name = "gradients";
  e.summary = "softmax Jacobian norm (mean, median) and end-to-end |dL/dQ|, |dL/dK| vs d, scaled vs unscaled";
  e.flags = {{"n", "50", "sequence lengths N, each 2 to 4096"},
             {"d", "1,2,4,8,16,32,64,128,256,512", "head dimensions, each 1 to 8192"},
             {"scaling", "none,sqrt", "scalings: none, sqrt, linear, log-n"}};
  e.default_trials = 50;
  e.param_names = {"n", "d", "scaling"};
  e.points = [](const Args& a) {
    check_ints_in(a, "n", 2, 4096);
    check_ints_in(a, "d", 1, 8192);
    check_scalings(a.words("scaling"), {"none", "sqrt", "linear", "log-n"}, "scaling");
    // Each point: 4 results a scaling and trial; each thread: a trial's nine [N, d] arrays and two
    // [N, N] ones, in float64.
    auto pts = n_d_points(a);
    const std::size_t width = 4 * a.words("scaling").size();
    const double n = largest(a, "n"), d = largest(a, "d");
    check_sweep_memory(a, {"trials", "n", "d", "scaling"},
                       trial_sweep_bytes(a, {.points = pts.size(),
                                             .width = width,
                                             .thread_bytes = 8 * (9 * n * d + 2 * n * n)}));
    return pts;
  };
  e.run_point = run;
  return e;
}

}  // namespace attnscale::lab
