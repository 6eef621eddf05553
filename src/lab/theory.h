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
//
// Only the hot-phase (annealed) formulas are given, and only where they are accurate at the
// N = 8…4096 the lab uses; elsewhere these functions return NaN (no theory). The N = ∞ frozen-phase
// law (Poisson–Dirichlet PD(m, 0), m = σ_c/σ: E H = ψ(1) − ψ(1 − m)) is NOT used: its entropy
// diverges as σ → σ_c+ while the hot one goes to 0 there, and even at σ = 2…4 σ_c it is 18–70% high
// at N = 8…4096 (scripts/rem_finite_n.py, docs/lab.md), so an average over σ would mix two wrong branches.
double rem_sigma_c(std::int64_t n);
// Largest σ/σ_c at which each formula is used: entropy and top_p_95 within 0.16 nats / 4% of N
// there (measured: docs/lab.md), participation within 8% (its annealed form fails first, because
// Σp² = Σe^{2x}/Z² freezes at 2σ = σ_c and E[1/Σp²] > 1/E[Σp²]).
inline constexpr double kRemEntropyMax = 0.5, kRemTopPMax = 0.5, kRemParticipationMax = 0.25;
// Entropy −Σ p ln p = ln N − σ²/2 (annealed: ln Z ≈ ln N + σ²/2, Σ p x ≈ σ²) for σ ≤ σ_c/2, else NaN.
double rem_entropy(std::int64_t n, double sigma);
// Participation 1/Σ p² ≈ 1/E[Σp²] = N e^{−σ²} (capped at N) for σ ≤ σ_c/4, else NaN.
double rem_participation(std::int64_t n, double sigma);
// top_p_95 in the hot phase: the keys above z* with ∫_{z*} e^{σz} φ = p ∫ e^{σz} φ, i.e.
// z* = σ − Φ^{-1}(p), hold a fraction p of the mass; their count is N Φ(Φ^{-1}(p) − σ) (the measured
// integer count sits ≈ 0.5 above it). For σ ≤ σ_c/2, else NaN.
double rem_top_p(std::int64_t n, double sigma, double p);
// The same three without the range check (for quadrature nodes in the tail of a valid average).
double rem_entropy_hot(std::int64_t n, double sigma);
double rem_participation_hot(std::int64_t n, double sigma);
double rem_top_p_hot(std::int64_t n, double sigma, double p);

}  // namespace attnscale::lab::theory
