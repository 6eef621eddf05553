// The lab's interface: flags, points, thread-count independence, result formats, the Simulation note's figures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "attnscale/error.h"
#include "lab/experiment.h"
#include "lab/results.h"
#include "interval_checks.h"

namespace attnscale::lab {
namespace {

using Flags = std::map<std::string, std::string>;

double value(const ResultTable& t, const std::vector<std::string>& params, const std::string& metric) {
  for (const auto& r : t.rows)
    if (r.params == params && r.metric == metric) return r.mean;
  ADD_FAILURE() << "no row " << metric;
  return 0;
}

TEST(LabExperiment, RegistryFindsEveryExperimentAndNamesTheKnownOnes) {
  for (const auto& e : experiments()) EXPECT_EQ(&find_experiment(e.name), &e);
  try {
    find_experiment("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown experiment 'nope' (known: "), std::string::npos);
  }
}

TEST(LabExperiment, BadFlagsThrowErrorsNamingTheFlag) {
  const auto& sat = find_experiment("saturation");
  auto message = [&](const Flags& f) {
    try {
      run_experiment(sat, f, 1, 2, 1);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({{"bogus", "1"}}).rfind("--bogus: not a flag of experiment saturation", 0), 0u);
  EXPECT_EQ(message({{"d", "1,x"}}), "--d: expected a comma-separated list of integers, got '1,x'");
  EXPECT_EQ(message({{"d", "0"}}), "--d: each value must be in [1, 2^20], got 0");
  EXPECT_EQ(message({{"scaling", "cube"}}).rfind("--scaling: unknown value 'cube'", 0), 0u);
  EXPECT_EQ(message({{"sampler", "magic"}}), "--sampler: expected auto, direct or wishart, got 'magic'");
  EXPECT_THROW(run_experiment(sat, {}, 1, -3, 1), Error);
}

// Same seed, 1 and 2 threads: byte-identical CSV for every experiment (small sweeps; the defaults of the
// training and recall experiments take minutes).
TEST(LabExperiment, OneAndTwoThreadsGiveIdenticalCsv) {
  const std::map<std::string, Flags> small = {
      {"variance", {{"d", "1,3,64"}}},
      {"saturation", {{"n", "7,12"}, {"d", "1,5,16"}, {"sampler", "direct"}}},
      {"moments", {{"d", "1,9"}}},
      {"gradients", {{"n", "6"}, {"d", "1,8"}}},
      {"heatmap", {{"n", "5"}, {"d", "4"}}},
      {"projections", {{"n", "6"}, {"dx", "8"}, {"d", "4"}}},
      {"length", {{"n", "4,9"}, {"d", "8"}}},
      {"training", {{"grid", "quick"}, {"scaling", "sqrt,none"}, {"lr", "0.01"}, {"seeds", "1"}, {"steps", "3"},
                    {"seq-len", "8"}, {"batch", "2"}, {"d-model", "8"}, {"d-head", "4"}}},
      {"recall", {{"grid", "quick"}, {"seeds", "1"}, {"steps", "3"}, {"batch", "2"}}}};
  for (const auto& e : experiments()) {
    const auto it = small.find(e.name);
    const Flags f = it == small.end() ? Flags{} : it->second;
    const std::int64_t trials = e.trials_unused.empty() ? 9 : 0;  // training runs take --seeds instead
    const std::string one = to_csv(run_experiment(e, f, 7, trials, 1));
    const std::string two = to_csv(run_experiment(e, f, 7, trials, 2));
    EXPECT_EQ(one, two) << e.name;
    EXPECT_NE(one, to_csv(run_experiment(e, f, 8, trials, 2))) << e.name << ": the seed must matter";
  }
}

// Every interval an experiment writes holds its mean, has some width (none at all: NaN), and stays
// in its metric's range: counts and weights of a row of N keys, an entropy in [0, ln N], a
// correlation in [−1, 1], a kurtosis ≥ 1, variances, norms, sums and changes ≥ 0.
// The sweeps reach the bounds: d = 512 unscaled saturates every row (top_p_95 = 1 in each trial),
// 1/d at d = 512 leaves them nearly uniform, qk-norm at d = 1 exactly uniform.
TEST(LabExperiment, IntervalsStayInTheirMetricsRangeAndAreNeverZeroWidth) {
  const std::map<std::string, Flags> small = {
      {"saturation", {{"n", "8"}, {"d", "1,64,512"}}},
      {"length", {{"n", "4,16"}, {"d", "8,512"}}},
      {"gradients", {{"n", "6"}, {"d", "1,512"}}},
      {"projections", {{"n", "6"}, {"dx", "8"}, {"d", "1,4"}}},
      {"columns", {{"n", "5"}, {"d", "4"}}},
      {"moments", {{"d", "1,4"}}},
      {"variance", {{"d", "1,16"}}}};  // training's and recall's summaries: tests/training (TrainingExperiment.SummaryIntervals...)
  const double inf = INFINITY;
  auto range = [&](const std::string& metric, double n) -> std::pair<double, double> {
    if (metric == "top_p_95" || metric == "participation") return {1, n};
    if (metric == "entropy") return {0, std::log(n)};
    if (metric == "max_weight") return {1 / n, 1};
    if (metric.rfind("corr", 0) == 0) return {-1, 1};
    if (metric.rfind("kurtosis", 0) == 0) return {1, inf};
    if (metric.rfind("var", 0) == 0 || metric.find("fro") != std::string::npos ||
        metric.find("sum") != std::string::npos || metric == "causal_leak" ||
        metric == "output_rel_diff")
      return {0, inf};
    return {-inf, inf};
  };
  int checked = 0;
  for (const auto& [name, f] : small) {
    const Experiment& e = find_experiment(name);
    const ResultTable t = run_experiment(e, f, 3, 20, 2);
    const auto n_at = std::find(t.param_names.begin(), t.param_names.end(), "n") - t.param_names.begin();
    for (const Row& r : t.rows) {
      const std::string what = name + " " + r.metric + " at " + ::testing::PrintToString(r.params);
      const double n = static_cast<std::size_t>(n_at) < r.params.size() ? std::stod(r.params[n_at]) : inf;
      const auto [lo, hi] = range(r.metric, n);
      const double slack = 1e-9 * std::max(1.0, std::abs(r.mean));  // float32 rounding at a bound
      if (testing::expect_interval_sound(r, lo, hi, what, slack)) ++checked;
    }
  }
  EXPECT_GT(checked, 300);
}

TEST(LabExperiment, ProgressIsCalledInPointOrderWithEachPointsRows) {
  const auto& sat = find_experiment("saturation");
  std::vector<std::size_t> seen;
  std::size_t rows = 0;
  const auto t = run_experiment(sat, {{"d", "1,2,3,4,5"}, {"scaling", "sqrt"}}, 3, 4, 2,
                                [&](std::size_t done, std::size_t total, const std::vector<Row>& r) {
                                  EXPECT_EQ(total, 5u);
                                  seen.push_back(done);
                                  rows += r.size();
                                  ASSERT_FALSE(r.empty());
                                  EXPECT_EQ(r[0].params[1], std::to_string(done));
                                });
  EXPECT_EQ(seen, (std::vector<std::size_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(rows, t.rows.size());
}

TEST(LabExperiment, CsvAndJsonCarryTheSameRows) {
  const auto t = run_experiment(find_experiment("variance"), {{"d", "2,4"}, {"scaling", "sqrt"}}, 5, 50, 1);
  const std::string csv = to_csv(t);
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "d,scaling,dist,metric,mean,ci_low,ci_high,theory");
  EXPECT_NE(csv.find("\n2,sqrt,normal,var,"), std::string::npos);
  EXPECT_NE(csv.find("\nall,sqrt,normal,loglog_slope,"), std::string::npos);
  const std::string json = to_json(t);
  for (const char* key : {"\"metadata\"", "\"seed\": 5", "\"trials\": 50", "\"git_hash\"", "\"cpu_target\"",
                          "\"seconds\"", "\"param_names\"", "\"rows\"", "\"theory\""})
    EXPECT_NE(json.find(key), std::string::npos) << key;
  ResultTable empty_theory;
  empty_theory.param_names = {"x"};
  empty_theory.rows.push_back(Row{{"1"}, "m", 0.5, 0.25, 0.75, std::nullopt});
  EXPECT_EQ(to_csv(empty_theory), "x,metric,mean,ci_low,ci_high,theory\n1,m,0.5,0.25,0.75,\n");
  EXPECT_NE(to_json(empty_theory).find("\"theory\": null"), std::string::npos);
}

// The Simulation note: N = 50; scaled ≈ 38 of 50 keys carry 95% of the mass, unscaled ≈ 2 at d = 128.
TEST(LabExperiment, ReproducesSeed001TopP95) {
  const auto t = run_experiment(find_experiment("saturation"),
                                {{"n", "50"}, {"d", "16,64,128"}, {"scaling", "none,sqrt"}}, 1, 60, 2);
  for (const char* d : {"16", "64", "128"}) {
    const double scaled = value(t, {"50", d, "sqrt"}, "top_p_95");
    EXPECT_GE(scaled, 35) << d;
    EXPECT_LE(scaled, 41) << d;
  }
  EXPECT_LE(value(t, {"50", "128", "none"}, "top_p_95"), 3);
}

// The Wishart sampler has the law of the direct one: the two agree within their intervals.
TEST(LabExperiment, WishartSamplerAgreesWithDirect) {
  const auto& sat = find_experiment("saturation");
  const Flags base = {{"n", "12"}, {"d", "40"}, {"scaling", "none,sqrt"}};
  Flags w = base;
  w["sampler"] = "wishart";
  const auto a = run_experiment(sat, base, 11, 400, 2), b = run_experiment(sat, w, 11, 400, 2);
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (std::size_t i = 0; i < a.rows.size(); ++i) {
    const auto& x = a.rows[i];
    const auto& y = b.rows[i];
    const double se = (x.ci_high - x.ci_low + y.ci_high - y.ci_low) / (2 * 1.96);
    EXPECT_LE(std::abs(x.mean - y.mean), 4 * se + 1e-12) << x.metric << " " << x.params[2];
  }
}

// --sampler wishart draws the points with d < N directly: the metadata (and the JSON) names what
// the run used, and that value, given back as the flag, reproduces the run bit for bit.
TEST(LabExperiment, WishartSamplerRecordsWhatTheRunUsed) {
  const auto& sat = find_experiment("saturation");
  auto run = [&](const char* d, const std::string& sampler) {
    return run_experiment(sat, {{"n", "8"}, {"d", d}, {"scaling", "none,sqrt"}, {"sampler", sampler}}, 5, 3, 1);
  };
  auto sampler_of = [](const ResultTable& t) {
    for (const auto& [name, value] : t.meta.flags)
      if (name == "sampler") return value;
    return std::string("?");
  };
  auto same_rows = [](const ResultTable& a, const ResultTable& b) {
    if (a.rows.size() != b.rows.size()) return false;
    for (std::size_t i = 0; i < a.rows.size(); ++i)
      if (a.rows[i].params != b.rows[i].params || a.rows[i].mean != b.rows[i].mean ||
          a.rows[i].ci_low != b.rows[i].ci_low)
        return false;
    return true;
  };
  const ResultTable mixed = run("4,16", "wishart");
  EXPECT_EQ(sampler_of(mixed), "wishart (direct where d < N)");
  EXPECT_NE(to_json(mixed).find(R"x("sampler": "wishart (direct where d < N)")x"), std::string::npos);
  const ResultTable again = run("4,16", sampler_of(mixed));
  EXPECT_TRUE(same_rows(again, mixed));
  EXPECT_EQ(sampler_of(again), sampler_of(mixed));
  // Its d = 4 point is the direct sampler's, its d = 16 point not.
  ResultTable d4 = mixed, d16 = mixed;
  std::erase_if(d4.rows, [](const Row& r) { return r.params[1] != "4"; });
  std::erase_if(d16.rows, [](const Row& r) { return r.params[1] != "16"; });
  EXPECT_TRUE(same_rows(d4, run("4", "direct")));
  EXPECT_FALSE(same_rows(d16, run("16", "direct")));
  // Every point on one side of N: one sampler, named as such.
  EXPECT_EQ(sampler_of(run("8,16", "wishart")), "wishart");
  const ResultTable all_direct = run("2,4", "wishart");
  EXPECT_EQ(sampler_of(all_direct), "direct");
  EXPECT_TRUE(same_rows(all_direct, run("2,4", "direct")));
  EXPECT_EQ(sampler_of(run("4,16", "auto")), "auto");  // auto's rule is its own: d > N
}

}  // namespace
}  // namespace attnscale::lab
