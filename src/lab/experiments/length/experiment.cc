// length: the saturation metrics as the number of keys N grows at fixed d, for three temperature
// rules on top of 1/√d: fixed (s = 1/√d), sqrt-log (s = √(ln N)/√d) and log (s = ln N/√d).
// With unit-variance q, k the logits have σ² ≈ s² d: 1, ln N and (ln N)². Against the REM's freezing
// point σ_c = √(2 ln N): fixed stays hot (σ/σ_c → 0, attention spreads over ~N e^{−1} keys),
// sqrt-log holds σ/σ_c = 1/√2 (inside the freezing transition: at N = ∞ the entropy would be
// (3/4) ln N, at N ≤ 4096 it is well above), and log freezes once ln N > 2 (N ≥ 8): attention
// concentrates on O(1) keys however long the sequence. Theory (rem_row_theory) only where σ ≤ σ_c/2.
//
// Each trial draws K [N, d] and --queries query rows (rows are i.i.d. given K, so a few rows
// estimate the per-row metrics without the N × N matrix).
#include <algorithm>
#include <cmath>

#include "lab/attention_rows.h"
#include "lab/registry.h"
#include "lab/rng.h"
#include "lab/sweep_memory.h"

namespace attnscale::lab {
namespace {

double rule_scale(const std::string& rule, std::int64_t n, std::int64_t d) {
  const double ln = std::log(static_cast<double>(n)), rd = std::sqrt(static_cast<double>(d));
  if (rule == "fixed") return 1 / rd;
  if (rule == "sqrt-log") return std::sqrt(ln) / rd;
  return ln / rd;  // log
}

std::vector<Row> run(const Args& a, const std::vector<std::string>& p) {
  const std::int64_t n = std::stoll(p[0]), d = std::stoll(p[1]);
  const std::int64_t nq = std::min<std::int64_t>(a.ints("queries")[0], n);
  const auto rules = a.words("rule");
  const std::size_t nr = rules.size();
  const auto cols = per_trial(a.threads, a.trials, nr * kRowMetrics, [&](std::int64_t t, double* out) {
    const Stream s(a.seed, stream_id(k_length, {n, d}), static_cast<std::uint32_t>(t));
    std::vector<double> q(nq * d), k(n * d), probs, scratch, m(kRowMetrics);
    s.fill_normal(0, n * d, k.data());
    s.fill_normal(static_cast<std::uint64_t>(n * d + 1) / 2 * 2, nq * d, q.data());
    for (std::size_t r = 0; r < nr; ++r) {
      attention_probs(q, k, nq, n, d, rule_scale(rules[r], n, d), probs);
      double sum[kRowMetrics] = {0, 0, 0, 0};
      for (std::int64_t i = 0; i < nq; ++i) {
        row_metrics(probs.data() + i * n, n, m.data(), scratch);
        for (int j = 0; j < kRowMetrics; ++j) sum[j] += m[j];
      }
      for (int j = 0; j < kRowMetrics; ++j) out[r * kRowMetrics + j] = sum[j] / nq;
    }
  });
  std::vector<Row> rows;
  for (std::size_t r = 0; r < nr; ++r) {
    double th[kRowMetrics];
    rem_row_theory(n, d, rule_scale(rules[r], n, d), -1, th);
    for (int j = 0; j < kRowMetrics; ++j) {
      std::optional<double> theory;
      if (!std::isnan(th[j])) theory = th[j];
      const Bounds b = row_metric_bounds(j, n);
      rows.push_back(make_row({p[0], p[1], rules[r]}, kRowMetricNames[j], bounded_mean_ci(cols[r * kRowMetrics + j], b.lo, b.hi), theory));
    }
  }
  return rows;
}

}  // namespace

Experiment make_length() {
  Experiment e;
  e.name = "length";
  e.summary = "saturation metrics vs sequence length N at fixed d for temperature rules fixed, sqrt-log, log";
  e.flags = {{"n", "8,16,32,64,128,256,512,1024,2048,4096", "numbers of keys N, each 2 to 2^20"},
             {"d", "64", "head dimensions, each 1 to 65536"},
             {"rule", "fixed,sqrt-log,log", "temperature rules: fixed (1/sqrt d), sqrt-log (x sqrt(ln N)), log (x ln N)"},
             {"queries", "16", "query rows per trial, at least 1 (at most N are used)"}};
  e.default_trials = 50;
  e.param_names = {"n", "d", "rule"};
  e.points = [](const Args& a) {
    check_ints_in(a, "n", 2, 1 << 20);
    check_ints_in(a, "d", 1, 65536);
    check_scalings(a.words("rule"), {"fixed", "sqrt-log", "log"}, "rule");
    const auto q = a.ints("queries");
    if (q.size() != 1 || q[0] < 1) throw Error("--queries: expected one positive integer");
    // Each point: 4 metrics a rule and trial; each thread: a trial's K [N, d], its query rows
    // [min(queries, N), d] and their probabilities, in float64.
    auto pts = n_d_points(a);
    const std::size_t width = kRowMetrics * a.words("rule").size();
    const double n = largest(a, "n"), d = largest(a, "d"), nq = std::min(static_cast<double>(q[0]), n);
    check_sweep_memory(a, {"trials", "n", "d", "rule"},
                       trial_sweep_bytes(a, {.points = pts.size(),
                                             .width = width,
                                             .thread_bytes = 8 * (n * d + nq * d + nq * n + n)}));
    return pts;
  };
  e.run_point = run;
  return e;
}

}  // namespace attnscale::lab
