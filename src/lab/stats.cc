#include "lab/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnscale::lab {

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// Acklam's approximation (relative error 1.15e-9), refined by one Newton step on erfc.
double normal_quantile(double p) {
  if (p <= 0) return -std::numeric_limits<double>::infinity();
  if (p >= 1) return std::numeric_limits<double>::infinity();
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01,  -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  double x;
  if (p < 0.02425) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p > 1 - 0.02425) {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  }
  const double e = normal_cdf(x) - p;
  return x - e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
}

// Cornish-Fisher expansion of the t quantile in 1/dof (Abramowitz & Stegun 26.7.5), four terms.
double student_t_quantile(double p, double dof) {
  const double z = normal_quantile(p), z2 = z * z;
  if (dof < 1) dof = 1;
  const double g1 = (z2 + 1) * z / 4;
  const double g2 = ((5 * z2 + 16) * z2 + 3) * z / 96;
  const double g3 = (((3 * z2 + 19) * z2 + 17) * z2 - 15) * z / 384;
  const double g4 = ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) * z / 92160;
  return z + g1 / dof + g2 / (dof * dof) + g3 / (dof * dof * dof) + g4 / (dof * dof * dof * dof);
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

Summary mean_ci(const std::vector<double>& x) {
  const std::size_t n = x.size();
  const double m = sample_mean(x.data(), n);
  if (n < 2) return {m, kNotComputable, kNotComputable};
  const double h = student_t_quantile(0.975, n - 1) * std::sqrt(sample_variance(x.data(), n) / n);
  return {m, m - h, m + h};
}

Summary variance_ci(const std::vector<double>& x) {
  const std::size_t n = x.size();
  if (n < 2) return {kNotComputable, kNotComputable, kNotComputable};
  const double m = sample_mean(x.data(), n);
  double m2 = 0, m4 = 0;
  for (double v : x) {
    const double e = (v - m) * (v - m);
    m2 += e;
    m4 += e * e;
  }
  m2 /= n;
  m4 /= n;
  const double s2 = m2 * n / (n - 1);
  const double se = std::sqrt(std::max(0.0, m4 - m2 * m2) / n);
  return {s2, s2 - 1.959963984540054 * se, s2 + 1.959963984540054 * se};
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
  return {med, x[lo], x[hi - 1]};
}

// θ_(g): the statistic without group g;  SE² = (G − 1)/G Σ_g (θ_(g) − mean θ_(·))².
Summary jackknife_ci(const std::vector<double>& x, int groups,
                     const std::function<double(const double*, std::size_t)>& statistic) {
  const double full = statistic(x.data(), x.size());
  const std::size_t size = x.size() / std::max(groups, 1);
  if (groups < 2 || size < 1) return {full, kNotComputable, kNotComputable};
  std::vector<double> rest, per(groups);
  for (int g = 0; g < groups; ++g) {
    rest.clear();
    for (std::size_t i = 0; i < x.size(); ++i)
      if (i / size != static_cast<std::size_t>(g)) rest.push_back(x[i]);
    per[g] = statistic(rest.data(), rest.size());
  }
  const double m = sample_mean(per.data(), per.size());
  double ss = 0;
  for (double v : per) ss += (v - m) * (v - m);
  const double h = student_t_quantile(0.975, groups - 1) * std::sqrt(ss * (groups - 1) / groups);
  return {full, full - h, full + h};
}

Summary slope_ci(const std::vector<double>& x, const std::vector<double>& y) {
  const std::size_t n = x.size();
  const double mx = sample_mean(x.data(), n), my = sample_mean(y.data(), n);
  double sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
  }
  if (sxx == 0) return {};
  const double b = sxy / sxx;
  if (n < 3) return {b, kNotComputable, kNotComputable};
  double sse = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double r = y[i] - my - b * (x[i] - mx);
    sse += r * r;
  }
  const double h = student_t_quantile(0.975, n - 2) * std::sqrt(sse / (n - 2) / sxx);
  return {b, b - h, b + h};
}

}  // namespace attnscale::lab
