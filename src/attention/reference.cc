// The float64 reference: naive, short, and the ground truth of every test.
//
// Per (batch b, query head h), with g = Hq/Hkv and kv head h/g:
//   x = s·Q Kᵀ;  S = cap(x) − slope_bh·|diag(i) − j| + bias   (cap(x) = c·tanh(x/c); bias: 0, an
//       additive mask value, or -inf where masked)
//   P = softmax over each row, with the sink σ_h in the normaliser: P_ij = e^{S_ij} / (e^{σ_h} + Σ_j e^{S_ij});
//   lse_i = log(e^{σ_h} + Σ_j e^{S_ij});  O = (Z ∘ P / (1 − p)) V   (Z: the dropout mask, 1 without dropout)
// Backward (dO given): dV = (Z∘P/(1−p))ᵀ dO;  dP = Z∘(dO Vᵀ)/(1−p);  D = rowsum(P ∘ dP) (= dO·o);
//   dS = P ∘ (dP − D) (= dbias);  dX = dS ∘ (1 − tanh²(x/c));  dQ = s · dX K;  dK = s · dXᵀ Q
//   (dK, dV summed over the g query heads sharing a kv head);  dσ_h = −Σ_{b,i} e^{σ_h − lse_i}·D_i.
#include <cmath>
#include <vector>

#include "attention/forward_scratch.h"
#include "attention/params.h"
#include "attention/score_transforms.h"
#include "attention/varlen.h"
#include "common/memory.h"

namespace attnscale::reference {
namespace {
using detail::Params;
using detail::put;
constexpr auto get = detail::value<double>;

// P for head (b, h) as an Nq × Nkv row-major matrix, which entries are visible (not masked), lse
// per row and the soft-capping factor 1 − tanh²(x/c) per entry. A row with no visible key is all
// zeros with lse = -inf (or the sink); a NaN score makes its whole row NaN. Masked entries are
// never read again, so a NaN behind a mask stays hidden.
void probabilities(const Params& p, std::int64_t b, std::int64_t h, std::vector<double>& P,
                   std::vector<char>& visible_all, std::vector<double>& lse, std::vector<double>& dcap) {
  const std::int64_t kh = p.kv_head(h);
  P.assign(p.Nq * p.Nkv, 0.0);
  dcap.assign(p.Nq * p.Nkv, 1.0);
  visible_all.assign(p.Nq * p.Nkv, 0);
  lse.assign(p.Nq, -INFINITY);
  const double sink = p.sinks.empty() ? -INFINITY : detail::sink_logit(p, h);
  const double slope = detail::alibi_slope(p, b, h);
  for (std::int64_t i = 0; i < p.Nq; ++i) {
    double* row = &P[i * p.Nkv];
    char* visible = &visible_all[i * p.Nkv];
    const auto range = detail::key_range(p, i);
    double m = sink;
    bool any = !p.sinks.empty();
    for (std::int64_t j = range.lo; j < range.hi; ++j) {
      const double bias = detail::mask_bias(p, b, h, i, j);
      if (bias == -INFINITY) continue;
      double x = 0;
      for (std::int64_t c = 0; c < p.dk; ++c) x += get(p.q, b, h, i, c) * get(p.k, b, kh, j, c);
      x *= p.scale;
      if (p.softcap > 0) {
        const double t = std::tanh(x / p.softcap);
        x = p.softcap * t;
        dcap[i * p.Nkv + j] = 1 - t * t;
      }
      row[j] = x - slope * std::abs(static_cast<double>(i + p.diag_offset() - j)) + bias;
      visible[j] = 1;
      any = true;
      if (row[j] > m) m = row[j];
    }
    if (!any) continue;
    double l = p.sinks.empty() ? 0.0 : std::exp(sink - m);
    for (std::int64_t j = 0; j < p.Nkv; ++j) l += visible[j] ? (row[j] = std::exp(row[j] - m)) : 0.0;
    for (std::int64_t j = 0; j < p.Nkv; ++j) row[j] /= l;
    lse[i] = m + std::log(l);
  }
}

// Z_ij / (1 − p) for every entry of head (b, h): the dropout factor, 1 without dropout.
std::vector<double> dropout_factors(const Params& p, std::int64_t b, std::int64_t h) {
  std::vector<double> z(p.Nq * p.Nkv, 1.0);
  if (!p.has_dropout()) return z;
  const detail::DropoutMask mask(p);
  for (std::int64_t i = 0; i < p.Nq; ++i)
    for (std::int64_t j = 0; j < p.Nkv; ++j) z[i * p.Nkv + j] = mask.keep(b, h, i, j) ? mask.keep_scale() : 0.0;
  return z;
}

void forward_params(const Params& p) {
  detail::check_reference_scratch(p.Nq, p.Nkv);  // one head's score matrices, held at once
  std::vector<double> P, lse, dcap;
  std::vector<char> vis;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.Hq; ++h) {
      probabilities(p, b, h, P, vis, lse, dcap);
      const std::vector<double> z = dropout_factors(p, b, h);
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        for (std::int64_t c = 0; c < p.dv; ++c) {
          double o = 0;
          for (std::int64_t j = 0; j < p.Nkv; ++j)
            if (vis[i * p.Nkv + j]) o += z[i * p.Nkv + j] * P[i * p.Nkv + j] * get(p.v, b, p.kv_head(h), j, c);
          put(p.out, b, h, i, c, o);
        }
        if (!p.lse.empty()) put(p.lse, b, h, i, 0, lse[i]);
        if (!p.probs.empty())
          for (std::int64_t j = 0; j < p.Nkv; ++j)
            put(p.probs, b, h, i, j, z[i * p.Nkv + j] == 0.0 ? -P[i * p.Nkv + j] : P[i * p.Nkv + j]);
      }
    }
}

void backward_params(const detail::BackwardParams& p) {
  detail::check_reference_scratch(p.Nq, p.Nkv);  // one head's score matrices, held at once
  std::vector<double> P, lse, dcap, dsinks(p.Hq, 0.0);
  std::vector<char> vis;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.Hkv; ++kh) {
      std::vector<double> dK(p.Nkv * p.dk, 0.0), dV(p.Nkv * p.dv, 0.0);
      for (std::int64_t h = kh * p.group(); h < (kh + 1) * p.group(); ++h) {
        probabilities(p, b, h, P, vis, lse, dcap);
        const std::vector<double> z = dropout_factors(p, b, h);
        for (std::int64_t i = 0; i < p.Nq; ++i) {
          std::vector<double> dS(p.Nkv, 0.0);
          double D = 0;  // rowsum(P ∘ dP)
          for (std::int64_t j = 0; j < p.Nkv; ++j) {
            const double pij = P[i * p.Nkv + j], zij = z[i * p.Nkv + j];
            if (!vis[i * p.Nkv + j]) continue;
            double dP = 0;
            for (std::int64_t c = 0; c < p.dv; ++c) {
              const double g = get(p.dO, b, h, i, c);
              dP += g * get(p.v, b, kh, j, c);
              dV[j * p.dv + c] += zij * pij * g;
            }
            dS[j] = pij * zij * dP;
            D += dS[j];
          }
          if (!p.dLse.empty()) D -= get(p.dLse, b, h, i, 0);  // ∂lse_i/∂t_ij = P_ij
          for (std::int64_t j = 0; j < p.Nkv; ++j) dS[j] -= P[i * p.Nkv + j] * D;
          if (!p.sinks.empty()) dsinks[h] -= std::exp(detail::sink_logit(p, h) - lse[i]) * D;
          if (!p.dBias.empty())
            for (std::int64_t j = 0; j < p.Nkv; ++j) put(p.dBias, b, h, i, j, dS[j]);
          for (std::int64_t j = 0; j < p.Nkv; ++j) dS[j] *= dcap[i * p.Nkv + j];
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
  if (!p.dSinks.empty())
    for (std::int64_t h = 0; h < p.Hq; ++h) detail::store(p.dSinks, detail::element1(p.dSinks, h), dsinks[h]);
}

}  // namespace

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outputs,
             const Options& options) {
  if (detail::is_varlen(options)) return detail::varlen_forward(q, k, v, outputs, options, detail::Kernel::reference);
  forward_params(detail::make_forward_params(q, k, v, outputs, options, detail::Kernel::reference));
}

void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
              const Gradients& grads, const Options& options) {
  if (detail::is_varlen(options))
    return detail::varlen_backward(q, k, v, {}, {}, dout, grads, options, detail::Kernel::reference);
  backward_params(detail::make_backward_params(q, k, v, {}, {}, dout, grads, options, detail::Kernel::reference));
}

}  // namespace attnscale::reference

namespace attnscale::detail {

// What probabilities() and dropout_factors() hold for one head: P, dcap and z (double), visible
// (char), Nq × Nkv each, and lse (double) per row.
double reference_scratch_bytes(std::int64_t Nq, std::int64_t Nkv) {
  return (3 * sizeof(double) + sizeof(char)) * static_cast<double>(Nq) * static_cast<double>(Nkv) +
         sizeof(double) * static_cast<double>(Nq);
}

void check_reference_scratch(std::int64_t Nq, std::int64_t Nkv) {
  check_allocation([&] { return "reference: one head's " + std::to_string(Nq) + " x " + std::to_string(Nkv) + " score matrix"; },
                   reference_scratch_bytes(Nq, Nkv));
}

void run_reference_forward(const Params& p) { reference::forward_params(p); }
void run_reference_backward(const BackwardParams& p) { reference::backward_params(p); }
}  // namespace attnscale::detail
