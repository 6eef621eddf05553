// The report's pieces on tables built here: queries, the units' verdicts computed from the numbers,
// templates and their slots, the claims catalogue, the gnuplot pipeline and the Markdown → HTML page.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>

#include "attnscale/error.h"
#include "report/claims.h"
#include "report/page.h"
#include "report/plot.h"
#include "report/query.h"
#include "report/templates.h"
#include "report/unit.h"

namespace attnscale::report {
namespace {

// A variance table shaped like the lab's: var for d × scaling, slopes, c_unit_var. `bias`
// multiplies the unscaled measurements (1: exactly the theory).
lab::ResultTable variance_table(double bias) {
  lab::ResultTable t;
  t.meta.experiment = "variance";
  t.meta.trials = 1000;
  t.param_names = {"d", "scaling", "dist"};
  for (int d : {256, 1, 64, 16, 4}) {  // out of order on purpose
    for (const char* s : {"none", "sqrt", "linear"}) {
      const double f = std::string(s) == "none" ? 1.0 : std::string(s) == "sqrt" ? 1.0 / d : 1.0 / (double(d) * d);
      const double th = d * f, m = (std::string(s) == "none" ? bias : 1.0) * th;
      t.rows.push_back({{std::to_string(d), s, "normal"}, "var", m, m * 0.95, m * 1.05, th});
    }
    const double c = 1 / std::sqrt(bias * d);
    t.rows.push_back({{std::to_string(d), "none", "normal"}, "c_unit_var", c, c * 0.98, c * 1.02, 1 / std::sqrt(d)});
  }
  t.rows.push_back({{"all", "none", "normal"}, "loglog_slope", bias == 1 ? 1.0 : 1.3, 0.99, bias == 1 ? 1.01 : 1.31, 1.0});
  t.rows.push_back({{"all", "sqrt", "normal"}, "loglog_slope", 0.0, -0.01, 0.01, 0.0});
  t.rows.push_back({{"all", "linear", "normal"}, "loglog_slope", -1.0, -1.01, -0.99, -1.0});
  return t;
}

TEST(ReportQuery, SeriesIsSortedAndSkipsNonNumericX) {
  const auto t = variance_table(1);
  const Series s = series(t, "d", "var", {{"scaling", "none"}, {"dist", "normal"}}, "unscaled");
  ASSERT_EQ(s.x.size(), 5u);
  EXPECT_EQ(s.x.front(), 1);
  EXPECT_EQ(s.x.back(), 256);
  EXPECT_DOUBLE_EQ(s.theory.back(), 256);
  EXPECT_EQ(one(t, "loglog_slope", {{"d", "all"}, {"scaling", "sqrt"}}).mean, 0.0);
  EXPECT_THROW(one(t, "var", {{"d", "3"}}), Error);
  EXPECT_THROW(select(t, "var", {{"nope", "1"}}), Error);
  EXPECT_EQ(values(t, "scaling"), (std::vector<std::string>{"none", "sqrt", "linear"}));
}

const Unit& unit(const std::string& name) {
  for (const Unit& u : units())
    if (u.name == name) return u;
  throw Error("no unit " + name);
}

Verdict verdict(const std::vector<Evidence>& evidence, const std::string& id) {
  for (const auto& e : evidence)
    if (e.claim == id) return e.verdict;
  ADD_FAILURE() << "no evidence on " << id;
  return Verdict::mixed;
}

// A columns table: the column-wise output differs from attention's by `diff`, leaks `leak`.
lab::ResultTable columns_table(double diff, double leak) {
  lab::ResultTable t;
  t.meta.experiment = "columns";
  t.param_names = {"n", "d", "normalisation"};
  auto add = [&](const char* norm, const char* metric, double v) {
    t.rows.push_back({{"50", "64", norm}, metric, v, v * 0.9, v * 1.1, std::nullopt});
  };
  add("row", "row_sum_error", 0);
  add("row", "col_sum_min", 0.3);
  add("row", "col_sum_max", 2.5);
  add("row", "causal_leak", 0);
  add("column", "col_sum_error", 0);
  add("column", "row_sum_min", 0.4);
  add("column", "row_sum_max", 2.2);
  add("column", "output_rel_diff", diff);
  add("column", "causal_leak", leak);
  return t;
}

// Numbers for readers: one minus sign (U+2212) for a number and for its exponent, never "-0".
TEST(ReportQuery, NumbersUseOneMinusSignAndNoNegativeZero) {
  EXPECT_EQ(fmt(8.9e-8, 2), "8.9×10^{−8}");
  EXPECT_EQ(fmt(-6.55e-16, 3), "−6.55×10^{−16}");
  EXPECT_EQ(fmt(1.03e3, 3), "1.03×10^{3}");
  EXPECT_EQ(fmt(-0.0, 3), "0");
  EXPECT_EQ(fmt(-1.0, 3), "−1");
  EXPECT_EQ(fmt(std::nan(""), 3), "n/a");
  EXPECT_EQ(fmt_ci(lab::Summary{-0.0, -0.5, 0.5}, 3), "0 [−0.5, 0.5]");
}

TEST(ReportClaims, VerdictsFollowTheNumbers) {
  auto claims = unit("variance").claims(variance_table(1));
  EXPECT_EQ(verdict(claims, "var-dot"), Verdict::supported);
  EXPECT_EQ(verdict(claims, "sd-dk"), Verdict::refuted);
  EXPECT_EQ(verdict(unit("columns").claims(columns_table(0.5, 0.1)), "columns"), Verdict::refuted);

  // The same claims on data that disagree with the theory flip their verdicts.
  claims = unit("variance").claims(variance_table(1.3));
  EXPECT_EQ(verdict(claims, "var-dot"), Verdict::refuted);
  EXPECT_EQ(verdict(unit("columns").claims(columns_table(0, 0)), "columns"), Verdict::supported);

  // And so do the words of the section.
  const std::string& section = template_text("lab/experiments/variance/section.md");
  Slots s = unit("variance").slots(variance_table(1));
  s["section"] = s["trials"] = "1";
  for (const char* other : {"section.saturation", "section.moments", "section.projections"}) s[other] = "3.x";
  const std::string good = render_template(section, s, "variance");
  Slots bad = unit("variance").slots(variance_table(1.3));
  for (const auto& [k, v] : s) bad.emplace(k, v);
  const std::string worse = render_template(section, bad, "variance");
  EXPECT_NE(good.find("Proposition 5 holds"), std::string::npos) << good;
  EXPECT_NE(worse.find("does not hold"), std::string::npos) << worse;
}

// "1/√d holds the variance at 1" only where the scaled-unit claim's rule finds it: 1 inside the
// interval at ≥ 80% of the head sizes. It was written whatever the count beside it said.
TEST(ReportSections, VarianceUnitWordsFollowTheScaledCoverage) {
  const std::string& section = template_text("lab/experiments/variance/section.md");
  auto render = [&](const lab::ResultTable& t) {
    Slots s = unit("variance").slots(t);
    s["section"] = s["trials"] = "1";
    for (const char* other : {"section.saturation", "section.moments", "section.projections"}) s[other] = "3.x";
    std::string text;  // one line, single spaces: the template wraps its sentences
    for (const char c : render_template(section, s, "variance")) {
      const bool space = std::isspace(static_cast<unsigned char>(c));
      if (!space) text += c;
      else if (!text.empty() && text.back() != ' ') text += ' ';
    }
    return text;
  };
  const std::string good = render(variance_table(1));
  EXPECT_NE(good.find("1/√d_{k} holds the variance at 1 (inside the interval at 5 of 5 head sizes)"),
            std::string::npos)
      << good;
  lab::ResultTable off = variance_table(1);
  for (auto& r : off.rows)
    if (r.metric == "var" && r.params[1] == "sqrt" && r.params[0] != "1") {
      r.mean *= 1.5;
      r.ci_low *= 1.5;
      r.ci_high *= 1.5;
    }
  const std::string bad = render(off);
  EXPECT_EQ(bad.find("holds the variance at 1"), std::string::npos) << bad;
  EXPECT_NE(bad.find("does not hold the variance at 1 within the intervals (inside the interval at 1 of 5 head sizes)"),
            std::string::npos)
      << bad;
  EXPECT_EQ(verdict(unit("variance").claims(off), "scaled-unit"), Verdict::refuted);
}

// A moments table for Propositions 1–4. P3 (asserted Var(q_i k_i) = 1) under its assumptions
// measures `p3_holds`; its dropped cases measure 1.5 (mean_nonzero) and `p3_correlated` (closed
// form 1.25); P4 has its shared-factor case at the given d (closed form d + d(d − 1)·0.09).
lab::ResultTable moments_table(double p3_holds, double p3_correlated, const std::vector<int>& shared_ds) {
  lab::ResultTable t;
  t.meta.experiment = "moments";
  t.param_names = {"proposition", "case", "d", "dist", "claim"};
  auto add = [&](const char* prop, const char* c, int d, const char* metric, double claim, double m, double th) {
    t.rows.push_back({{prop, c, std::to_string(d), "normal", fmt(claim, 10)}, metric, m, m - 0.1, m + 0.1, th});
  };
  add("P1", "holds", 1, "var", 1, 1, 1);
  add("P1", "holds", 1, "e_x2_minus_e_x_sq", 1, 1, 1);
  add("P2", "holds", 1, "cov", 0.5, 0.5, 0.5);
  add("P2", "holds", 1, "e_xy_minus_e_x_e_y", 0.5, 0.5, 0.5);
  add("P3", "holds", 1, "var_qk", 1, p3_holds, 1);
  add("P3", "mean_nonzero", 1, "var_qk", 1, 1.5, 1.5);
  add("P3", "correlated", 1, "var_qk", 1, p3_correlated, 1.25);
  for (int d : {1, 64}) add("P4", "holds", d, "var_dot", d, d, d);
  for (int d : shared_ds) add("P4", "shared_factor", d, "var_dot", d, d + d * (d - 1) * 0.09, d + d * (d - 1) * 0.09);
  return t;
}

TEST(ReportClaims, PropositionsNeedTheirDroppedCasesToldApartAndAreRefutedOnlyByTheirOwn) {
  auto claims = unit("moments").claims(moments_table(1.0, 1.25, {1, 64}));
  EXPECT_EQ(verdict(claims, "p3"), Verdict::supported);
  EXPECT_EQ(verdict(claims, "p4"), Verdict::supported);
  // The correlated case (independence dropped) not told apart from 1: no longer supported, but
  // not refuted either; the evidence names both dropped cases.
  claims = unit("moments").claims(moments_table(1.0, 1.05, {1, 64}));
  EXPECT_EQ(verdict(claims, "p3"), Verdict::mixed);
  for (const auto& e : claims) {
    if (e.claim == "p3") {
      EXPECT_NE(e.measurement.find("1/1 with correlated"), std::string::npos) << e.measurement;
    }
  }
  // No shared-factor setting where its closed form differs (d = 1 only): nothing against P4.
  EXPECT_EQ(verdict(unit("moments").claims(moments_table(1.0, 1.25, {1})), "p4"), Verdict::mixed);
  // Failing far outside its interval under its own assumptions refutes it.
  EXPECT_EQ(verdict(unit("moments").claims(moments_table(1.5, 1.25, {1, 64})), "p3"), Verdict::refuted);
  // A single near miss is what a 95% interval gives one time in 20: no refutation, no support.
  EXPECT_EQ(verdict(unit("moments").claims(moments_table(1.15, 1.5, {1, 64})), "p3"), Verdict::mixed);
}

// A value that holds in every setting, judged by its intervals: at 95% a true value misses one of
// four intervals in 19% of samples, so "refuted below 80% inside" refuted the mean-zero claim (E q·k = 0)
// at 9 of 20 seeds of `attnscale experiment moments` (4 d). Chance-sized misses are mixed now.
TEST(ReportClaims, CoverageVerdictRefutesOnlyMissesChanceDoesNotGive) {
  EXPECT_EQ(misses_chance_allows(1), 1);
  EXPECT_EQ(misses_chance_allows(3), 1);
  EXPECT_EQ(misses_chance_allows(4), 2);
  EXPECT_EQ(misses_chance_allows(9), 2);
  EXPECT_EQ(misses_chance_allows(10), 3);
  std::vector<lab::Row> rows;
  auto settings = [&](int near, int far, int n) {
    rows.clear();
    for (int i = 0; i < n; ++i) {
      const double m = i < near ? 0.15 : i < near + far ? 0.4 : 0.0;
      rows.push_back({{std::to_string(i)}, "mean_dot", m, m - 0.1, m + 0.1, 0.0});
    }
    std::vector<std::pair<const lab::Row*, double>> out;
    for (const auto& r : rows) out.push_back({&r, 0.0});
    return coverage_verdict(out);
  };
  EXPECT_EQ(settings(0, 0, 4), Verdict::supported);
  EXPECT_EQ(settings(1, 0, 4), Verdict::mixed);
  EXPECT_EQ(settings(2, 0, 4), Verdict::mixed);
  EXPECT_EQ(settings(3, 0, 4), Verdict::refuted);
  EXPECT_EQ(settings(0, 1, 4), Verdict::refuted);
  EXPECT_EQ(settings(1, 0, 5), Verdict::supported);
}

// A setting without an interval (NaN ends: every trial the same, or too few) is no evidence either
// way: neither a miss that refutes nor a hit that supports.
TEST(ReportClaims, CoverageVerdictLeavesOutRowsWithoutAnInterval) {
  const double nan = std::nan("");
  const std::vector<lab::Row> rows = {{{"0"}, "var_dot", 1.0, 0.9, 1.1, 1.0},
                                      {{"1"}, "var_dot", 1.0, 0.9, 1.1, 1.0},
                                      {{"2"}, "var_dot", 0.0, nan, nan, 1.0},
                                      {{"3"}, "var_dot", 5.0, nan, nan, 1.0}};
  std::vector<std::pair<const lab::Row*, double>> all, none;
  for (const auto& r : rows) all.push_back({&r, 1.0});
  EXPECT_EQ(coverage_verdict(all), Verdict::supported);  // 2 of 2 with an interval
  EXPECT_TRUE(misses_are_chance(all));
  for (std::size_t i = 2; i < rows.size(); ++i) none.push_back({&rows[i], 1.0});
  EXPECT_EQ(coverage_verdict(none), Verdict::mixed);
}

// An interval prints what it is: "(no interval)" for NaN ends, and never two equal ends when it
// has some width (more digits until they differ).
TEST(ReportQuery, IntervalsNeverReadAsExact) {
  EXPECT_EQ(fmt_ci(lab::Summary{0.367, std::nan(""), std::nan("")}, 2), "0.37 (no interval)");
  EXPECT_EQ(fmt_ci(lab::Summary{0.1179, 0.1172, 0.1186}, 2), "0.118 [0.117, 0.119]");
  EXPECT_EQ(fmt_ci(lab::Summary{0.37, 0.33, 0.41}, 2), "0.37 [0.33, 0.41]");
}

// Proposition 4 at five d with `near` intervals that miss d just (by half their half-width) and `far`
// that miss it by three half-widths. Seed 0 of the default report had 2 near misses of 5, which the
// rule "refuted when inside at < 80% of the settings" called a refutation of a theorem; chance gives
// 2 or more of 5 misses with probability 2.3%.
TEST(ReportClaims, PropositionFourIsRefutedOnlyByMoreOrFurtherMissesThanChanceGives) {
  auto table = [](int near, int far) {
    lab::ResultTable t = moments_table(1.0, 1.25, {1, 64});
    std::erase_if(t.rows, [](const lab::Row& r) { return r.params[0] == "P4" && r.params[1] == "holds"; });
    int i = 0;
    for (int d : {1, 4, 16, 64, 256}) {
      const double m = i < near ? d + 0.15 : i < near + far ? d + 0.4 : d;
      t.rows.push_back({{"P4", "holds", std::to_string(d), "normal", fmt(d, 10)}, "var_dot", m, m - 0.1, m + 0.1,
                        double(d)});
      ++i;
    }
    return unit("moments").claims(t);
  };
  EXPECT_EQ(verdict(table(0, 0), "p4"), Verdict::supported);
  EXPECT_EQ(verdict(table(1, 0), "p4"), Verdict::supported);  // 4 of 5 inside: ≥ 80%
  EXPECT_EQ(verdict(table(2, 0), "p4"), Verdict::mixed);
  EXPECT_EQ(verdict(table(3, 0), "p4"), Verdict::refuted);
  EXPECT_EQ(verdict(table(0, 1), "p4"), Verdict::refuted);
}

// A gradients table (N = 50, d = 1, 64, 512): the scaled rows' Jacobian median is `scaled_d1` at
// d = 1 and 0.2 elsewhere; the unscaled one is `none_dmax` at d = 512 and 0.2 elsewhere. The
// end-to-end gradient is `grad_none` unscaled and 30 scaled (CIs ±10%).
lab::ResultTable gradients_table(double scaled_d1, double none_dmax, double grad_none = 500) {
  lab::ResultTable t;
  t.meta.experiment = "gradients";
  t.param_names = {"n", "d", "scaling"};
  for (int d : {1, 64, 512})
    for (const char* sc : {"none", "sqrt"}) {
      const bool none = std::string(sc) == "none";
      const double jac = none ? (d == 512 ? none_dmax : 0.2) : (d == 1 ? scaled_d1 : 0.2);
      const double grad = none ? grad_none : 30;
      for (const char* m : {"jacobian_fro_median", "jacobian_fro_mean"})
        t.rows.push_back({{"50", std::to_string(d), sc}, m, jac, jac * 0.9, jac * 1.1, std::nullopt});
      for (const char* m : {"grad_q_fro_median", "grad_q_fro"})
        t.rows.push_back({{"50", std::to_string(d), sc}, m, grad, grad * 0.9, grad * 1.1, std::nullopt});
    }
  return t;
}

// A unit's section.md rendered from table t, as the report numbers and sizes it.
std::string section_text(const std::string& name, const std::string& number, const std::string& trials,
                         const lab::ResultTable& t) {
  Slots s = unit(name).slots(t);
  s["section"] = number;
  s["trials"] = trials;
  return render_template(template_text("lab/experiments/" + name + "/section.md"), s, name);
}

TEST(ReportSections, GradientsWordsFollowTheNumbers) {
  auto text = [](const lab::ResultTable& t) { return section_text("gradients", "3.4", "10", t); };
  const std::string usual = text(gradients_table(0.19, 0.003));
  EXPECT_NE(usual.find("stays between 0.19 and 0.2 at every"), std::string::npos) << usual;
  EXPECT_NE(usual.find("collapses"), std::string::npos) << usual;
  EXPECT_NE(usual.find("smaller by a factor of 67"), std::string::npos) << usual;
  // An unscaled median above the scaled one is not "smaller by a factor of 0.4", and a scaled
  // median that moves fourfold across d does not "stay near" its last value.
  const std::string odd = text(gradients_table(0.05, 0.5));
  EXPECT_EQ(odd.find("smaller by a factor"), std::string::npos) << odd;
  EXPECT_EQ(odd.find("falls only"), std::string::npos) << odd;
  EXPECT_NE(odd.find("not smaller than the scaled one but 2.5 times it"), std::string::npos) << odd;
  EXPECT_NE(odd.find("ranges from 0.05 to 0.2 across"), std::string::npos) << odd;
}

// "End to end the picture differs" only where the end-to-end gradient does not follow the
// Jacobian: smaller unscaled where the Jacobian is not, or not smaller where it is.
TEST(ReportSections, GradientsEndToEndPictureFollowsTheNumbers) {
  auto text = [](double none_dmax, double grad_none) {
    return section_text("gradients", "3.4", "10", gradients_table(0.19, none_dmax, grad_none));
  };
  const std::string differs = "End to end the picture differs:", same = "End to end the picture is the same:";
  // The Jacobian collapses unscaled (0.003 against 0.2).
  EXPECT_NE(text(0.003, 500).find(differs), std::string::npos);  // the gradient is larger unscaled
  EXPECT_NE(text(0.003, 31).find(differs), std::string::npos);   // not told apart from the scaled 30
  EXPECT_NE(text(0.003, 3).find(same), std::string::npos);       // smaller too
  EXPECT_NE(text(0.003, 24).find(same), std::string::npos);      // 24 [21.6, 26.4] below 30 [27, 33]
  EXPECT_EQ(text(0.003, 3).find("*larger* without the scale"), std::string::npos);
  // The Jacobian is not smaller unscaled (0.5 against 0.2).
  EXPECT_NE(text(0.5, 3).find(differs), std::string::npos);
  EXPECT_NE(text(0.5, 500).find(same), std::string::npos);
}

// A saturation table (N = 50): top_p_95 at d = 1, 64, 128, scaled and unscaled (CIs ±`half`);
// the unscaled count is `none_d1` at d = 1 and `none_d128` at d = 128.
lab::ResultTable saturation_table(double none_d1, double none_d128, double half) {
  lab::ResultTable t;
  t.meta.experiment = "saturation";
  t.param_names = {"n", "d", "scaling"};
  for (int d : {1, 64, 128})
    for (const char* sc : {"none", "sqrt"}) {
      const double v = std::string(sc) == "sqrt" ? 37.8 : d == 1 ? none_d1 : d == 128 ? none_d128 : 3;
      t.rows.push_back({{"50", std::to_string(d), sc}, "top_p_95", v, v - half, v + half, std::nullopt});
    }
  return t;
}

TEST(ReportSections, SaturationUnscaledCountFollowsTheNumbers) {
  auto text = [](double none_d1, double none_d128, double half) {
    return section_text("saturation", "3.3", "200", saturation_table(none_d1, none_d128, half));
  };
  const std::string falls = text(14.5, 1.81, 0.05);
  EXPECT_NE(falls.find("Unscaled, it falls from 14.5 [14.4, 14.6] at d_{k} = 1 to\n1.81 [1.76, 1.86] at d_{k} = 128"),
            std::string::npos)
      << falls;
  const std::string rises = text(1.81, 14.5, 0.05);
  EXPECT_NE(rises.find("Unscaled, it rises from\n1.81 [1.76, 1.86] at d_{k} = 1 to\n14.5"), std::string::npos) << rises;
  EXPECT_EQ(rises.find("falls"), std::string::npos) << rises;
  // Intervals that overlap (2.0 ± 0.3 and 1.8 ± 0.3): no direction is claimed.
  const std::string level = text(2.0, 1.8, 0.3);
  EXPECT_NE(level.find("Unscaled, it is 2 [1.7, 2.3] at d_{k} = 1 and\n1.8 [1.5, 2.1] at d_{k} = 128, the same within their"
                       " intervals"),
            std::string::npos)
      << level;
  EXPECT_EQ(level.find("falls"), std::string::npos) << level;
}

// A length table (d = 64, N = 8 and 512, fixed rule): entropy rising, and the largest weight
// `first` at N = 8 and `last` at N = 512 (CIs ±`half`).
lab::ResultTable length_table(double first, double last, double half) {
  lab::ResultTable t;
  t.meta.experiment = "length";
  t.param_names = {"n", "d", "rule"};
  for (int n : {8, 512}) {
    const double e = std::log(n) - 0.5, m = n == 8 ? first : last;
    t.rows.push_back({{std::to_string(n), "64", "fixed"}, "entropy", e, e - 0.01, e + 0.01, e});
    t.rows.push_back({{std::to_string(n), "64", "fixed"}, "max_weight", m, m - half, m + half, std::nullopt});
  }
  return t;
}

TEST(ReportSections, LengthLargestWeightFollowsTheNumbers) {
  auto text = [](double first, double last, double half) {
    return section_text("length", "3.7", "50", length_table(first, last, half));
  };
  const std::string falls = text(0.4, 0.02, 0.01);
  EXPECT_NE(falls.find("the largest weight\nfalls from 0.4 [0.39, 0.41] to 0.02 [0.01, 0.03]."), std::string::npos) << falls;
  const std::string rises = text(0.02, 0.4, 0.01);
  EXPECT_NE(rises.find("rises from\n0.02 [0.01, 0.03] to 0.4 [0.39, 0.41]."), std::string::npos) << rises;
  EXPECT_EQ(rises.find("falls"), std::string::npos) << rises;
  const std::string level = text(0.1, 0.09, 0.02);
  EXPECT_NE(level.find("is 0.1 [0.08, 0.12] and then 0.09 [0.07, 0.11], the same\nwithin their intervals."),
            std::string::npos)
      << level;
  EXPECT_EQ(level.find("falls"), std::string::npos) << level;
}

// The √(ln N) rule's largest weight falls from N = 8 to 512 in the report's own runs (0.47 to 0.21);
// the section said it "keeps the largest weight at 0.21".
TEST(ReportSections, LengthSqrtLogWeightIsToldByItsTwoEnds) {
  auto text = [](double first, double last) {
    lab::ResultTable t = length_table(0.37, 0.025, 0.01);
    t.rows.push_back({{"8", "64", "sqrt-log"}, "max_weight", first, first - 0.02, first + 0.02, std::nullopt});
    t.rows.push_back({{"512", "64", "sqrt-log"}, "max_weight", last, last - 0.02, last + 0.02, std::nullopt});
    return section_text("length", "3.7", "50", t);
  };
  const std::string falls = text(0.47, 0.21);
  EXPECT_EQ(falls.find("keeps the largest"), std::string::npos) << falls;
  EXPECT_NE(falls.find("its largest\nweight falls too, from 0.47 [0.45, 0.49] to 0.21 [0.19, 0.23], by a factor of 2.2 "
                       "against the\nfixed rule's 15, and at N = 512 it lies above the fixed rule's."),
            std::string::npos)
      << falls;
  const std::string level = text(0.3, 0.29);
  EXPECT_NE(level.find("is 0.3 [0.28, 0.32] and then 0.29 [0.27, 0.31], the same within their\nintervals, and at N = 512"),
            std::string::npos)
      << level;
  EXPECT_EQ(level.find("falls too"), std::string::npos) << level;
}

TEST(ReportSections, ColumnsWordsFollowTheNumbers) {
  auto text = [](const lab::ResultTable& t) { return section_text("columns", "3.8", "50", t); };
  const std::string usual = text(columns_table(0.5, 0.1));
  EXPECT_NE(usual.find("no longer a weighted average"), std::string::npos) << usual;
  // Column-normalised rows that sum to 1 are weighted averages: the words no longer say otherwise.
  lab::ResultTable near = columns_table(0.005, 0);
  for (auto& r : near.rows)
    if (r.metric == "row_sum_min" || r.metric == "row_sum_max") r.mean = 1, r.ci_low = 0.999, r.ci_high = 1.001;
  const std::string odd = text(near);
  EXPECT_EQ(odd.find("no longer a weighted average"), std::string::npos) << odd;
  EXPECT_NE(odd.find("within 1% of 1"), std::string::npos) << odd;
}

TEST(ReportClaims, CatalogueListsEveryClaimOnce) {
  const auto catalogue = claim_catalogue();
  ASSERT_GE(catalogue.size(), 20u);
  std::set<std::string> ids, names;
  for (const Unit& u : units()) names.insert(u.name);
  for (const auto& c : catalogue) {
    EXPECT_TRUE(ids.insert(c.id).second) << "duplicate " << c.id;
    EXPECT_FALSE(c.reference.empty()) << c.id;
    // The units that train models are built only with libtorch.
    const bool trains = c.measured_by == "training" || c.measured_by == "recall";
    EXPECT_TRUE(names.count(c.measured_by) || trains) << c.id << ": " << c.measured_by;
  }
  // Claims no unit judged are listed as not measured; unknown or repeated evidence is an error.
  const auto rows = join_claims({{"var-dot", "p", "m", "r", Verdict::supported}});
  EXPECT_EQ(count_claims(rows).supported, 1);
  EXPECT_EQ(count_claims(rows).unmeasured, static_cast<int>(catalogue.size()) - 1);
  EXPECT_NE(claims_markdown(rows).find("not measured"), std::string::npos);
  EXPECT_THROW(join_claims({{"no-such-claim", "p", "m", "r", Verdict::supported}}), Error);
  EXPECT_THROW(join_claims({{"var-dot", "p", "m", "r", Verdict::supported}, {"var-dot", "p", "m", "r", Verdict::refuted}}),
               Error);
}

TEST(ReportTemplates, SlotsSectionsAndErrors) {
  const Slots s{{"x", "1.5"}, {"yes", "true"}, {"no", "false"}, {"empty", ""}};
  EXPECT_EQ(render_template("x = {{x}}.", s, "t"), "x = 1.5.");
  EXPECT_EQ(render_template("{{#yes}}a{{#no}}b{{/no}}{{^no}}c{{/no}}{{/yes}}{{#empty}}d{{/empty}}{{^missing}}e{{/missing}}", s, "t"),
            "ace");
  EXPECT_EQ(render_template("{{#yes}}{{#yes}}in{{/yes}}out{{/yes}}", s, "t"), "inout");
  try {
    render_template("a {{nope}}", s, "where.md");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "where.md: no value for slot {{nope}}");
  }
  EXPECT_THROW(render_template("{{#yes}}open", s, "t"), Error);
  EXPECT_THROW(render_template("{{/yes}}", s, "t"), Error);
  EXPECT_THROW(render_template("{{x", s, "t"), Error);
  EXPECT_THROW(template_text("report/templates/none.md"), Error);
  // Every unit has a section, and every unit's Evidence names claims of the catalogue.
  for (const Unit& u : units()) EXPECT_NO_THROW(template_text("lab/experiments/" + u.name + "/section.md")) << u.name;
}

TEST(ReportPage, MarkdownToHtmlWithFiguresTablesAndSubscripts) {
  EXPECT_EQ(markdown_to_html("a < b, *c* **d** `e` d<sub>k</sub>"),
            "<p>a &lt; b, <em>c</em> <strong>d</strong> <code>e</code> d<sub>k</sub></p>\n");
  EXPECT_EQ(sub_sup("d_{k} 2^{x}\n```\nq_{i}\n```\n"), "d<sub>k</sub> 2<sup>x</sup>\n```\nq_{i}\n```\n");
  EXPECT_NE(markdown_to_html("| a | b |\n|---|---|\n| 1 | 2 |\n").find("<td>1</td>"), std::string::npos);
}

TEST(ReportPlot, RendersSvgAndPngAndInlinesWithUniqueIds) {
  Figure f{"unit_test_figure"};
  LinePanel& p = f.lines("Var", "d_{k}", "variance");
  p.logx = p.logy = true;
  p.series.push_back({"measured", {1, 4, 16}, {1.1, 3.9, 16.2}, {0.9, 3.5, 15}, {1.3, 4.3, 17}, {1, 4, 16}});
  p.refs.push_back({40, "a target above the data", "#8B1A4A"});
  HeatPanel& h = f.heat("P", "key", "query");
  h.rows = 3;
  h.cols = 4;
  h.values = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 0.0, 0.5};
  h.cbmin = 1e-4;
  h.logcb = true;
  const std::string script = gnuplot_script(f, "svg", "x.svg");
  EXPECT_NE(script.find("$p0s0 << EOD"), std::string::npos);
  EXPECT_NE(script.find("filledcurves"), std::string::npos);
  EXPECT_NE(script.find("dt (6,4)"), std::string::npos);  // theory dashed
  EXPECT_NE(script.find("#440154"), std::string::npos);   // viridis
  EXPECT_NE(script.find("set logscale cb"), std::string::npos);
  EXPECT_NE(script.find("set yrange [0.5625:64]"), std::string::npos) << script;  // the target line inside the range

  const auto dir = std::filesystem::temp_directory_path() / "attnscale_report_unit";
  std::filesystem::remove_all(dir);
  const std::string svg = render(f, dir.string());
  EXPECT_TRUE(std::filesystem::file_size(dir / "unit_test_figure.png") > 1000);
  const std::string a = inline_svg(svg, "f1_"), b = inline_svg(svg, "f2_");
  EXPECT_EQ(a.rfind("<svg", 0), 0u);
  EXPECT_EQ(a.find("id='gp"), std::string::npos);
  EXPECT_NE(a.find("f1_"), std::string::npos);

  Page page;
  page.title = "T";
  page.body = "Text.\n\n![caption with d_{k}](figure:unit_test_figure)\n\n| claim | verdict |\n|---|---|\n| x | y |\n\n**Table #.** claims\n";
  page.figures["unit_test_figure"] = svg;
  const std::string html = page.html();
  EXPECT_NE(html.find("<figure id=\"fig-unit_test_figure\">\n<svg"), std::string::npos);
  EXPECT_NE(html.find("<b>Figure 1.</b> caption with d<sub>k</sub>"), std::string::npos);
  EXPECT_NE(html.find("<strong>Table 1.</strong> claims"), std::string::npos);
  EXPECT_NE(page.markdown().find("![Figure 1](figures/unit_test_figure.svg)"), std::string::npos);
  page.body = "![missing](figure:nope)\n";
  EXPECT_THROW(page.html(), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace attnscale::report
