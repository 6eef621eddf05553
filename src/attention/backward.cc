// backward(): gradients by recomputation from q, k, v, out, lse and dO.
//
// Forward (per row i):  s_ij = s · q_i·k_j + bias_ij;  p_ij = exp(s_ij − lse_i);  o_i = Σ_j p_ij v_j.
// Backward:  dV_j += p_ij dO_i;  dp_ij = dO_i·v_j;  D_i = Σ_j p_ij dp_ij = dO_i·o_i;
//            ds_ij = p_ij (dp_ij − D_i);  dQ_i = s Σ_j ds_ij k_j;  dK_j += s ds_ij q_i.
// One task per (batch, kv head) owns that head's dK and dV and walks its query heads and rows in
// a fixed order: no atomics, the same result for any thread count.
#include <cmath>
#include <vector>

#include "attention/params.h"
#include "attnscale/error.h"
#include "common/parallel.h"

namespace attnscale {
namespace detail {
namespace {

template <class T>
void backward_head(const BackwardParams& p, std::int64_t b, std::int64_t kh) {
  std::vector<T> dK(p.Nkv * p.dk, T(0)), dV(p.Nkv * p.dv, T(0)), dq(p.dk);
  const T scale = static_cast<T>(p.scale);
  for (std::int64_t h = kh * p.group(); h < (kh + 1) * p.group(); ++h)
    for (std::int64_t i = 0; i < p.Nq; ++i) {
      const T* q = at<const T>(p.q, b, h, i);
      const T* dO = at<const T>(p.dO, b, h, i);
      const T* o = at<const T>(p.out, b, h, i);
      const T lse = static_cast<T>(load(p.lse, element(p.lse, b, h, i, 0)));
      std::fill(dq.begin(), dq.end(), T(0));
      T D = 0;
      for (std::int64_t c = 0; c < p.dv; ++c) D += dO[c * p.dO.strides[3]] * o[c * p.out.strides[3]];
      const auto range = key_range(p, i);
      for (std::int64_t j = range.lo; lse != -INFINITY && j < range.hi; ++j) {
        const double bias = mask_bias(p, b, h, i, j);
        if (bias == -INFINITY) continue;
        const T* k = at<const T>(p.k, b, kh, j);
        const T* v = at<const T>(p.v, b, kh, j);
        T dot = 0, dp = 0;
        for (std::int64_t c = 0; c < p.dk; ++c) dot += q[c * p.q.strides[3]] * k[c * p.k.strides[3]];
        const T pij = std::exp(dot * scale + static_cast<T>(bias) - lse);
        for (std::int64_t c = 0; c < p.dv; ++c) {
          dp += dO[c * p.dO.strides[3]] * v[c * p.v.strides[3]];
          dV[j * p.dv + c] += pij * dO[c * p.dO.strides[3]];
        }
        const T ds = pij * (dp - D) * scale;
        for (std::int64_t c = 0; c < p.dk; ++c) {
          dq[c] += ds * k[c * p.k.strides[3]];
          dK[j * p.dk + c] += ds * q[c * p.q.strides[3]];
        }
      }
      T* out = at<T>(p.dQ, b, h, i);
      for (std::int64_t c = 0; c < p.dk; ++c) out[c * p.dQ.strides[3]] = dq[c];
    }
  for (std::int64_t j = 0; j < p.Nkv; ++j) {
    T* gk = at<T>(p.dK, b, kh, j);
    T* gv = at<T>(p.dV, b, kh, j);
    for (std::int64_t c = 0; c < p.dk; ++c) gk[c * p.dK.strides[3]] = dK[j * p.dk + c];
    for (std::int64_t c = 0; c < p.dv; ++c) gv[c * p.dV.strides[3]] = dV[j * p.dv + c];
  }
}

template <class T>
void backward_all(const BackwardParams& p) {
  const std::int64_t tasks = p.B * p.Hkv;
  parallel_for(tasks, 1, resolve_threads(p.threads, tasks), [&](std::int64_t t0, std::int64_t t1, int) {
    for (std::int64_t t = t0; t < t1; ++t) backward_head<T>(p, t / p.Hkv, t % p.Hkv);
  });
}

}  // namespace
}  // namespace detail

void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& lse, const TensorView& dout, const Gradients& grads,
              const Options& options) {
  const auto p = detail::make_backward_params(q, k, v, out, lse, dout, grads, options, detail::Kernel::fast);
  switch (p.dtype) {
    case DType::f32: detail::backward_all<float>(p); break;
    case DType::f64: detail::backward_all<double>(p); break;
    default: throw Error("q: dtype " + std::string(dtype_name(p.dtype)) + " is not supported by backward");
  }
}

}  // namespace attnscale
