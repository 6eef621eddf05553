#include "lab/theory.h"

#include <algorithm>
#include <cmath>

#include "lab/stats.h"

namespace attnscale::lab::theory {

double var_product(double mu, double sigma) {
  const double m2 = sigma * sigma + mu * mu;
  return m2 * m2 - mu * mu * mu * mu;
}

double mean_dot(std::int64_t d, double mu, double sigma, double rho) {
  return static_cast<double>(d) * (mu * mu + rho * sigma * sigma);
}

double var_dot(std::int64_t d, double mu, double sigma, double rho) {
  if (rho == 0) return static_cast<double>(d) * var_product(mu, sigma);
  return static_cast<double>(d) * std::pow(sigma, 4) * (1 + rho * rho);
}

// E[q²k²] with k = ρa + √(1−ρ²) b: E[a²(ρ²a² + 2ρ√(1−ρ²) ab + (1−ρ²) b²)] = ρ²κ + (1−ρ²)
// (E[a³b] = 0); minus (E qk)² = ρ²: Var(q_i k_i) = 1 + ρ²(κ − 2).
double var_dot_general(std::int64_t d, double rho, double kurtosis) {
  return static_cast<double>(d) * (1 + rho * rho * (kurtosis - 2));
}

double kurtosis_dot(std::int64_t d, double kappa_q, double kappa_k) {
  return 3 + (kappa_q * kappa_k - 3) / static_cast<double>(d);
}

double rem_sigma_c(std::int64_t n) { return std::sqrt(2 * std::log(static_cast<double>(n))); }

double rem_entropy(std::int64_t n, double sigma) {
  const double sc = rem_sigma_c(n);
  if (sigma < sc) return std::log(static_cast<double>(n)) - sigma * sigma / 2;
  return std::min(digamma(1) - digamma(1 - sc / sigma), std::log(static_cast<double>(n)));
}

double rem_participation(std::int64_t n, double sigma) {
  const double sc = rem_sigma_c(n);
  if (sigma < sc) return std::min<double>(n, n * std::exp(-sigma * sigma));
  return 1 / (1 - sc / sigma);
}

double rem_top_p(std::int64_t n, double sigma, double p) {
  if (sigma >= rem_sigma_c(n)) return -1;
  return n * normal_cdf(normal_quantile(p) - sigma);
}

// ψ(x): recurrence ψ(x) = ψ(x+1) − 1/x up to x ≥ 10, then the asymptotic series
// ψ(x) ≈ ln x − 1/(2x) − 1/(12x²) + 1/(120x⁴) − 1/(252x⁶).
double digamma(double x) {
  double r = 0;
  while (x < 10) {
    r -= 1 / x;
    x += 1;
  }
  const double f = 1 / (x * x);
  return r + std::log(x) - 0.5 / x - f * (1.0 / 12 - f * (1.0 / 120 - f / 252));
}

}  // namespace attnscale::lab::theory
