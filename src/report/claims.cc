// See claims.h. Each claim's verdict comes from a stated rule applied to the measured rows; the
// rules are written into the table (Claim::rule) so a reader can check them.
#include "report/claims.h"

#include <cmath>

#include "report/query.h"

namespace attnscale::report {
namespace {

bool covers(const lab::Row& r, double v) { return r.ci_low <= v && v <= r.ci_high; }

std::string pm(const lab::Summary& s, int digits = 3) {
  return fmt(s.mean, digits) + " [" + fmt(s.ci_low, digits) + ", " + fmt(s.ci_high, digits) + "]";
}

Claim verdict(Claim c, bool ok, const std::string& good = "supported", const std::string& bad = "refuted") {
  c.verdict = ok ? good : bad;
  c.css = ok ? "supported" : "refuted";
  return c;
}

const lab::ResultTable* table(const Measurements& m, const std::string& name) {
  const auto it = m.tables.find(name);
  return it == m.tables.end() ? nullptr : &it->second;
}

// The largest d of a variance run (as text, the parameter value).
std::string largest(const lab::ResultTable& t, const std::string& param) {
  std::string best;
  double v = -1;
  for (const auto& s : values(t, param)) {
    char* end = nullptr;
    const double x = std::strtod(s.c_str(), &end);
    if (*end == '\0' && x > v) v = x, best = s;
  }
  return best;
}

void variance_claims(const lab::ResultTable& t, std::vector<Claim>& out) {
  const Fixed none{{"scaling", "none"}, {"dist", "normal"}};
  const auto rows = select(t, "var", none);
  int covered = 0, total = 0;
  double worst = 0;
  for (const lab::Row* r : rows) {
    if (!r->theory) continue;
    ++total;
    covered += covers(*r, *r->theory);
    worst = std::max(worst, std::abs(r->mean / *r->theory - 1));
  }
  const std::string dmax = largest(t, "d");
  const lab::Row& slope = one(t, "loglog_slope", {{"d", "all"}, {"scaling", "none"}, {"dist", "normal"}});
  const lab::Row& v64 = one(t, "var", {{"d", "64"}, {"scaling", "none"}, {"dist", "normal"}});
  const lab::Row& vmax = one(t, "var", {{"d", dmax}, {"scaling", "none"}, {"dist", "normal"}});
  {
    Claim c;
    c.claim = "Var(q·k) = d_{k} for independent components with mean 0, variance 1";
    c.source = "000 (Prop. 5), 001, 002, 003, 004";
    c.prediction = "Var = d_{k}; log-log slope 1";
    c.measurement = "d=64: " + fmt_ci(v64) + "; d=" + dmax + ": " + fmt_ci(vmax, 4) + "; slope " + fmt_ci(slope, 4) +
                    "; theory inside the CI at " + std::to_string(covered) + "/" + std::to_string(total) + " d";
    c.rule = "supported when the slope's CI contains 1 and the theory lies inside the 95% CI at ≥ 80% of the d values";
    out.push_back(verdict(c, covers(slope, 1.0) && covered >= 0.8 * total));
  }
  {
    Claim c;
    c.claim = "“the standard deviation is equal to d_{k}”";
    c.source = "004";
    c.prediction = "sd(q·k) = 64 at d_{k} = 64";
    const double sd = std::sqrt(v64.mean);
    c.measurement = "sd at d=64: " + fmt(sd) + " [" + fmt(std::sqrt(v64.ci_low)) + ", " + fmt(std::sqrt(v64.ci_high)) +
                    "] = √d_{k}";
    c.rule = "refuted when the CI of sd excludes d_{k} (it is √d_{k}; the seed's next step divides by √d_{k} anyway)";
    out.push_back(verdict(c, std::sqrt(v64.ci_low) <= 64 && 64 <= std::sqrt(v64.ci_high)));
  }
  {
    const Fixed sq{{"scaling", "sqrt"}, {"dist", "normal"}};
    const lab::Row& s = one(t, "loglog_slope", {{"d", "all"}, {"scaling", "sqrt"}, {"dist", "normal"}});
    const lab::Row& smax = one(t, "var", {{"d", dmax}, {"scaling", "sqrt"}, {"dist", "normal"}});
    int cov = 0, tot = 0;
    for (const lab::Row* r : select(t, "var", sq)) ++tot, cov += covers(*r, 1.0);
    Claim c;
    c.claim = "Scaling by 1/√d_{k} makes the softmax inputs' variance 1";
    c.source = "000, 002, 003";
    c.prediction = "Var(q·k/√d_{k}) = 1 for every d_{k}; slope 0";
    c.measurement = "d=" + dmax + ": " + fmt_ci(smax, 4) + "; slope " + fmt_ci(s, 3) + "; 1 inside the CI at " +
                    std::to_string(cov) + "/" + std::to_string(tot) + " d";
    c.rule = "supported when 1 lies inside the CI at ≥ 80% of the d values";
    out.push_back(verdict(c, cov >= 0.8 * tot));
  }
  {
    const lab::Row& cu = one(t, "c_unit_var", {{"d", dmax}, {"scaling", "none"}, {"dist", "normal"}});
    const lab::Row& lin = one(t, "loglog_slope", {{"d", "all"}, {"scaling", "linear"}, {"dist", "normal"}});
    const double dm = std::stod(dmax);
    Claim c;
    c.claim = "The c with Var(c·q·k) = 1 is 1/√d_{k}, not 1/d_{k}";
    c.source = "002";
    c.prediction = "c = " + fmt(1 / std::sqrt(dm), 4) + " at d=" + dmax + "; 1/d gives Var = 1/d (slope −1)";
    c.measurement = "c at d=" + dmax + ": " + fmt_ci(cu, 4) + "; slope with 1/d: " + fmt_ci(lin, 3);
    c.rule = "supported when the CI of c contains 1/√d and the 1/d slope's CI contains −1";
    out.push_back(verdict(c, covers(cu, 1 / std::sqrt(dm)) && covers(lin, -1.0)));
  }
}

void saturation_claims(const lab::ResultTable& t, std::vector<Claim>& out) {
  const lab::Row& s64 = one(t, "top_p_95", {{"n", "50"}, {"d", "64"}, {"scaling", "sqrt"}});
  const lab::Row& s128 = one(t, "top_p_95", {{"n", "50"}, {"d", "128"}, {"scaling", "sqrt"}});
  const lab::Row& u128 = one(t, "top_p_95", {{"n", "50"}, {"d", "128"}, {"scaling", "none"}});
  {
    Claim c;
    c.claim = "Scaled: “we need top 38 token scores out of 50” to reach 0.95";
    c.source = "001";
    c.prediction = "top_p_95 ≈ 38 (N = 50)";
    c.measurement = "d=64: " + fmt_ci(s64) + "; d=128: " + fmt_ci(s128);
    c.rule = "supported when the mean at d=64 is within ±1.5 tokens of 38 (the seed quotes a rounded reading of a chart)";
    out.push_back(verdict(c, std::abs(s64.mean - 38) <= 1.5));
  }
  {
    Claim c;
    c.claim = "Unscaled: top_p_95 “goes to 2 as the dim increases to 128”";
    c.source = "001";
    c.prediction = "top_p_95 ≈ 2 at d = 128 (N = 50)";
    c.measurement = "d=128: " + fmt_ci(u128);
    c.rule = "supported when the mean at d=128 is within ±0.5 of 2";
    out.push_back(verdict(c, std::abs(u128.mean - 2) <= 0.5));
  }
  {
    const lab::Row& mu = one(t, "max_weight", {{"n", "50"}, {"d", "64"}, {"scaling", "none"}});
    const lab::Row& ms = one(t, "max_weight", {{"n", "50"}, {"d", "64"}, {"scaling", "sqrt"}});
    Claim c;
    c.claim = "Heatmaps: unscaled rows have “only one or two” bright squares; scaled rows have no bright colours";
    c.source = "001";
    c.prediction = "unscaled: the largest weight of a row dominates; scaled: spread";
    c.measurement = "largest weight per row at d=64: unscaled " + fmt_ci(mu) + ", scaled " + fmt_ci(ms);
    c.rule = "supported when the unscaled largest weight exceeds 0.5 and the scaled one is below 0.25";
    out.push_back(verdict(c, mu.ci_low > 0.5 && ms.ci_high < 0.25));
  }
}

void column_claim(const ColumnSoftmaxEvidence& e, std::vector<Claim>& out) {
  Claim c;
  c.claim = "Softmax is applied “on each column of the matrix” QK^{T}/√d_{k}";
  c.source = "000 (the others normalise each row, over the keys)";
  c.prediction = "read literally: columns of P sum to 1";
  c.measurement = "N=" + std::to_string(e.n) + ", d=" + std::to_string(e.d) + ": column-wise P has row sums from " +
                  pm(e.row_sum_min_colwise) + " to " + pm(e.row_sum_max_colwise) +
                  "; its output differs from attention's by " + pm(e.output_rel_diff) +
                  " (relative Frobenius); under a causal mask a change to the last query moves earlier outputs by " +
                  pm(e.causal_leak_colwise) + " (row-wise: " + pm(e.causal_leak_rowwise) + ")";
  c.rule = "refuted as a description of attention when the column-wise output differs from the row-wise one by more "
           "than 1% and leaks future queries into earlier outputs while the row-wise one does not";
  const bool differs = e.output_rel_diff.ci_low > 0.01 && e.causal_leak_colwise.ci_low > 0 &&
                       e.causal_leak_rowwise.ci_high == 0;
  out.push_back(verdict(c, !differs, "matches attention", "refuted (wording)"));
}

// How many rows' CIs contain the seed's value (the `claim` column of the moments experiment).
std::pair<int, int> claim_coverage(const lab::ResultTable& t, const std::vector<const lab::Row*>& rows) {
  int in = 0;
  for (const lab::Row* r : rows) {
    const double c = std::stod(param(t, *r, "claim"));
    in += covers(*r, c);
  }
  return {in, static_cast<int>(rows.size())};
}

std::string count(std::pair<int, int> c) { return std::to_string(c.first) + "/" + std::to_string(c.second); }

void moments_claims(const lab::ResultTable& t, std::vector<Claim>& out) {
  // Propositions 1 and 2 are identities: both sides computed from the same sample agree to rounding.
  auto identity = [&](const char* prop, const char* lhs, const char* rhs, const char* text) {
    const lab::Row& a = one(t, lhs, {{"proposition", prop}, {"case", "holds"}});
    const lab::Row& b = one(t, rhs, {{"proposition", prop}, {"case", "holds"}});
    Claim c;
    c.claim = text;
    c.source = std::string("000 (") + (prop[1] == '1' ? "Prop. 1" : "Prop. 2") + ")";
    c.prediction = "both sides equal on any sample";
    c.measurement = std::string(lhs) + " " + fmt_ci(a, 4) + " vs " + rhs + " " + fmt_ci(b, 4) + "; |difference| " +
                    fmt(std::abs(a.mean - b.mean), 2);
    // The lab's left side uses the unbiased (n − 1) divisor, the right side the plug-in one, so the
    // two differ by a factor n/(n − 1): far inside the sampling error.
    const double half = (a.ci_high - a.ci_low) / 2;
    c.rule = "supported when the two sides, computed from the same sample, differ by less than 5% of the CI "
             "half-width (they differ only by the n/(n−1) of the unbiased variance)";
    out.push_back(verdict(c, std::abs(a.mean - b.mean) < 0.05 * half));
  };
  identity("P1", "var", "e_x2_minus_e_x_sq", "Var X = E X² − (E X)²");
  identity("P2", "cov", "e_xy_minus_e_x_e_y", "Cov[X, Y] = E XY − E X E Y");
  auto with_failure = [&](const char* prop, const char* metric, const char* fail_case, const std::string& text,
                          const std::string& source, const std::string& prediction) {
    const auto holds = claim_coverage(t, select(t, metric, {{"proposition", prop}, {"case", "holds"}}));
    const auto fails = claim_coverage(t, select(t, metric, {{"proposition", prop}, {"case", fail_case}}));
    Claim c;
    c.claim = text;
    c.source = source;
    c.prediction = prediction;
    c.measurement = "seed's value inside the 95% CI in " + count(holds) + " settings with the assumptions, " +
                    count(fails) + " with " + fail_case;
    c.rule = "supported when the seed's value lies inside the CI in ≥ 80% of the settings where the assumptions "
             "hold (the failing case shows the assumption is needed)";
    out.push_back(verdict(c, holds.second > 0 && holds.first >= 0.8 * holds.second));
  };
  with_failure("P3", "var_qk", "mean_nonzero", "Var[XY] = Var X · Var Y for independent zero-mean X, Y", "000 (Prop. 3)",
               "Var(q_{i}k_{i}) = 1");
  with_failure("P4", "var_dot", "shared_factor", "Var(Σ X_{i}) = Σ Var X_{i} for independent X_{i}", "000 (Prop. 4)",
               "Var(q·k) = d");
  {
    const auto rows = select(t, "mean_dot", {{"proposition", "P5"}, {"case", "holds"}});
    const auto cov = claim_coverage(t, rows);
    const lab::Row* last = rows.empty() ? nullptr : rows.back();
    Claim c;
    c.claim = "The mean of q·k is 0";
    c.source = "003, 004 (Lemma 1)";
    c.prediction = "E[q·k] = 0";
    c.measurement = (last ? "d=" + param(t, *last, "d") + ": " + fmt_ci(*last) + "; " : std::string()) +
                    "0 inside the CI at " + count(cov) + " d";
    c.rule = "supported when 0 lies inside the CI at ≥ 80% of the d values";
    out.push_back(verdict(c, cov.second > 0 && cov.first >= 0.8 * cov.second));
  }
}

void gradients_claim(const lab::ResultTable& t, std::vector<Claim>& out) {
  const std::string n = values(t, "n").front(), dmax = largest(t, "d");
  const lab::Row& um = one(t, "jacobian_fro_median", {{"n", n}, {"d", dmax}, {"scaling", "none"}});
  const lab::Row& sm = one(t, "jacobian_fro_median", {{"n", n}, {"d", dmax}, {"scaling", "sqrt"}});
  const lab::Row& gu = one(t, "grad_q_fro", {{"n", n}, {"d", dmax}, {"scaling", "none"}});
  const lab::Row& gs = one(t, "grad_q_fro", {{"n", n}, {"d", dmax}, {"scaling", "sqrt"}});
  Claim c;
  c.claim = "Unscaled, large dot products push the softmax “into regions where it has extremely small gradients”";
  c.source = "002, 004 (quoting the Transformer paper)";
  c.prediction = "the softmax Jacobian vanishes for large d_{k} without the scale";
  c.measurement = "median ‖J‖_{F} at d=" + dmax + ": unscaled " + fmt_ci(um) + ", scaled " + fmt_ci(sm) +
                  "; end-to-end ‖∂L/∂Q‖: unscaled " + fmt_ci(gu) + ", scaled " + fmt_ci(gs);
  c.rule = "supported when the unscaled median Jacobian norm at the largest d is below a tenth of the scaled one "
           "(its CIs apart)";
  out.push_back(verdict(c, um.ci_high < 0.1 * sm.ci_low));
}

void layernorm_claim(const lab::ResultTable& t, std::vector<Claim>& out) {
  const std::string dx = largest(t, "dx");
  const auto on = select(t, "var_qk", {{"init", "scaled"}, {"layernorm", "on"}, {"dx", dx}});
  const auto on_s = select(t, "var_qk_scaled", {{"init", "scaled"}, {"layernorm", "on"}, {"dx", dx}});
  if (on.empty() || on_s.empty()) return;
  Claim c;
  c.claim = "The scaling “is not often used nowadays, because normal distribution is not assumed for not using "
            "layer normalization”";
  c.source = "004";
  c.prediction = "a claim about practice, with a reason: the variance argument needs normalised inputs";
  c.measurement = "with LayerNorm and N(0, 1/d_{x}) weights (d_{x}=" + dx + "): Var(q·k) = " + fmt_ci(*on.front()) +
                  " unscaled, " + fmt_ci(*on_s.front()) + " with 1/√d_{k}";
  c.rule = "how often the scale is used cannot be measured here; the data show that LayerNorm is exactly what makes "
           "the assumptions hold, and that the variance is then d_{k} unless the scale divides it out";
  c.verdict = "not testable here";
  c.css = "untestable";
  out.push_back(c);
}

void history_claims(const Measurements& m, std::vector<Claim>& out) {
  if (const auto* t = table(m, "variance")) {
    const lab::Row& slope = one(*t, "loglog_slope", {{"d", "all"}, {"scaling", "none"}, {"dist", "normal"}});
    Claim c;
    c.claim = "The factor was probably found empirically (“seems to be growing at, like, √d_{k}”)";
    c.source = "002 (footnote)";
    c.prediction = "a claim about how the authors worked";
    c.measurement = "what an empirical look would have seen: sd(q·k) grows with slope " + fmt(slope.mean / 2, 3) +
                    " [" + fmt(slope.ci_low / 2, 3) + ", " + fmt(slope.ci_high / 2, 3) + "] in log d";
    c.rule = "history cannot be measured; the data show only that measuring and deriving give the same factor";
    c.verdict = "not testable here";
    c.css = "untestable";
    out.push_back(c);
  }
}

}  // namespace

std::vector<Claim> evaluate_claims(const Measurements& m) {
  std::vector<Claim> out;
  if (const auto* t = table(m, "moments")) moments_claims(*t, out);
  if (const auto* t = table(m, "variance")) variance_claims(*t, out);
  if (const auto* t = table(m, "saturation")) saturation_claims(*t, out);
  if (const auto* t = table(m, "gradients")) gradients_claim(*t, out);
  column_claim(m.columns, out);
  if (const auto* t = table(m, "projections")) layernorm_claim(*t, out);
  history_claims(m, out);
  return out;
}

}  // namespace attnscale::report
