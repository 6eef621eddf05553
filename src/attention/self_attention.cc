// Self-attention from X and projection matrices (Chuang (2023)), and multi-head attention (the Simulation note).
#include "attnscale/self_attention.h"

#include <string>

#include "attnscale/error.h"

namespace attnscale {
namespace {

void check_matrix(const char* name, const TensorView& t, DType dtype) {
  if (t.data == nullptr) throw Error(std::string(name) + ": missing (null data pointer)");
  if (t.rank != 2) throw Error(std::string(name) + ": expected a matrix (rank 2), got " + t.shape_str());
  if (t.shape[0] <= 0 || t.shape[1] <= 0)
    throw Error(std::string(name) + ": every dimension must be positive, got " + t.shape_str());
  if (t.dtype != dtype)
    throw Error(std::string(name) + ": dtype " + std::string(dtype_name(t.dtype)) + " differs from x's " +
                std::string(dtype_name(dtype)));
}

// C = A B for strided rank-2 views, accumulated in T (i-k-j order: the inner loop is contiguous).
template <class T>
Tensor matmul(const TensorView& a, const TensorView& b) {
  const std::int64_t M = a.shape[0], K = a.shape[1], N = b.shape[1];
  Tensor c(a.dtype, {M, N});
  T* C = c.as<T>();
  const T* A = static_cast<const T*>(a.data);
  const T* B = static_cast<const T*>(b.data);
  for (std::int64_t i = 0; i < M * N; ++i) C[i] = 0;
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t k = 0; k < K; ++k) {
      const T aik = A[i * a.strides[0] + k * a.strides[1]];
      for (std::int64_t j = 0; j < N; ++j) C[i * N + j] += aik * B[k * b.strides[0] + j * b.strides[1]];
    }
  return c;
}

Tensor project(const TensorView& a, const TensorView& b) {
  return a.dtype == DType::f64 ? matmul<double>(a, b) : matmul<float>(a, b);
}

// Heads as strided views of one [N, H·d] matrix: head h is columns h·d .. (h+1)·d.
TensorView heads_view(Tensor& t, std::int64_t heads) {
  const std::int64_t n = t.dim(0), d = t.dim(1) / heads;
  return TensorView::strided(t.data(), t.dtype(), {1, heads, n, d}, {0, d, heads * d, 1});
}

Tensor attend_heads(const TensorView& x, const TensorView& w_q, const TensorView& w_k,
                    const TensorView& w_v, std::int64_t heads, const Options& options) {
  check_matrix("x", x, x.dtype);
  if (x.dtype != DType::f32 && x.dtype != DType::f64)
    throw Error("x: dtype must be float32 or float64, got " + std::string(dtype_name(x.dtype)));
  check_matrix("w_q", w_q, x.dtype);
  check_matrix("w_k", w_k, x.dtype);
  check_matrix("w_v", w_v, x.dtype);
  if (heads <= 0) throw Error("heads: must be positive, got " + std::to_string(heads));
  const std::int64_t dx = x.shape[1];
  for (auto [name, w] : {std::pair{"w_q", &w_q}, {"w_k", &w_k}, {"w_v", &w_v}}) {
    if (w->shape[0] != dx)
      throw Error(std::string(name) + ": expected " + std::to_string(dx) + " rows (x is " + x.shape_str() +
                  "), got " + w->shape_str());
    if (w->shape[1] % heads != 0)
      throw Error(std::string(name) + ": columns " + std::to_string(w->shape[1]) +
                  " are not divisible by heads = " + std::to_string(heads));
  }
  if (w_q.shape[1] != w_k.shape[1])
    throw Error("w_k: shape " + w_k.shape_str() + " must equal w_q's " + w_q.shape_str());
  Tensor q = project(x, w_q), k = project(x, w_k), v = project(x, w_v);
  Tensor o(x.dtype, {x.shape[0], w_v.shape[1]});
  forward(heads_view(q, heads), heads_view(k, heads), heads_view(v, heads), {heads_view(o, heads)}, options);
  return o;
}

}  // namespace

Tensor self_attention(const TensorView& x, const TensorView& w_q, const TensorView& w_k,
                      const TensorView& w_v, const Options& options) {
  return attend_heads(x, w_q, w_k, w_v, 1, options);
}

Tensor multi_head_attention(const TensorView& x, const TensorView& w_q, const TensorView& w_k,
                            const TensorView& w_v, const TensorView& w_o, std::int64_t heads,
                            const Options& options) {
  Tensor o = attend_heads(x, w_q, w_k, w_v, heads, options);
  check_matrix("w_o", w_o, x.dtype);
  if (w_o.shape[0] != o.dim(1))
    throw Error("w_o: expected " + std::to_string(o.dim(1)) + " rows (heads × dv), got " + w_o.shape_str());
  return project(o.view(), w_o);
}

}  // namespace attnscale
