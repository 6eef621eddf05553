// Self-attention from X and projections (Chuang (2023)) and multi-head attention (the Simulation note).
#include <gtest/gtest.h>

#include "attnscale/error.h"
#include "attnscale/self_attention.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using testing::random_tensor;

// Plain float64 matrices for an independent computation.
std::vector<double> matmul(const Tensor& a, const Tensor& b) {
  const auto M = a.dim(0), K = a.dim(1), N = b.dim(1);
  std::vector<double> c(M * N, 0.0);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j)
      for (std::int64_t k = 0; k < K; ++k) c[i * N + j] += testing::value_at(a.view(), i * K + k) * testing::value_at(b.view(), k * N + j);
  return c;
}

TEST(SelfAttention, MultiHeadMatchesPerHeadComposition) {
  // 8 heads x 8 = 64 (the paper's 8 x 64 = 512, scaled down), dx = 24, N = 11, d_out = 16.
  const std::int64_t N = 11, dx = 24, H = 8, dh = 8, dout = 16;
  const Tensor x = random_tensor(DType::f64, {N, dx}, 6, 0), wq = random_tensor(DType::f64, {dx, H * dh}, 6, 1, 0.2),
               wk = random_tensor(DType::f64, {dx, H * dh}, 6, 2, 0.2), wv = random_tensor(DType::f64, {dx, H * dh}, 6, 3, 0.2),
               wo = random_tensor(DType::f64, {H * dh, dout}, 6, 4, 0.2);
  Options opt;
  opt.mask.causal = true;
  const Tensor y = multi_head_attention(x.view(), wq.view(), wk.view(), wv.view(), wo.view(), H, opt);
  ASSERT_EQ(y.view().shape_str(), "[11, 16]");
  // Independent: project, run the reference per head on copies, concatenate, project.
  const auto Q = matmul(x, wq), K = matmul(x, wk), V = matmul(x, wv);
  Tensor concat(DType::f64, {N, H * dh});
  for (std::int64_t h = 0; h < H; ++h) {
    Tensor qh(DType::f64, {N, dh}), kh(DType::f64, {N, dh}), vh(DType::f64, {N, dh}), oh(DType::f64, {N, dh});
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t c = 0; c < dh; ++c) {
        qh.as<double>()[i * dh + c] = Q[i * H * dh + h * dh + c];
        kh.as<double>()[i * dh + c] = K[i * H * dh + h * dh + c];
        vh.as<double>()[i * dh + c] = V[i * H * dh + h * dh + c];
      }
    reference::forward(qh.view(), kh.view(), vh.view(), {oh.view()}, opt);
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t c = 0; c < dh; ++c) concat.as<double>()[i * H * dh + h * dh + c] = oh.as<double>()[i * dh + c];
  }
  const auto expect = matmul(concat, wo);
  for (std::int64_t i = 0; i < N * dout; ++i) EXPECT_NEAR(y.as<double>()[i], expect[i], 1e-12);
}

TEST(SelfAttention, SingleHeadFloat32) {
  const Tensor x = random_tensor(DType::f32, {7, 5}, 2, 0), wq = random_tensor(DType::f32, {5, 4}, 2, 1),
               wk = random_tensor(DType::f32, {5, 4}, 2, 2), wv = random_tensor(DType::f32, {5, 3}, 2, 3);
  const Tensor y = self_attention(x.view(), wq.view(), wk.view(), wv.view());
  EXPECT_EQ(y.view().shape_str(), "[7, 3]");
  const auto Q = matmul(x, wq), K = matmul(x, wk), V = matmul(x, wv);
  Tensor q(DType::f64, {7, 4}), k(DType::f64, {7, 4}), v(DType::f64, {7, 3}), o(DType::f64, {7, 3});
  std::copy(Q.begin(), Q.end(), q.as<double>());
  std::copy(K.begin(), K.end(), k.as<double>());
  std::copy(V.begin(), V.end(), v.as<double>());
  reference::forward(q.view(), k.view(), v.view(), {o.view()});
  EXPECT_LE(testing::rel_error(y.view(), o.view()), 1e-5);
}

TEST(SelfAttention, BadShapesNameTheMatrix) {
  const Tensor x = random_tensor(DType::f32, {7, 5}, 2, 0), w = random_tensor(DType::f32, {5, 6}, 2, 1),
               bad = random_tensor(DType::f32, {4, 6}, 2, 1);
  try {
    self_attention(x.view(), w.view(), bad.view(), w.view());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "w_k: expected 5 rows (x is [7, 5]), got [4, 6]");
  }
  EXPECT_THROW(multi_head_attention(x.view(), w.view(), w.view(), w.view(), w.view(), 4), Error);  // 6 % 4
}

}  // namespace
}  // namespace attnscale
