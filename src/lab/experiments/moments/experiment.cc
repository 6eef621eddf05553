// moments: Propositions 1-5 of Chuang (2023) checked by Monte Carlo, each beside a case that drops its
// assumption. Rows carry the proposition's claim (column `claim`), the measurement with its 95% CI,
// and the correct closed form (`theory`, theory.h):
//   P1  Var X = E X² − (E X)²               (identity; X = q_i with mean μ)
//   P2  Cov(X, Y) = E XY − E X E Y           (identity; q_i, k_i with correlation ρ)
//   P3  Var(q_i k_i) = Var q_i Var k_i       needs independence and zero means:
//         mean μ ≠ 0:   (σ² + μ²)² − μ⁴;     correlation ρ: 1 + ρ²(κ − 2) (Gaussian: 1 + ρ²)
//   P4  Var(Σ X_i) = Σ Var X_i               needs uncorrelated terms: with a shared factor
//         (q_i = √(1−c) a_i + √c g, k likewise) Cov(q_i k_i, q_j k_j) = c², so Var = d + d(d−1)c²
//   P5  Var(q·k) = d_k                       μ ≠ 0: d((1+μ²)² − μ⁴), mean dμ²;  ρ: mean ρd, var d(1+ρ²);
//         heavy tails keep Var = d but the kurtosis of q·k is 3 + (κ_q κ_k − 3)/d, not 3.
//         uncorrelated_dependent: k_i = (q_i² − 1)/√2 with q_i ~ N(0, 1). Then E k_i = 0, Var k_i =
//         (E q⁴ − 2 E q² + 1)/2 = 1 and Cov(q_i, k_i) = E[q³ − q]/√2 = 0: every covariance Chuang
//         (2023)'s assumption (iv) lists is 0, yet q_i and k_i are dependent, and
//         Var(q_i k_i) = E[(q³ − q)²]/2 = (E q⁶ − 2 E q⁴ + E q²)/2 = (15 − 6 + 1)/2 = 5, so
//         Var(q·k) = 5d: zero covariance is not enough, Proposition 3 needs independence.
//         q_equals_k: k = q (self-attention's diagonal when Q = K, the Study notes' worked example):
//         q·q = |q|² ~ χ²_d, mean d and variance 2d, not Lemma 1's 0 and d.
#include <algorithm>
#include <cmath>

#include "lab/registry.h"
#include "lab/rng.h"
#include "lab/sweep_memory.h"
#include "lab/theory.h"

namespace attnscale::lab {
namespace {

struct Case {
  std::string prop, name;
  bool per_d;  // swept over --d (else d = 1 only)
};
const std::vector<Case> kCases = {
    {"P1", "holds", false},        {"P2", "holds", false},        {"P3", "holds", false},
    {"P3", "mean_nonzero", false}, {"P3", "correlated", false},   {"P4", "holds", true},
    {"P4", "shared_factor", true}, {"P5", "holds", true},         {"P5", "mean_nonzero", true},
    {"P5", "correlated", true},    {"P5", "heavy_tails", true},   {"P5", "uncorrelated_dependent", true},
    {"P5", "q_equals_k", true}};  // append only: a case's index is part of its stream id

std::vector<Row> run(const Args& a, const std::vector<std::string>& p) {
  const std::string prop = p[0], name = p[1];
  const std::int64_t d = std::stoll(p[2]);
  const Dist dist = Dist::parse(p[3]);
  const double mu = a.doubles("mu")[0], rho = a.doubles("rho")[0], c = a.doubles("c")[0];
  std::size_t case_index = 0;
  while (kCases[case_index].prop != prop || kCases[case_index].name != name) ++case_index;
  Components comp{dist, 0, 1, 0};
  if (name == "mean_nonzero" || prop == "P1") comp.mu = mu;
  if (name == "correlated" || prop == "P2") comp.rho = rho;
  const bool shared = name == "shared_factor";
  const std::uint32_t stream =
      stream_id(k_moments, {static_cast<std::int64_t>(case_index), d, static_cast<int>(dist.kind),
                           std::llround(dist.nu * 1000)});
  // Per trial: q_0, k_0, and q·k over d components.
  const auto cols = per_trial(a.threads, a.trials, 3, [&](std::int64_t t, double* out) {
    const Stream s(a.seed, stream, static_cast<std::uint32_t>(t));
    const double gq = shared ? s.normal(4 * d) : 0, gk = shared ? s.normal(4 * d + 1) : 0;
    double dot = 0;
    for (std::int64_t i = 0; i < d; ++i) {
      double q, k;
      comp.pair(s, i, q, k);
      if (shared) {
        q = std::sqrt(1 - c) * q + std::sqrt(c) * gq;
        k = std::sqrt(1 - c) * k + std::sqrt(c) * gk;
      }
      if (name == "uncorrelated_dependent") k = (q * q - 1) / std::sqrt(2.0);
      if (name == "q_equals_k") k = q;
      if (i == 0) {
        out[0] = q;
        out[1] = k;
      }
      dot += q * k;
    }
    out[2] = dot;
  });
  const std::vector<double>&q0 = cols[0], &k0 = cols[1], &dot = cols[2];
  std::vector<Row> rows;
  auto add = [&](const std::string& metric, const Summary& s, double claim, double theory) {
    rows.push_back(make_row({prop, name, p[2], dist.name(), format_number(claim)}, metric, s, theory));
  };
  const double dd = static_cast<double>(d);
  if (prop == "P1") {
    // Both sides of the identity from the same sample: E X² − (E X)² against the variance.
    std::vector<double> x2(q0.size());
    for (std::size_t i = 0; i < q0.size(); ++i) x2[i] = q0[i] * q0[i];
    const Summary ex2 = mean_ci(x2), ex = mean_ci(q0), v = variance_ci(q0);
    const double rhs = ex2.mean - ex.mean * ex.mean;
    add("var", v, 1, 1);
    add("e_x2_minus_e_x_sq", {rhs, std::max(0.0, rhs - (v.mean - v.ci_low)), rhs + (v.ci_high - v.mean)}, 1, 1);  // a variance: ≥ 0
  } else if (prop == "P2") {
    std::vector<double> qk(q0.size());
    for (std::size_t i = 0; i < q0.size(); ++i) qk[i] = q0[i] * k0[i];
    const double mq = sample_mean(q0.data(), q0.size()), mk = sample_mean(k0.data(), k0.size());
    std::vector<double> centred(q0.size());
    for (std::size_t i = 0; i < q0.size(); ++i) centred[i] = (q0[i] - mq) * (k0[i] - mk);
    const Summary cov = mean_ci(centred), exy = mean_ci(qk);
    const double rhs = exy.mean - mq * mk;
    add("cov", cov, rho, rho);
    add("e_xy_minus_e_x_e_y", {rhs, rhs - (cov.mean - cov.ci_low), rhs + (cov.ci_high - cov.mean)}, rho, rho);
  } else if (prop == "P3") {
    std::vector<double> qk(q0.size());
    for (std::size_t i = 0; i < q0.size(); ++i) qk[i] = q0[i] * k0[i];
    const double th = name == "mean_nonzero" ? theory::var_product(mu, 1)
                      : name == "correlated"  ? 1 + rho * rho * (dist.kurtosis() - 2)
                                              : 1.0;
    add("var_qk", variance_ci(qk), 1, th);
  } else if (prop == "P4") {
    add("var_dot", variance_ci(dot), dd, shared ? dd + dd * (dd - 1) * c * c : dd);
  } else {  // P5
    const double m = name == "mean_nonzero" ? dd * mu * mu
                     : name == "correlated" ? rho * dd
                     : name == "q_equals_k" ? dd
                                            : 0;
    const double v = name == "mean_nonzero"             ? theory::var_dot(d, mu, 1, 0)
                     : name == "correlated"             ? theory::var_dot_general(d, rho, dist.kurtosis())
                     : name == "uncorrelated_dependent" ? 5 * dd
                     : name == "q_equals_k"             ? 2 * dd
                                                        : dd;
    add("mean_dot", mean_ci(dot), 0, m);
    add("var_dot", variance_ci(dot), dd, v);
    if (name == "heavy_tails" || name == "holds")
      add("kurtosis_dot", kurtosis_ci(dot), 3,
          theory::kurtosis_dot(d, dist.kurtosis(), dist.kurtosis()));
  }
  return rows;
}

}  // namespace

Experiment make_moments() {
  Experiment e;
  e.name = "moments";
  e.summary = "Propositions 1-5 of Chuang (2023) by Monte Carlo, each also with its assumption dropped";
  e.flags = {{"d", "1,4,16,64", "head dimensions for P4 and P5, each 1 to 2^20"},
             {"mu", "0.5", "component mean for the mean_nonzero cases (and P1), |mu| <= 1e6"},
             {"rho", "0.5", "correlation of q_i and k_i for the correlated cases (and P2)"},
             {"c", "0.3", "shared-factor correlation between components for P4's failing case"},
             {"dist", "laplace,t10,uniform,rademacher", "component distributions for P5's heavy_tails case"}};
  e.default_trials = 10000;
  e.param_names = {"proposition", "case", "d", "dist", "claim"};
  e.points = [](const Args& a) {
    check_ints_in(a, "d", 1, 1 << 20);
    check_component_moments(a, "mu", "");
    check_one_number(a, "rho", "number in [-1, 1]", [](double v) { return std::abs(v) <= 1; });
    check_one_number(a, "c", "number in [0, 1]", [](double v) { return v >= 0 && v <= 1; });
    const std::vector<std::string> dists = dist_names(a, "dist");
    std::vector<std::vector<std::string>> pts;
    for (const auto& cs : kCases) {
      const std::vector<std::int64_t> ds = cs.per_d ? a.ints("d") : std::vector<std::int64_t>{1};
      for (auto d : ds) {
        if (cs.name == "heavy_tails")
          for (const auto& dn : dists) pts.push_back({cs.prop, cs.name, std::to_string(d), dn});
        else
          pts.push_back({cs.prop, cs.name, std::to_string(d), "normal"});
      }
    }
    // Each point: q_0, k_0 and q·k a trial, and up to 8 derived columns of them (the components are
    // drawn as summed, never held); a few rows.
    check_sweep_memory(a, {"trials", "d", "dist"},
                       trial_sweep_bytes(a, {.points = pts.size(),
                                             .width = 3,
                                             .trial_extra_bytes = 64,
                                             .rows_per_point = 8}));
    return pts;
  };
  e.run_point = run;
  return e;
}

}  // namespace attnscale::lab
