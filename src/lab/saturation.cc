// saturation: seed 001's experiment. Q, K [N, d] with i.i.d. N(0, 1) entries; P = softmax(Q Kᵀ s)
// row by row (attnscale::forward, float64); per row top_p_95, entropy, max_weight, participation,
// averaged over the N rows of a trial; mean and 95% CI over trials.
//
// Scalings (s): none 1; sqrt 1/√d; linear 1/d; qk-norm: LayerNorm on q and k rows, then 1/√d;
// log-n: √(ln N)/√d. All scalings of one (N, d, trial) see the same Q and K, as in seed 001.
// Theory: the Random Energy Model (theory.h, attention_rows.h), averaged over |q|².
#include <cmath>

#include "lab/attention_rows.h"
#include "lab/registry.h"
#include "lab/rng.h"

namespace attnscale::lab {
namespace {

const std::vector<std::string> kScalings = {"none", "sqrt", "linear", "qk-norm", "log-n"};

// Rows for one (n, d) and the given scalings: every scaling on the same Q, K per trial.
// `stream_experiment` separates saturation's and length's random numbers.
std::vector<Row> run_rows(const Args& a, std::uint32_t stream_experiment, std::int64_t n, std::int64_t d,
                          const std::vector<std::string>& scalings, const std::vector<double>& scales,
                          const std::vector<std::string>& prefix_params) {
  const bool wishart = a.get("sampler") == "wishart" && d >= n;
  bool need_direct = !wishart;
  for (const auto& r : scalings) need_direct |= r == "qk-norm";
  const std::size_t ns = scalings.size();
  const auto cols = per_trial(a.threads, a.trials, ns * kRowMetrics, [&](std::int64_t t, double* out) {
    const Stream s(a.seed, stream_id(stream_experiment, {n, d}), static_cast<std::uint32_t>(t));
    std::vector<double> q, k, qn, kn, zq, ak, probs, scratch;
    if (need_direct) sample_qk_direct(s, n, d, q, k);
    if (wishart) sample_qk_wishart(Stream(a.seed, stream_id(stream_experiment, {n, d, 1}), static_cast<std::uint32_t>(t)), n, d, zq, ak);
    for (std::size_t c = 0; c < ns; ++c) {
      if (scalings[c] == "qk-norm") {
        if (qn.empty()) {
          qn = q;
          kn = k;
          layer_norm_rows(qn, n, d);
          layer_norm_rows(kn, n, d);
        }
        attention_probs(qn, kn, n, d, scales[c], probs);
      } else if (wishart) {
        attention_probs(zq, ak, n, n, scales[c], probs);
      } else {
        attention_probs(q, k, n, d, scales[c], probs);
      }
      double sum[kRowMetrics] = {0, 0, 0, 0}, m[kRowMetrics];
      for (std::int64_t i = 0; i < n; ++i) {
        row_metrics(probs.data() + i * n, n, m, scratch);
        for (int j = 0; j < kRowMetrics; ++j) sum[j] += m[j];
      }
      for (int j = 0; j < kRowMetrics; ++j) out[c * kRowMetrics + j] = sum[j] / n;
    }
  });
  std::vector<Row> rows;
  for (std::size_t c = 0; c < ns; ++c) {
    double th[kRowMetrics];
    // qk-norm: |q̂|² = d, q̂·k̂/√d has variance d/(d−1) (cosine of two random directions in the
    // (d−1)-dimensional space orthogonal to 1); d = 1 gives all-zero logits (σ = 0).
    const double fixed = scalings[c] == "qk-norm" ? (d > 1 ? std::sqrt(d / (d - 1.0)) : 0.0) : -1.0;
    rem_row_theory(n, d, scales[c], fixed, th);
    for (int j = 0; j < kRowMetrics; ++j) {
      auto params = prefix_params;
      params.push_back(scalings[c]);
      std::optional<double> theory;
      if (!std::isnan(th[j])) theory = th[j];
      rows.push_back(make_row(std::move(params), kRowMetricNames[j], mean_ci(cols[c * kRowMetrics + j]), theory));
    }
  }
  return rows;
}

void check_common(const Args& a) {
  for (auto n : a.ints("n"))
    if (n < 2 || n > 8192) throw Error("--n: each value must be in [2, 8192], got " + std::to_string(n));
  const auto& s = a.get("sampler");
  if (s != "direct" && s != "wishart") throw Error("--sampler: expected direct or wishart, got '" + s + "'");
}

}  // namespace

// Shared with length.cc.
std::vector<Row> attention_rows_point(const Args& a, std::uint32_t stream_experiment, std::int64_t n,
                                      std::int64_t d, const std::vector<std::string>& names,
                                      const std::vector<double>& scales, const std::vector<std::string>& prefix) {
  return run_rows(a, stream_experiment, n, d, names, scales, prefix);
}

Experiment make_saturation() {
  Experiment e;
  e.name = "saturation";
  e.summary = "seed 001: top_p_95, entropy, max weight, participation of softmax rows vs d and scaling";
  e.flags = {{"n", "50", "sequence lengths N (keys = queries = N)"},
             {"d", "1,2,4,8,16,32,64,128,256,512", "head dimensions"},
             {"scaling", "none,sqrt,linear,qk-norm,log-n", "scalings: none, sqrt, linear, qk-norm, log-n"},
             {"sampler", "direct", "direct (Q, K [N,d] as seed 001) or wishart (exact law of Q K^T for d >= N, O(N^3))"}};
  e.default_trials = 100;
  e.param_names = {"n", "d", "scaling"};
  e.points = [](const Args& a) {
    check_common(a);
    for (auto d : a.ints("d"))
      if (d < 1 || d > (1 << 20)) throw Error("--d: each value must be in [1, 2^20], got " + std::to_string(d));
    check_scalings(a.words("scaling"), kScalings, "scaling");
    std::vector<std::vector<std::string>> pts;
    for (auto n : a.ints("n"))
      for (auto d : a.ints("d")) pts.push_back({std::to_string(n), std::to_string(d)});
    return pts;
  };
  e.run_point = [](const Args& a, const std::vector<std::string>& p) {
    const std::int64_t n = std::stoll(p[0]), d = std::stoll(p[1]);
    const auto names = a.words("scaling");
    std::vector<double> scales;
    for (const auto& r : names) scales.push_back(scaling_factor(r, d, n));
    return run_rows(a, kSaturation, n, d, names, scales, {p[0], p[1]});
  };
  return e;
}

}  // namespace attnscale::lab
