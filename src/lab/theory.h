// Closed forms the lab's measurements are compared with. Derivations in docs/lab.md.
#pragma once
#include <cstdint>

namespace attnscale::lab::theory {

// Independent q_i, k_i with mean mu and standard deviation sigma (Proposition 3 without zero means):
//   Var(q_i k_i) = E[q²] E[k²] − (E q E k)² = (σ² + μ²)² − μ⁴.
double var_product(double mu, double sigma);
// q·k over d such pairs (Proposition 4): mean d μ², variance d ((σ² + μ²)² − μ⁴).
double mean_dot(std::int64_t d, double mu, double sigma, double rho);
// With correlation ρ between q_i and k_i (μ = 0): E[q_i k_i] = ρσ², and for jointly Gaussian pairs
// E[q²k²] = σ⁴(1 + 2ρ²), so Var(q_i k_i) = σ⁴(1 + ρ²) and Var(q·k) = d σ⁴ (1 + ρ²).
// This function covers ρ = 0 (any μ) and ρ ≠ 0 with μ = 0 for Gaussian components;
// var_dot_general handles any kurtosis.
double var_dot(std::int64_t d, double mu, double sigma, double rho);
// Any standardised component distribution with kurtosis κ, the construction q = a,
// k = ρa + √(1−ρ²) b (μ = 0, σ = 1): E[q²k²] = ρ²κ + (1 − ρ²) and E[q k] = ρ,
// so Var(q_i k_i) = 1 + ρ²(κ − 2) (Gaussian κ = 3: 1 + ρ²).
double var_dot_general(std::int64_t d, double rho, double kurtosis);
// Kurtosis of q·k for independent zero-mean unit-variance q_i, k_i with kurtoses κ_q, κ_k:
// each product has E[(qk)^4] = κ_q κ_k, and a sum of d i.i.d. terms has kurtosis 3 + (κ − 3)/d.
double kurtosis_dot(std::int64_t d, double kappa_q, double kappa_k);

// Random Energy Model for a row of N logits x_j = σ z_j, z_j i.i.d. N(0, 1), weights p = softmax(x).
// Freezing point σ_c = √(2 ln N).
double rem_sigma_c(std::int64_t n);
// Entropy −Σ p ln p:  σ < σ_c: ln N − σ²/2 (annealed: ln Z ≈ ln N + σ²/2, Σ p x ≈ σ²);
//                     σ ≥ σ_c: ψ(1) − ψ(1 − m), m = σ_c/σ (Poisson-Dirichlet PD(m, 0) weights),
//                     capped at ln N (it diverges as σ → σ_c+, where N = ∞ asymptotics fail).
double rem_entropy(std::int64_t n, double sigma);
// 1 / E[Σ p²]:  σ < σ_c: N e^{−σ²} (capped at N);  σ ≥ σ_c: 1 / (1 − m).
double rem_participation(std::int64_t n, double sigma);
// top_p_95 in the annealed (σ < σ_c) phase: the keys above z* with ∫_{z*} e^{σz} φ = 0.95 ∫ e^{σz} φ,
// i.e. z* = σ − Φ^{-1}(0.95), hold 95% of the mass; their count is N Φ(Φ^{-1}(0.95) − σ).
// Returns a negative number in the frozen phase (no closed form there).
double rem_top_p(std::int64_t n, double sigma, double p);

double digamma(double x);

}  // namespace attnscale::lab::theory
