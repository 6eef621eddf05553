#include "lab/attention_rows.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "attnscale/attention.h"
#include "lab/stats.h"
#include "lab/theory.h"

namespace attnscale::lab {

void attention_probs(const std::vector<double>& q, const std::vector<double>& k, std::int64_t n,
                     std::int64_t dq, double scale, std::vector<double>& probs) {
  attention_probs(q, k, n, n, dq, scale, probs);
}

void attention_probs(const std::vector<double>& q, const std::vector<double>& k, std::int64_t nq,
                     std::int64_t nk, std::int64_t dq, double scale, std::vector<double>& probs) {
  std::vector<double> v(nk, 0.0), out(nq);
  probs.resize(nq * nk);
  Options opt;
  opt.scale = Scale::value(scale);
  opt.threads = 1;
  Outputs o;
  o.out = TensorView::contiguous(out.data(), DType::f64, {nq, 1});
  o.probs = TensorView::contiguous(probs.data(), DType::f64, {nq, nk});
  forward(TensorView::contiguous(const_cast<double*>(q.data()), DType::f64, {nq, dq}),
          TensorView::contiguous(const_cast<double*>(k.data()), DType::f64, {nk, dq}),
          TensorView::contiguous(v.data(), DType::f64, {nk, 1}), o, opt);
}

void sample_qk_direct(const Stream& s, std::int64_t n, std::int64_t d, std::vector<double>& q,
                      std::vector<double>& k) {
  q.resize(n * d);
  k.resize(n * d);
  const std::uint64_t offset = static_cast<std::uint64_t>(n * d + 1) / 2 * 2;  // even
  s.fill_normal(0, n * d, q.data());
  s.fill_normal(offset, n * d, k.data());
}

void sample_qk_wishart(const Stream& s, std::int64_t n, std::int64_t d, std::vector<double>& q,
                       std::vector<double>& k) {
  q.resize(n * n);
  k.assign(n * n, 0.0);
  s.fill_normal(0, n * n, q.data());
  std::vector<double> z(n * n);
  const std::uint64_t offset = static_cast<std::uint64_t>(n * n + 1) / 2 * 2;
  s.fill_normal(offset, n * n, z.data());
  const std::uint64_t gamma_base = 2 * offset;  // past both normal blocks' indices
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < i; ++j) k[i * n + j] = z[i * n + j];
    k[i * n + i] = std::sqrt(2 * s.gamma(gamma_base + i, (d - i) / 2.0));  // χ²_ν = 2 Gamma(ν/2)
  }
}

void layer_norm_rows(std::vector<double>& x, std::int64_t n, std::int64_t d) {
  for (std::int64_t i = 0; i < n; ++i) {
    double* r = x.data() + i * d;
    double m = 0, v = 0;
    for (std::int64_t c = 0; c < d; ++c) m += r[c];
    m /= d;
    for (std::int64_t c = 0; c < d; ++c) v += (r[c] - m) * (r[c] - m);
    v /= d;
    const double inv = 1 / std::sqrt(v + 1e-5);
    for (std::int64_t c = 0; c < d; ++c) r[c] = (r[c] - m) * inv;
  }
}

const char* const kRowMetricNames[kRowMetrics] = {"top_p_95", "entropy", "max_weight", "participation"};

void row_metrics(const double* p, std::int64_t n, double* out, std::vector<double>& scratch) {
  scratch.assign(p, p + n);
  std::sort(scratch.begin(), scratch.end(), std::greater<double>());
  double cum = 0;
  std::int64_t count = n;
  for (std::int64_t j = 0; j < n; ++j) {
    cum += scratch[j];
    if (cum >= 0.95) {
      count = j + 1;
      break;
    }
  }
  double h = 0, s2 = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    if (p[j] > 0) h -= p[j] * std::log(p[j]);
    s2 += p[j] * p[j];
  }
  out[0] = static_cast<double>(count);
  out[1] = h;
  out[2] = scratch[0];
  out[3] = 1 / s2;
}

Bounds row_metric_bounds(int j, std::int64_t n) {
  const double nd = static_cast<double>(n);
  switch (j) {
    case 0: return {1, nd};             // top_p_95: at least the largest weight, at most every key
    case 1: return {0, std::log(nd)};   // entropy: one key, uniform
    case 2: return {1 / nd, 1};         // max_weight: uniform, one key
    default: return {1, nd};            // participation 1/Σp²: one key, uniform
  }
}

// E over r² ~ χ²_d of f(s r): Simpson's rule in r on [0, √(d + 40√(2d) + 40)] with 4000 panels,
// density of r = √χ²_d: 2r f_χ²(r²) = 2 exp((d − 1) ln r − r²/2 − (d/2) ln 2 − lnΓ(d/2)).
// A metric gets a theory only when σ's 99% quantile, s √χ²_{d,0.99} (Wilson–Hilferty:
// χ²_{d,p} ≈ d (1 − 2/(9d) + z_p √(2/(9d)))³), is inside that formula's range (theory.h: σ ≤ σ_c/2,
// σ_c/4 for participation); the hot formula is then used at every node, the 1% of mass past the
// quantile included (it is continuous there and the error it adds is that of the formula near its
// edge). Otherwise the entry is NaN: a row whose σ straddles the freezing point has no closed form.
double row_sigma_quantile(std::int64_t d, double scale, double p) {
  const double a = 2 / (9.0 * d), c = 1 - a + normal_quantile(p) * std::sqrt(a);
  return scale * std::sqrt(d * c * c * c);
}

void rem_row_theory(std::int64_t n, std::int64_t d, double scale, double fixed_sigma, double out[kRowMetrics]) {
  const double sc = theory::rem_sigma_c(n);
  double sigma_hi = fixed_sigma;
  if (fixed_sigma < 0) sigma_hi = row_sigma_quantile(d, scale, 0.99);
  // Which metrics get a theory is known before the quadrature: the nodes evaluate only those, and
  // none at all when every entry is NaN (e.g. no scaling at d >= 2 for N = 50). Φ⁻¹(0.95) is
  // computed once (rem_top_p_hot(n, σ, p) = n Φ(Φ⁻¹(p) − σ), the same expression node by node).
  const bool want_top_p = sigma_hi <= theory::kRemTopPMax * sc;
  const bool want_entropy = sigma_hi <= theory::kRemEntropyMax * sc;
  const bool want_participation = sigma_hi <= theory::kRemParticipationMax * sc;
  const double none = std::numeric_limits<double>::quiet_NaN();
  out[0] = out[1] = out[2] = out[3] = none;
  if (!want_top_p && !want_entropy && !want_participation) return;
  const double z95 = normal_quantile(0.95);
  auto point = [&](double sigma, double* acc, double w) {
    if (want_top_p) acc[0] += w * (n * normal_cdf(z95 - sigma));
    if (want_entropy) acc[1] += w * theory::rem_entropy_hot(n, sigma);
    if (want_participation) acc[3] += w * theory::rem_participation_hot(n, sigma);
  };
  double acc[kRowMetrics] = {0, 0, 0, 0};
  if (fixed_sigma >= 0) {
    point(fixed_sigma, acc, 1);
  } else {
    const double k = d / 2.0, lg = std::lgamma(k);
    const double rmax = std::sqrt(d + 40 * std::sqrt(2.0 * d) + 40);
    const int panels = 4000;
    const double h = rmax / panels;
    double total = 0;
    for (int i = 0; i <= panels; ++i) {
      const double r = i * h;
      const double w = (i == 0 || i == panels) ? 1 : (i % 2 ? 4 : 2);
      const double dens = r > 0 ? 2 * std::exp((d - 1) * std::log(r) - r * r / 2 - k * std::log(2.0) - lg)
                                : (d == 1 ? 2 * std::exp(-k * std::log(2.0) - lg) : 0);
      if (dens == 0) continue;
      total += w * dens;
      point(scale * r, acc, w * dens);
    }
    for (double& a : acc) a /= total;
  }
  if (want_top_p) out[0] = acc[0];
  if (want_entropy) out[1] = acc[1];
  if (want_participation) out[3] = acc[3];
}

}  // namespace attnscale::lab
