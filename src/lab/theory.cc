#include "lab/theory.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lab/stats.h"

namespace attnscale::lab::theory {

// (σ² + μ²)² − μ⁴ = σ²(σ² + 2μ²), in the form without cancellation (for σ ≪ |μ| the difference of
// the two fourth powers kept none of σ's digits).
double var_product(double mu, double sigma) { return sigma * sigma * (sigma * sigma + 2 * mu * mu); }

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

double rem_entropy_hot(std::int64_t n, double sigma) {
  return std::log(static_cast<double>(n)) - sigma * sigma / 2;
}

double rem_participation_hot(std::int64_t n, double sigma) {
  return std::min<double>(n, n * std::exp(-sigma * sigma));
}

double rem_top_p_hot(std::int64_t n, double sigma, double p) {
  return n * normal_cdf(normal_quantile(p) - sigma);
}

double rem_entropy(std::int64_t n, double sigma) {
  if (sigma > kRemEntropyMax * rem_sigma_c(n)) return std::numeric_limits<double>::quiet_NaN();
  return rem_entropy_hot(n, sigma);
}

double rem_participation(std::int64_t n, double sigma) {
  if (sigma > kRemParticipationMax * rem_sigma_c(n)) return std::numeric_limits<double>::quiet_NaN();
  return rem_participation_hot(n, sigma);
}

double rem_top_p(std::int64_t n, double sigma, double p) {
  if (sigma > kRemTopPMax * rem_sigma_c(n)) return std::numeric_limits<double>::quiet_NaN();
  return rem_top_p_hot(n, sigma, p);
}

}  // namespace attnscale::lab::theory
