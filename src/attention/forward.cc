// forward(): the public entry point of the fast path.
//
// Engine v0: one row at a time, scores in a per-thread row buffer of Nkv values (never the
// Nq × Nkv matrix), a max-subtracted softmax accumulated in the input precision:
//   m = max_j s_ij;  l = Σ_j exp(s_ij − m);  o_i = Σ_j exp(s_ij − m) v_j / l;  lse_i = m + log l.
// Subtracting m keeps every exponent ≤ 0, so logits of any size neither overflow nor give NaN.
#include <cmath>
#include <vector>

#include "attention/params.h"
#include "attnscale/error.h"
#include "common/parallel.h"

namespace attnscale {
namespace detail {
namespace {

template <class T>
void forward_row(const Params& p, std::int64_t b, std::int64_t h, std::int64_t i, std::vector<T>& s) {
  const std::int64_t kh = p.kv_head(h);
  const T* q = at<const T>(p.q, b, h, i);
  const auto range = key_range(p, i);
  const T scale = static_cast<T>(p.scale);
  T m = -INFINITY;
  std::int64_t visible = 0;
  for (std::int64_t j = range.lo; j < range.hi; ++j) {
    const double bias = mask_bias(p, b, h, i, j);
    if (bias == -INFINITY) {
      s[j] = -INFINITY;
      continue;
    }
    const T* k = at<const T>(p.k, b, kh, j);
    T dot = 0;
    for (std::int64_t c = 0; c < p.dk; ++c) dot += q[c * p.q.strides[3]] * k[c * p.k.strides[3]];
    s[j] = dot * scale + static_cast<T>(bias);
    ++visible;
    if (s[j] > m) m = s[j];
  }
  T* o = at<T>(p.out, b, h, i);
  for (std::int64_t c = 0; c < p.dv; ++c) o[c * p.out.strides[3]] = 0;
  if (visible == 0) {  // every key masked: out = 0, lse = -inf, probs = 0 (never NaN)
    if (!p.lse.empty()) store(p.lse, element(p.lse, b, h, i, 0), -INFINITY);
    if (!p.probs.empty())
      for (std::int64_t j = 0; j < p.Nkv; ++j) store(p.probs, element(p.probs, b, h, i, j), 0.0);
    return;
  }
  T l = 0;
  for (std::int64_t j = range.lo; j < range.hi; ++j) {
    if (s[j] == -INFINITY) continue;  // masked: its v_j is never read
    const T e = std::exp(s[j] - m);
    s[j] = e;
    l += e;
    const T* v = at<const T>(p.v, b, kh, j);
    for (std::int64_t c = 0; c < p.dv; ++c) o[c * p.out.strides[3]] += e * v[c * p.v.strides[3]];
  }
  const T inv = T(1) / l;
  for (std::int64_t c = 0; c < p.dv; ++c) o[c * p.out.strides[3]] *= inv;
  if (!p.lse.empty()) store(p.lse, element(p.lse, b, h, i, 0), static_cast<double>(m + std::log(l)));
  if (!p.probs.empty())
    for (std::int64_t j = 0; j < p.Nkv; ++j) {
      const bool shown = j >= range.lo && j < range.hi && s[j] != -INFINITY;
      store(p.probs, element(p.probs, b, h, i, j), shown ? static_cast<double>(s[j] * inv) : 0.0);
    }
}

template <class T>
void forward_all(const Params& p) {
  const std::int64_t rows = p.B * p.Hq * p.Nq;
  const int threads = resolve_threads(p.threads, rows);
  std::vector<std::vector<T>> scratch(threads, std::vector<T>(p.Nkv));
  parallel_for(rows, 16, threads, [&](std::int64_t r0, std::int64_t r1, int t) {
    for (std::int64_t r = r0; r < r1; ++r)
      forward_row<T>(p, r / (p.Hq * p.Nq), (r / p.Nq) % p.Hq, r % p.Nq, scratch[t]);
  });
}

}  // namespace
}  // namespace detail

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outputs,
             const Options& options) {
  const detail::Params p = detail::make_forward_params(q, k, v, outputs, options, detail::Kernel::fast);
  switch (p.dtype) {
    case DType::f32: detail::forward_all<float>(p); break;
    case DType::f64: detail::forward_all<double>(p); break;
    default: throw Error("q: dtype " + std::string(dtype_name(p.dtype)) + " is not supported by forward");
  }
}

}  // namespace attnscale
