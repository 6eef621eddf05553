// The pieces the lab's experiments (src/lab/experiments/<name>/) share: their factories, stream
// ids, per-trial parallel work, rows from summaries.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "attnscale/error.h"
#include "lab/experiment.h"
#include "lab/stats.h"

namespace attnscale::lab {

// Experiment make_<name>(); for every line of the registry (experiments/list.h).
#define ATTNSCALE_UNIT(name, id) Experiment make_##name();
#include "lab/experiments/list.h"
#undef ATTNSCALE_UNIT

// Experiment ids (lab::k_<name>): the top 8 bits of every stream number (rng.h stream_id), given
// by the registry line.
enum ExperimentId : std::uint32_t {
#define ATTNSCALE_UNIT(name, id) k_##name = id,
#include "lab/experiments/list.h"
#undef ATTNSCALE_UNIT
};

// Runs fn(trial, out) for trial in [0, trials), where out points at `width` doubles of that
// trial's results; returns them as columns: columns[c][trial]. Trials are split into chunks across
// `threads`; each result depends only on its trial, so the columns are the same for any thread count.
std::vector<std::vector<double>> per_trial(int threads, std::int64_t trials, std::size_t width,
                                           const std::function<void(std::int64_t, double*)>& fn);

Row make_row(std::vector<std::string> params, std::string metric, const Summary& s,
             std::optional<double> theory = std::nullopt);

std::string format_number(double v);  // "%.10g", for parameter columns such as rho = 0.5

// Named scalings of q·k: none (1), sqrt (1/√d), linear (1/d) and the lab's extra rules.
double scaling_factor(const std::string& rule, std::int64_t d, std::int64_t n);
// saturation's per-(N, d) work, shared with length: rows (prefix..., scaling, metric) for the given
// scaling names and factors, all on the same Q and K per trial.
std::vector<Row> attention_rows_point(const Args& a, std::uint32_t stream_experiment, std::int64_t n,
                                      std::int64_t d, const std::vector<std::string>& names,
                                      const std::vector<double>& scales, const std::vector<std::string>& prefix);

void check_scalings(const std::vector<std::string>& rules, const std::vector<std::string>& allowed,
                    const std::string& flag);

// Throws "--flag: each value must be in [lo, hi], got v" for the first value of the integer flag
// outside [lo, hi]. A bound that is a power of two above 2^16 is written 2^k.
void check_ints_in(const Args& a, const std::string& flag, std::int64_t lo, std::int64_t hi);

// Throws "--flag: expected one <what>" unless the flag holds exactly one number and `fits` (if
// given) accepts it: check_one_number(a, "sigma", "positive number", [](double v) { return v > 0; }).
void check_one_number(const Args& a, const std::string& flag, const std::string& what = "number",
                      const std::function<bool(double)>& fits = {});

// A component's mean and standard deviation (`std_flag` may be ""), each one number, |mean| and std
// at most 1e6 and std at least 1e-6. Beyond them the statistics stop meaning anything: at d = 2^24,
// |q·k| reaches d(μ² + σ²), whose fourth power (the kurtosis in the variance's interval) passes
// float64's 1.8e308 once μ² + σ² is near 1e69, and Var(s·q·k) = s²·d·σ²(σ² + 2μ²) with s = 1/d falls
// below its 2.2e-308 once σ is near 1e-73; in between, a σ tiny against μ leaves a variance that
// float64 rounds away against the mean dμ² (relative rounding error about d·|μ|/σ · 1e-16).
void check_component_moments(const Args& a, const std::string& mean_flag, const std::string& std_flag);

// The distributions of the list flag `flag` ("laplace,t10"), each by its canonical name (Dist::name:
// "t05" is "t5"). Throws "--flag: ..." for a name Dist::parse refuses, or one that names an earlier
// distribution again ("t5,t05"): its rows would repeat.
std::vector<std::string> dist_names(const Args& a, const std::string& flag);

// The points (n, d) for every n of --n and, within it, every d of --d.
std::vector<std::vector<std::string>> n_d_points(const Args& a);

}  // namespace attnscale::lab
