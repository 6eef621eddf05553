#include "lab/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <boost/math/distributions/beta.hpp>
#include <boost/math/distributions/normal.hpp>
#include <boost/math/distributions/students_t.hpp>

namespace attnscale::lab {

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// Quantiles from Boost.Math (exact to double precision, not an approximation).
double normal_quantile(double p) {
  if (p <= 0) return -std::numeric_limits<double>::infinity();
  if (p >= 1) return std::numeric_limits<double>::infinity();
  return boost::math::quantile(boost::math::normal_distribution<double>(), p);
}

double student_t_quantile(double p, double dof) {
  if (p <= 0) return -std::numeric_limits<double>::infinity();
  if (p >= 1) return std::numeric_limits<double>::infinity();
  return boost::math::quantile(boost::math::students_t_distribution<double>(std::max(dof, 1.0)), p);
}

double sample_mean(const double* x, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += x[i];
  return n ? s / n : 0;
}

double sample_variance(const double* x, std::size_t n) {
  if (n < 2) return 0;
  const double m = sample_mean(x, n);
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += (x[i] - m) * (x[i] - m);
  return s / (n - 1);
}

double sample_kurtosis(const double* x, std::size_t n) {
  const double m = sample_mean(x, n);
  double m2 = 0, m4 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double e = (x[i] - m) * (x[i] - m);
    m2 += e;
    m4 += e * e;
  }
  m2 /= n;
  m4 /= n;
  return m2 > 0 ? m4 / (m2 * m2) : 0;
}

namespace {
bool all_same(const std::vector<double>& x) {
  return std::all_of(x.begin(), x.end(), [&](double v) { return v == x.front(); });
}
}  // namespace

Summary mean_ci(const std::vector<double>& x) {
  const std::size_t n = x.size();
  const double m = sample_mean(x.data(), n);
  if (n < 2) return {m, kNotComputable, kNotComputable};
  // Every value the same: the t interval would have zero width, as if the mean were exact. (Tested
  // on the values, not on s² = 0: the sum of n copies of 0.367, divided by n, can miss 0.367 by an
  // ulp and leave s² a rounding error above 0.)
  if (all_same(x)) return {x.front(), kNotComputable, kNotComputable};
  const double s2 = sample_variance(x.data(), n);
  const double h = student_t_quantile(0.975, n - 1) * std::sqrt(s2 / n);
  return {m, m - h, m + h};
}

// Values X ∈ [lo, hi] by definition. With some spread, the t interval clipped to [lo, hi]: the
// true mean lies in [lo, hi], so clipping drops only ends that could not hold it, and the mean
// lies strictly inside (min x < mean < max x), so the interval keeps a positive width. (A bound is
// first widened to the sample's own extremes: a float32 entropy of a uniform row can be an ulp
// above ln N, and the interval must still hold its mean.)
// Every value the same, v (a top-p count of 1, or of 48 of 50 keys, in every trial): the t
// interval has nothing to go on, but the bounds do. With π = P(X ≠ v),
//   E X = (1 − π) v + π E[X | X ≠ v]  ∈  [v − π (v − lo), v + π (hi − v)],
// and π, with no such value in n draws, is at most 1 − 0.025^{1/n} (the Clopper–Pearson upper end
// for 0 of n below; 0.168 at n = 20, 0.018 at 200). An infinite bound leaves that side unbounded:
// then no interval (NaN), as for a loss ≥ 0 that two seeds end at the same value.
Summary bounded_mean_ci(const std::vector<double>& x, double lo, double hi) {
  const std::size_t n = x.size();
  Summary r = mean_ci(x);
  if (n < 2 || std::isnan(r.mean)) return r;
  const double low = std::min(lo, *std::min_element(x.begin(), x.end()));
  const double high = std::max(hi, *std::max_element(x.begin(), x.end()));
  if (std::isnan(r.ci_low)) {  // every value the same
    const double v = r.mean, reach = 1 - std::pow(0.025, 1.0 / static_cast<double>(n));
    if (!std::isfinite(low) || !std::isfinite(high)) return r;
    return {v, v - reach * (v - low), v + reach * (high - v)};
  }
  r.ci_low = std::max(r.ci_low, low);
  r.ci_high = std::min(r.ci_high, high);
  return r;
}

// Clopper–Pearson (1934): the p at which k or more successes (for the lower end), k or fewer (for
// the upper end) have probability 2.5%. By the beta–binomial identity P(Bin(n, p) ≥ k) =
// I_p(k, n − k + 1), the ends are beta quantiles:
//   lower = B⁻¹(0.025; k, n − k + 1)  (0 at k = 0),   upper = B⁻¹(0.975; k + 1, n − k)  (1 at k = n).
Summary proportion_ci(std::int64_t k, std::int64_t n) {
  if (n < 1 || k < 0 || k > n) return {kNotComputable, kNotComputable, kNotComputable};
  const double kd = static_cast<double>(k), nd = static_cast<double>(n);
  using boost::math::beta_distribution;
  const double lo = k == 0 ? 0.0 : boost::math::quantile(beta_distribution<double>(kd, nd - kd + 1), 0.025);
  const double hi = k == n ? 1.0 : boost::math::quantile(beta_distribution<double>(kd + 1, nd - kd), 0.975);
  return {kd / nd, lo, hi};
}

// Each run's proportion is (its count) / trials, so the pooled count is Σ p · trials (rounded: the
// division left at most an ulp). The union of the two intervals: the runs' spread where they differ,
// and never less than the counted trials themselves allow (two seeds that both end at 94 of 256
// queries have no spread, but 256 queries do not pin 0.367 down to three digits).
Summary runs_proportion_ci(const std::vector<double>& p, std::int64_t trials) {
  if (trials < 1) return bounded_mean_ci(p, 0, 1);  // no count: the runs alone
  Summary runs = mean_ci(p);  // NaN where every run ended the same: then the trials speak alone
  if (p.empty() || std::isnan(runs.mean)) return runs;
  runs.ci_low = std::max(runs.ci_low, 0.0);
  runs.ci_high = std::min(runs.ci_high, 1.0);
  double count = 0;
  for (double v : p) count += v * static_cast<double>(trials);
  const auto n = static_cast<std::int64_t>(p.size()) * trials;
  const Summary pooled = proportion_ci(std::clamp<std::int64_t>(std::llround(count), 0, n), n);
  Summary r{runs.mean, pooled.ci_low, pooled.ci_high};
  if (!std::isnan(runs.ci_low)) {
    r.ci_low = std::min(r.ci_low, runs.ci_low);
    r.ci_high = std::max(r.ci_high, runs.ci_high);
  }
  return r;
}

// Bonett's interval for a variance (D. G. Bonett, "Approximate confidence interval for standard
// deviation of nonnormal distributions", Computational Statistics & Data Analysis 50, 2006): on the
// log scale, where the sample variance is nearer normal, with its standard error from the kurtosis,
//   c = n / (n − z),  g = n Σ(x − m̃)⁴ / (Σ(x − m)²)²  (m̃: the mean trimmed by 1/(2√(n − 4)) a side),
//   se = c √((g − (n − 3)/n) / (n − 1)),  σ² in exp(ln(c s²) ∓ z se).
// The symmetric asymptotic interval s² ± z √((m₄ − s⁴)/n) it replaced covered Var(q·k) at d = 1
// (kurtosis 9) in 61% of samples of 10 trials and 78% of 30; this one in 89% and 89%, never with a
// negative lower bound, and the same as that one at 1000 trials (94%; docs/lab.md).
Summary variance_ci(const std::vector<double>& x) {
  const std::size_t n = x.size();
  if (n < 2) return {kNotComputable, kNotComputable, kNotComputable};
  const double z = 1.959963984540054, m = sample_mean(x.data(), n), s2 = sample_variance(x.data(), n);
  // Every trial the same value: 0, with no interval (a zero-width one would look exact).
  if (all_same(x)) return {0, kNotComputable, kNotComputable};
  double trimmed = m;
  if (n > 4) {
    std::vector<double> sorted = x;
    std::sort(sorted.begin(), sorted.end());
    const auto cut = static_cast<std::size_t>(std::floor(n / (2 * std::sqrt(n - 4.0))));
    trimmed = sample_mean(sorted.data() + cut, n - 2 * cut);
  }
  double m4 = 0;
  for (double v : x) m4 += (v - trimmed) * (v - trimmed) * (v - trimmed) * (v - trimmed);
  const double ss = s2 * (n - 1), g = n * m4 / (ss * ss), c = n / (n - z);
  const double se = c * std::sqrt(std::max(0.0, g - (n - 3.0) / n) / (n - 1));
  const double centre = std::log(c * s2);
  return {s2, std::exp(centre - z * se), std::exp(centre + z * se)};
}

Summary median_ci(std::vector<double> x) {
  const std::size_t n = x.size();
  if (n == 0) return {};
  std::sort(x.begin(), x.end());
  const double med = n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
  const double h = 1.959963984540054 * std::sqrt(static_cast<double>(n)) / 2;
  const auto lo = static_cast<std::int64_t>(std::floor(n / 2.0 - h));
  const auto hi = static_cast<std::int64_t>(std::ceil(n / 2.0 + h));
  // The interval needs order statistics the sample does not have (n < 4).
  if (lo < 0 || hi > static_cast<std::int64_t>(n)) return {med, kNotComputable, kNotComputable};
  // Ties across the whole span (a discrete sample): the order statistics give no width.
  if (x[lo] == x[hi - 1]) return {med, kNotComputable, kNotComputable};
  return {med, x[lo], x[hi - 1]};
}

// θ_(g): the statistic without group g;  SE² = (G − 1)/G Σ_g (θ_(g) − mean θ_(·))².
// Group g is x[g·n/G, (g+1)·n/G): every element lies in exactly one group, whose sizes differ by at
// most one. (Groups of ⌊n/G⌋ from the start would never leave out the last n mod G elements, and
// the standard error would come out too small: at n = 39, G = 20, half the deletions are missing.)
Summary jackknife_ci(const std::vector<double>& x, int groups,
                     const std::function<double(const double*, std::size_t)>& statistic) {
  const std::size_t n = x.size();
  const double full = statistic(x.data(), n);
  if (groups < 2 || n < static_cast<std::size_t>(groups)) return {full, kNotComputable, kNotComputable};
  const std::size_t g_count = static_cast<std::size_t>(groups);
  std::vector<double> rest, per(g_count);
  for (std::size_t g = 0; g < g_count; ++g) {
    const std::size_t begin = g * n / g_count, end = (g + 1) * n / g_count;
    rest.assign(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(begin));
    rest.insert(rest.end(), x.begin() + static_cast<std::ptrdiff_t>(end), x.end());
    per[g] = statistic(rest.data(), rest.size());
  }
  const double m = sample_mean(per.data(), per.size());
  double ss = 0;
  for (double v : per) ss += (v - m) * (v - m);
  // Every deletion gave the same value (a Rademacher q·k at d = 1 has kurtosis 1 in every group):
  // the standard error is 0, and a zero-width interval would look exact.
  if (!(ss > 0)) return {full, kNotComputable, kNotComputable};
  const double h = student_t_quantile(0.975, groups - 1) * std::sqrt(ss * (groups - 1) / groups);
  return {full, full - h, full + h};
}

Summary kurtosis_ci(const std::vector<double>& x) {
  Summary r = jackknife_ci(x, 20, sample_kurtosis);
  if (r.ci_low < 1) r.ci_low = 1;  // NaN (not computable) stays NaN
  return r;
}

Summary slope_ci(const std::vector<double>& x, const std::vector<double>& y) {
  const std::size_t n = x.size();
  const double mx = sample_mean(x.data(), n), my = sample_mean(y.data(), n);
  double sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
  }
  // Every x the same (or none): the slope is undefined, not 0 with an interval that looks exact.
  if (!(sxx > 0)) return {kNotComputable, kNotComputable, kNotComputable};
  const double b = sxy / sxx;
  if (n < 3) return {b, kNotComputable, kNotComputable};
  // Residuals r_i = y_i − ȳ − b(x_i − x̄). Each is computed with a rounding error of a few units
  // of the largest term, so a residual sum of squares within (4u)² Σ (|y_i| + |ȳ| + |b(x_i − x̄)|)²
  // (u = 2^-53) is no evidence of any scatter: the points lie on a line as far as float64 can
  // tell, and the t interval, zero-width or a rounding error wide, would look exact. None then, as
  // for a mean of values that are all the same.
  double sse = 0, rounding = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double r = y[i] - my - b * (x[i] - mx);
    const double scale = std::abs(y[i]) + std::abs(my) + std::abs(b * (x[i] - mx));
    sse += r * r;
    rounding += scale * scale;
  }
  const double u4 = 4 * std::numeric_limits<double>::epsilon() / 2;
  if (!(sse > u4 * u4 * rounding)) return {b, kNotComputable, kNotComputable};
  const double h = student_t_quantile(0.975, n - 2) * std::sqrt(sse / (n - 2) / sxx);
  return {b, b - h, b + h};
}

}  // namespace attnscale::lab
