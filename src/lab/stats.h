// Summaries with 95% confidence intervals.
//
// Which interval each function gives:
//   mean_ci      Student-t interval of the mean, t_{0.975, n-1} · s / sqrt(n) (the t quantile from
//                Boost.Math, exact); none (NaN) when every value is the same, whose zero-width
//                interval would look exact.
//   bounded_mean_ci  the mean of values that lie in [lo, hi] by definition (a loss ≥ 0, an entropy
//                in [0, ln N], a correlation in [−1, 1]): mean_ci with its ends clipped to [lo, hi],
//                which loses no coverage (the true mean lies in [lo, hi] too). Every value the same
//                v: [v − π(v − lo), v + π(hi − v)] with π = 1 − 0.025^{1/n}, the most that a value
//                other than v could weigh after n draws without one (none, NaN, if a bound is
//                infinite).
//   proportion_ci    k successes of n trials: the Clopper–Pearson interval, from the beta quantiles
//                (Boost.Math); never zero-width for n ≥ 1, inside [0, 1], at least 95% coverage at
//                every n and p.
//   runs_proportion_ci  the mean of per-run proportions, each over `trials` counted trials (recall
//                accuracy over the validation queries of each seed): proportion_ci over the pooled
//                trials, joined (union) with mean_ci over the runs clipped to [0, 1] where the runs
//                differ, so it is never narrower than what either the counted trials or the spread
//                between runs allows. With `trials` < 1: bounded_mean_ci over the runs.
//   variance_ci  the sample variance with Bonett's (2006) interval: on the log scale, its
//                standard error from the kurtosis (about a trimmed mean), scaled by n / (n - z);
//                never below 0, and near its nominal 95% at 10 trials of heavy-tailed data.
//   median_ci    the sample median with the order-statistic interval [x_(lo), x_(hi)],
//                lo/hi = n/2 -+ 1.96 sqrt(n)/2 (normal approximation to Binomial(n, 1/2));
//                none (NaN) when x_(lo) = x_(hi) (ties).
//   jackknife_ci any statistic on the whole sample, with the delete-one-group jackknife standard
//                error over `groups` contiguous groups that cover the sample (sizes differ by at
//                most one) and the t quantile with groups − 1 degrees of freedom (used for
//                kurtosis, whose standard error needs 8th moments); none (NaN) when every deletion
//                gives the same value.
//   kurtosis_ci  the sample kurtosis with jackknife_ci over 20 groups, its lower end raised to 1:
//                no distribution has less (E[x⁴] ≥ E[x²]² about the mean), while the symmetric
//                interval of a heavy-tailed sample reached below 0 (moments, Student-t ν = 3, d = 4,
//                100 trials: [-4.35, 51.6]).
//   slope_ci     least-squares slope of y on x with its t interval (n-2 degrees of freedom); NaN,
//                interval included, when every x is the same; no interval (NaN ends) when the
//                points lie on a line exactly (residuals at float64's rounding level), whose
//                zero-width interval would look exact.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace attnscale::lab {

struct Summary {
  double mean = 0, ci_low = 0, ci_high = 0;
};

// The bounds of an interval the sample is too small for (one trial for a mean, fewer than 4 for a
// median, fewer than 3 points for a slope) or cannot speak to (a mean or variance of values that
// are all the same, with no bound they sit at; a slope through points on one line): NaN, written "nan" in CSV and null in JSON, never
// a zero-width interval that would look exact.
inline constexpr double kNotComputable = std::numeric_limits<double>::quiet_NaN();

double normal_quantile(double p);                 // Φ^{-1}(p) (Boost.Math)
double student_t_quantile(double p, double dof);  // the Student-t quantile (Boost.Math); dof < 1 taken as 1
double normal_cdf(double x);

Summary mean_ci(const std::vector<double>& x);
Summary bounded_mean_ci(const std::vector<double>& x, double lo, double hi);
Summary proportion_ci(std::int64_t k, std::int64_t n);
Summary runs_proportion_ci(const std::vector<double>& p, std::int64_t trials);
Summary variance_ci(const std::vector<double>& x);
Summary median_ci(std::vector<double> x);
Summary jackknife_ci(const std::vector<double>& x, int groups,
                     const std::function<double(const double*, std::size_t)>& statistic);
Summary kurtosis_ci(const std::vector<double>& x);
Summary slope_ci(const std::vector<double>& x, const std::vector<double>& y);

// Sample statistics (divisor n - 1 for the variance; kurtosis E[(x-m)^4]/s^4 with divisor n).
double sample_mean(const double* x, std::size_t n);
double sample_variance(const double* x, std::size_t n);
double sample_kurtosis(const double* x, std::size_t n);

}  // namespace attnscale::lab
