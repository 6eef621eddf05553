// Pieces shared by the experiments that look at attention rows (saturation, length, heatmap,
// gradients): sampling Q and K, running the engine for the probability matrix, per-row metrics.
//
// Shapes: Q [N, dq], K [N, dq] row-major; probs [N, N] (row i: query i over the N keys).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lab/rng.h"

namespace attnscale::lab {

// probs = softmax(Q Kᵀ · scale) by attnscale::forward (float64, one thread: callers parallelise).
void attention_probs(const std::vector<double>& q, const std::vector<double>& k, std::int64_t n,
                     std::int64_t dq, double scale, std::vector<double>& probs);
// The same with nq queries over nk keys: probs [nq, nk].
void attention_probs(const std::vector<double>& q, const std::vector<double>& k, std::int64_t nq,
                     std::int64_t nk, std::int64_t dq, double scale, std::vector<double>& probs);

// The Simulation note's direct sampler: Q and K with i.i.d. N(0, 1) entries, [n, d] each.
void sample_qk_direct(const Stream& s, std::int64_t n, std::int64_t d, std::vector<double>& q,
                      std::vector<double>& k);

// For d >= n, Q Kᵀ has the law of Z Aᵀ with Z [n, n] i.i.d. N(0,1) and A [n, n] the Bartlett factor
// of a Wishart_n(d, I) matrix: given K, the rows of Q Kᵀ are i.i.d. N(0, K Kᵀ), and K Kᵀ ~ W_n(d, I)
// = A Aᵀ with A lower triangular, A_ii = sqrt(χ²_{d−i}) (i = 0..n−1), A_ij ~ N(0,1) for i > j.
// Exact in distribution for Gaussian entries, at cost O(n³) instead of O(n² d). q, k become [n, n].
void sample_qk_wishart(const Stream& s, std::int64_t n, std::int64_t d, std::vector<double>& q,
                       std::vector<double>& k);

// LayerNorm without affine parameters over each row of x [n, d]: (x − mean) / sqrt(var + 1e-5).
void layer_norm_rows(std::vector<double>& x, std::int64_t n, std::int64_t d);

// Saturation metrics of one probability row p[0..n):
//   top_p_95      the Simulation note: sort descending, the smallest count whose cumulative sum reaches 0.95
//   entropy       −Σ p ln p (nats)
//   max_weight    max p
//   participation 1 / Σ p²
inline constexpr int kRowMetrics = 4;
extern const char* const kRowMetricNames[kRowMetrics];
void row_metrics(const double* p, std::int64_t n, double* out, std::vector<double>& scratch);
// The range of metric j over rows of n keys, which its mean's interval stays in (stats.h
// bounded_mean_ci): top_p_95 and participation [1, n], entropy [0, ln n], max_weight [1/n, 1].
struct Bounds {
  double lo, hi;
};
Bounds row_metric_bounds(int j, std::int64_t n);

// REM theory of each metric for a row whose logits are σ z with σ² = s² |q|² and |q|² ~ σ_q² χ²_d
// (conditional on q the logits are exactly Gaussian): the REM formulas of theory.h averaged over
// the χ²_d law of |q|² by quadrature. `fixed_sigma` >= 0 skips the average (LayerNorm'd q).
// Entries: top_p_95, entropy, participation theory (max_weight has none): NaN where none, i.e. where
// σ's 99% quantile leaves the range in which the formula is accurate at finite N (theory.h).
void rem_row_theory(std::int64_t n, std::int64_t d, double scale, double fixed_sigma, double out[kRowMetrics]);

// The p-quantile of a row's logit σ = s |q| with |q|² ~ χ²_d: s √χ²_{d,p}, the χ² quantile by
// Wilson–Hilferty, d (1 − 2/(9d) + z_p √(2/(9d)))³. rem_row_theory gives a metric a theory only
// when the 0.99 quantile is inside the metric's range; gradients does the same.
double row_sigma_quantile(std::int64_t d, double scale, double p);

}  // namespace attnscale::lab
