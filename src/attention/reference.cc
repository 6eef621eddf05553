// The float64 reference: naive, short, and the ground truth of every test.
//
// Per (batch b, query head h), with g = Hq/Hkv and kv head h/g:
//   S = Q Kᵀ · s + bias   (bias: 0, an additive mask value, or -inf where masked)
//   P = softmax over each row (over keys);  O = P V;  lse_i = log Σ_j exp(S_ij)
// Backward (dO given): dV = Pᵀ dO;  dP = dO Vᵀ;  dS = P ∘ (dP − rowsum(P ∘ dP));
//   dQ = s · dS K;  dK = s · dSᵀ Q   (dK, dV summed over the g query heads sharing a kv head).
#include <cmath>
#include <vector>

#include "attention/params.h"
#include "common/memory.h"

namespace attnscale::reference {
namespace {
using detail::Params;
using detail::put;
constexpr auto get = detail::value<double>;

// P for head (b, h) as an Nq × Nkv row-major matrix, which entries are visible (not masked), and
// lse per row. A row with no visible key is all zeros with lse = -inf; a NaN score makes its whole
// row NaN. Masked entries are never read again, so a NaN behind a mask stays hidden.
void probabilities(const Params& p, std::int64_t b, std::int64_t h, std::vector<double>& P,
                   std::vector<char>& visible_all, std::vector<double>& lse) {
  const std::int64_t kh = p.kv_head(h);
  P.assign(p.Nq * p.Nkv, 0.0);
  visible_all.assign(p.Nq * p.Nkv, 0);
  lse.assign(p.Nq, -INFINITY);
  for (std::int64_t i = 0; i < p.Nq; ++i) {
    double* row = &P[i * p.Nkv];
    char* visible = &visible_all[i * p.Nkv];
    const auto range = detail::key_range(p, i);
    double m = -INFINITY;
    bool any = false;
    for (std::int64_t j = range.lo; j < range.hi; ++j) {
      const double bias = detail::mask_bias(p, b, h, i, j);
      if (bias == -INFINITY) continue;
      double dot = 0;
      for (std::int64_t c = 0; c < p.dk; ++c) dot += get(p.q, b, h, i, c) * get(p.k, b, kh, j, c);
      row[j] = dot * p.scale + bias;
      visible[j] = 1;
      any = true;
      if (row[j] > m) m = row[j];
    }
    if (!any) continue;
    double l = 0;
    for (std::int64_t j = 0; j < p.Nkv; ++j) l += visible[j] ? (row[j] = std::exp(row[j] - m)) : 0.0;
    for (std::int64_t j = 0; j < p.Nkv; ++j) row[j] /= l;
    lse[i] = m + std::log(l);
  }
}

// The reference holds one head's Nq × Nkv probabilities (double) and visibility flags at once.
void check_score_matrix(const Params& p) {
  detail::check_allocation("reference: one head's " + std::to_string(p.Nq) + " x " + std::to_string(p.Nkv) +
                               " score matrix",
                           9.0 * static_cast<double>(p.Nq) * static_cast<double>(p.Nkv));
}
}  // namespace

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outputs,
             const Options& options) {
  const Params p = detail::make_forward_params(q, k, v, outputs, options, detail::Kernel::reference);
  check_score_matrix(p);
  std::vector<double> P, lse;
  std::vector<char> vis;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.Hq; ++h) {
      probabilities(p, b, h, P, vis, lse);
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        for (std::int64_t c = 0; c < p.dv; ++c) {
          double o = 0;
          for (std::int64_t j = 0; j < p.Nkv; ++j)
            if (vis[i * p.Nkv + j]) o += P[i * p.Nkv + j] * get(p.v, b, p.kv_head(h), j, c);
          put(p.out, b, h, i, c, o);
        }
        if (!p.lse.empty()) put(p.lse, b, h, i, 0, lse[i]);
        if (!p.probs.empty())
          for (std::int64_t j = 0; j < p.Nkv; ++j)
            put(p.probs, b, h, i, j, P[i * p.Nkv + j]);
      }
    }
}

void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
              const Gradients& grads, const Options& options) {
  const auto p = detail::make_backward_params(q, k, v, {}, {}, dout, grads, options,
                                              detail::Kernel::reference);
  check_score_matrix(p);
  std::vector<double> P, lse;
  std::vector<char> vis;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.Hkv; ++kh) {
      std::vector<double> dK(p.Nkv * p.dk, 0.0), dV(p.Nkv * p.dv, 0.0);
      for (std::int64_t h = kh * p.group(); h < (kh + 1) * p.group(); ++h) {
        probabilities(p, b, h, P, vis, lse);
        for (std::int64_t i = 0; i < p.Nq; ++i) {
          std::vector<double> dS(p.Nkv, 0.0);
          double D = 0;  // rowsum(P ∘ dP)
          for (std::int64_t j = 0; j < p.Nkv; ++j) {
            const double pij = P[i * p.Nkv + j];
            if (!vis[i * p.Nkv + j]) continue;
            double dP = 0;
            for (std::int64_t c = 0; c < p.dv; ++c) {
              const double g = get(p.dO, b, h, i, c);
              dP += g * get(p.v, b, kh, j, c);
              dV[j * p.dv + c] += pij * g;
            }
            dS[j] = pij * dP;
            D += dS[j];
          }
          for (std::int64_t j = 0; j < p.Nkv; ++j) dS[j] -= P[i * p.Nkv + j] * D;
          for (std::int64_t c = 0; c < p.dk; ++c) {
            double dq = 0;
            for (std::int64_t j = 0; j < p.Nkv; ++j) {
              if (!vis[i * p.Nkv + j]) continue;
              dq += dS[j] * get(p.k, b, kh, j, c);
              dK[j * p.dk + c] += p.scale * dS[j] * get(p.q, b, h, i, c);
            }
            put(p.dQ, b, h, i, c, p.scale * dq);
          }
        }
      }
      for (std::int64_t j = 0; j < p.Nkv; ++j) {
        for (std::int64_t c = 0; c < p.dk; ++c) put(p.dK, b, kh, j, c, dK[j * p.dk + c]);
        for (std::int64_t c = 0; c < p.dv; ++c) put(p.dV, b, kh, j, c, dV[j * p.dv + c]);
      }
    }
}

}  // namespace attnscale::reference
