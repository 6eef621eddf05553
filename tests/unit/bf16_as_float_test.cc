// bfloat16 calls through the float32 kernels on the widened bf16 path (bf16_as_float.h): the
// forward and backward of bfloat16 inputs give, bit for bit, the float32 call's results on the
// inputs' float32 values, rounded to bfloat16 as they are written; float32 inputs with
// Compute::bf16 give the float32 call's on their bfloat16 roundings. Awkward sizes, GQA, masks
// (causal, window, explicit), strided views, and which calls take the route: on the widened path
// only, for at least a block of query rows; read as stored or through copies.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "attention/bf16_as_float.h"
#include "attention/bf16_kernels.h"
#include "attention/params.h"
#include "attention/tiles.h"
#include "attnscale/attention.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using detail::bfdot::force_path;
using testing::poison;
using testing::random_tensor;

struct Shape {
  std::int64_t B, Hq, Hkv, Nq, Nkv, dk, dv;
};

// t's values as float32 (bfloat16 widened), or rounded to bfloat16 first (`round`).
Tensor float_values(const Tensor& t, bool round) {
  Tensor f(DType::f32, {t.dim(0), t.dim(1), t.dim(2), t.dim(3)});
  const std::int64_t n = t.dim(0) * t.dim(1) * t.dim(2) * t.dim(3);
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = t.dtype() == DType::bf16 ? from_bf16(t.as<bf16>()[i]) : t.as<float>()[i];
    f.as<float>()[i] = round ? from_bf16(to_bf16(x)) : x;
  }
  return f;
}

// `want` (float32) as the dtype of `got` would hold it, compared bit for bit with got.
void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::int64_t n = got.view().numel();
  ASSERT_EQ(n, want.view().numel()) << what;
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float w = want.as<float>()[i];
    if (got.dtype() == DType::bf16) differ += got.as<bf16>()[i].bits != to_bf16(w).bits;
    else differ += std::memcmp(&got.as<float>()[i], &w, 4) != 0;
  }
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << n << " values differ";
}

// One call of the tests below: inputs of `dtype` (bfloat16, or float32 asking for Compute::bf16)
// of a shape, under mask case c: 0 none, 1 causal, 2 window, 3 explicit.
struct Case {
  Shape s;
  DType dtype;
  Tensor q, k, v, dout, keep;
  Options opt;
  std::string what;
};

std::vector<Case> cases(std::uint64_t seed) {
  const std::vector<Shape> shapes = {{2, 4, 2, 67, 131, 16, 24}, {1, 3, 1, 130, 77, 59, 5}, {2, 2, 2, 64, 64, 128, 128},
                                     {1, 1, 1, 257, 311, 80, 80}, {1, 2, 1, 33, 41, 24, 24},
                                     {1, 2, 2, 70, 90, 150, 131}};
  std::vector<Case> all;
  for (const Shape& s : shapes)
    for (int c = 0; c < 4; ++c)
      for (DType dtype : {DType::bf16, DType::f32}) {
        const std::uint64_t at = seed + static_cast<std::uint64_t>(s.Nq);
        Case x{s,
               dtype,
               random_tensor(dtype, {s.B, s.Hq, s.Nq, s.dk}, at, 0),
               random_tensor(dtype, {s.B, s.Hkv, s.Nkv, s.dk}, at, 1),
               random_tensor(dtype, {s.B, s.Hkv, s.Nkv, s.dv}, at, 2),
               random_tensor(dtype, {s.B, s.Hq, s.Nq, s.dv}, at, 3),
               random_tensor(DType::u8, {s.Nq, s.Nkv}, at, 4),
               {},
               "Nq " + std::to_string(s.Nq) + " case " + std::to_string(c) + " " + std::string(dtype_name(dtype))};
        if (c == 1) x.opt.mask.causal = true;
        if (c == 2) {
          x.opt.mask.window_left = 37;
          x.opt.mask.window_right = 3;
        }
        if (c == 3) x.opt.mask.explicit_mask = x.keep.view();
        x.opt.compute = Compute::bf16;
        all.push_back(std::move(x));
      }
  return all;
}

TEST(Bf16AsFloat, ForwardIsTheFloat32ForwardOnTheSameValues) {
  force_path("widened");
  for (Case& x : cases(300)) {
    const Shape& s = x.s;
    Tensor out(x.dtype, {s.B, s.Hq, s.Nq, s.dv}), lse(DType::f32, {s.B, s.Hq, s.Nq});
    poison(out);
    poison(lse);
    forward(x.q.view(), x.k.view(), x.v.view(), {out.view(), lse.view()}, x.opt);
    const bool round = x.dtype == DType::f32;
    const Tensor qf = float_values(x.q, round), kf = float_values(x.k, round), vf = float_values(x.v, round);
    Tensor want(DType::f32, {s.B, s.Hq, s.Nq, s.dv}), want_lse(DType::f32, {s.B, s.Hq, s.Nq});
    x.opt.compute = Compute::native;
    forward(qf.view(), kf.view(), vf.view(), {want.view(), want_lse.view()}, x.opt);
    expect_same_bits(out, want, x.what + " out");
    expect_same_bits(lse, want_lse, x.what + " lse");
  }
  force_path("");
}

TEST(Bf16AsFloat, BackwardIsTheFloat32BackwardOnTheSameValues) {
  force_path("widened");
  for (Case& x : cases(400)) {
    const Shape& s = x.s;
    // The forward's outputs as the call passes them (out in the inputs' dtype).
    Tensor out(x.dtype, {s.B, s.Hq, s.Nq, s.dv}), lse(DType::f32, {s.B, s.Hq, s.Nq});
    forward(x.q.view(), x.k.view(), x.v.view(), {out.view(), lse.view()}, x.opt);
    Tensor dq(x.dtype, {s.B, s.Hq, s.Nq, s.dk}), dk(x.dtype, {s.B, s.Hkv, s.Nkv, s.dk}),
        dv(x.dtype, {s.B, s.Hkv, s.Nkv, s.dv});
    poison(dq);
    poison(dk);
    poison(dv);
    backward(x.q.view(), x.k.view(), x.v.view(), out.view(), lse.view(), x.dout.view(),
             {dq.view(), dk.view(), dv.view()}, x.opt);
    // The float32 backward on the values the route copies; out as passed (not rounded).
    const bool round = x.dtype == DType::f32;
    const Tensor qf = float_values(x.q, round), kf = float_values(x.k, round), vf = float_values(x.v, round),
                 df = float_values(x.dout, round), of = float_values(out, false);
    Tensor wq(DType::f32, {s.B, s.Hq, s.Nq, s.dk}), wk(DType::f32, {s.B, s.Hkv, s.Nkv, s.dk}),
        wv(DType::f32, {s.B, s.Hkv, s.Nkv, s.dv});
    x.opt.compute = Compute::native;
    backward(qf.view(), kf.view(), vf.view(), of.view(), lse.view(), df.view(), {wq.view(), wk.view(), wv.view()},
             x.opt);
    expect_same_bits(dq, wq, x.what + " dq");
    expect_same_bits(dk, wk, x.what + " dk");
    expect_same_bits(dv, wv, x.what + " dv");
  }
  force_path("");
}

// Inputs laid out as PyTorch's [B, N, H, d] (views with the head and sequence strides swapped, so
// rows are copied one by one), and a V whose rows are every other row of a larger tensor (column
// stride 1, row stride 2·d): the same bits as the float32 call on contiguous float32 values.
TEST(Bf16AsFloat, StridedViewsGiveTheBitsOfContiguousOnes) {
  force_path("widened");
  const std::int64_t B = 2, H = 3, N = 70, Nkv = 97, d = 24;
  for (DType dtype : {DType::bf16, DType::f32}) {
    const Tensor qs = random_tensor(dtype, {B, N, H, d}, 500, 0), ks = random_tensor(dtype, {B, Nkv, H, d}, 500, 1),
                 vs = random_tensor(dtype, {B, H, Nkv, 2 * d}, 500, 2);
    const TensorView q = testing::bnhd_view(qs.data(), dtype, B, H, N, d),
                     k = testing::bnhd_view(ks.data(), dtype, B, H, Nkv, d),
                     v = TensorView::strided(const_cast<void*>(vs.data()), dtype, {B, H, Nkv, d},
                                             {H * Nkv * 2 * d, Nkv * 2 * d, 2 * d, 1});
    // Contiguous float32 copies of the views' values, rounded as the route rounds float32 inputs.
    const auto contiguous = [&](const TensorView& t) {
      Tensor c(dtype, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]});
      convert(t, c.view());
      return float_values(c, dtype == DType::f32);
    };
    const Tensor qf = contiguous(q), kf = contiguous(k), vf = contiguous(v);
    Options opt;
    opt.mask.causal = true;
    opt.compute = Compute::bf16;
    Tensor out(dtype, {B, H, N, d}), want(DType::f32, {B, H, N, d});
    forward(q, k, v, {out.view()}, opt);
    opt.compute = Compute::native;
    forward(qf.view(), kf.view(), vf.view(), {want.view()}, opt);
    expect_same_bits(out, want, std::string("strided ") + std::string(dtype_name(dtype)));
  }
  force_path("");
}

// The backward of bfloat16 inputs in PyTorch's [B, N, H, d] layout (rows one head apart) with a V
// of every other row, over keys few enough to be read as stored (bf16_as_float.h) and more: the
// float32 backward's bits on contiguous float32 copies of the values.
TEST(Bf16AsFloat, StridedBackwardGivesTheBitsOfContiguousOnes) {
  force_path("widened");
  for (const std::int64_t Nkv : {97, 300}) {
    const std::int64_t B = 2, H = 3, N = 70, d = 24;
    const Tensor qs = random_tensor(DType::bf16, {B, N, H, d}, 510, 0),
                 ks = random_tensor(DType::bf16, {B, Nkv, H, d}, 510, 1),
                 vs = random_tensor(DType::bf16, {B, H, Nkv, 2 * d}, 510, 2),
                 dos = random_tensor(DType::bf16, {B, N, H, d}, 510, 3);
    const auto bnhd = [&](const Tensor& t, std::int64_t n) {
      return testing::bnhd_view(t.data(), DType::bf16, B, H, n, d);
    };
    const TensorView q = bnhd(qs, N), k = bnhd(ks, Nkv), dout = bnhd(dos, N),
                     v = TensorView::strided(const_cast<void*>(vs.data()), DType::bf16, {B, H, Nkv, d},
                                             {H * Nkv * 2 * d, Nkv * 2 * d, 2 * d, 1});
    const auto contiguous = [&](const TensorView& t) {
      Tensor c(DType::bf16, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]});
      convert(t, c.view());
      return float_values(c, false);
    };
    const Tensor qf = contiguous(q), kf = contiguous(k), vf = contiguous(v), df = contiguous(dout);
    Options opt;
    opt.mask.causal = true;
    Tensor out(DType::bf16, {B, H, N, d}), lse(DType::f32, {B, H, N});
    forward(q, k, v, {out.view(), lse.view()}, opt);
    Tensor dq(DType::bf16, {B, H, N, d}), dk(DType::bf16, {B, H, Nkv, d}), dv(DType::bf16, {B, H, Nkv, d});
    poison(dq);
    poison(dk);
    poison(dv);
    const auto params = detail::make_backward_params(q, k, v, out.view(), lse.view(), dout,
                                                     {dq.view(), dk.view(), dv.view()}, opt, detail::Kernel::fast);
    EXPECT_EQ(detail::reads_as_stored(params), Nkv <= 256) << Nkv;
    backward(q, k, v, out.view(), lse.view(), dout, {dq.view(), dk.view(), dv.view()}, opt);
    const Tensor of = float_values(out, false);
    Tensor wq(DType::f32, {B, H, N, d}), wk(DType::f32, {B, H, Nkv, d}), wv(DType::f32, {B, H, Nkv, d});
    backward(qf.view(), kf.view(), vf.view(), of.view(), lse.view(), df.view(), {wq.view(), wk.view(), wv.view()}, opt);
    const std::string what = "strided backward, Nkv " + std::to_string(Nkv);
    expect_same_bits(dq, wq, what + " dq");
    expect_same_bits(dk, wk, what + " dk");
    expect_same_bits(dv, wv, what + " dv");
  }
  force_path("");
}

// The route's choice: bfloat16 inputs or Compute::bf16, on the widened path; a block of query rows
// a head, or from 16 rows on the backward always and the forward where the copies are small
// (at most 2^18 values: not a few rows over many keys, which the bf16 kernels read as stored).
TEST(Bf16AsFloat, TakenOnTheWidenedPathForEnoughRows) {
  const Options opt;
  // A forward and a backward of dtype over Nq query rows and Nkv keys (H = 2, d = 16).
  const auto forward_of = [&](DType dtype, std::int64_t Nq, std::int64_t Nkv, Compute compute) {
    const Tensor q = random_tensor(dtype, {1, 2, Nq, 16}, 1, 0), k = random_tensor(dtype, {1, 2, Nkv, 16}, 1, 1),
                 v = random_tensor(dtype, {1, 2, Nkv, 16}, 1, 2);
    Tensor out(dtype, {1, 2, Nq, 16});
    return detail::runs_as_float(
        detail::make_forward_params(q.view(), k.view(), v.view(), {out.view()}, opt, detail::Kernel::fast), compute);
  };
  const auto backward_of = [&](std::int64_t Nq, std::int64_t Nkv) {
    const Tensor q = random_tensor(DType::bf16, {1, 2, Nq, 16}, 1, 0), k = random_tensor(DType::bf16, {1, 2, Nkv, 16}, 1, 1),
                 v = random_tensor(DType::bf16, {1, 2, Nkv, 16}, 1, 2), dout = random_tensor(DType::bf16, {1, 2, Nq, 16}, 1, 3);
    Tensor out(DType::bf16, {1, 2, Nq, 16}), lse(DType::f32, {1, 2, Nq}), dq(DType::bf16, {1, 2, Nq, 16}),
        dk(DType::bf16, {1, 2, Nkv, 16}), dv(DType::bf16, {1, 2, Nkv, 16});
    return detail::runs_as_float(detail::make_backward_params(q.view(), k.view(), v.view(), out.view(), lse.view(),
                                                              dout.view(), {dq.view(), dk.view(), dv.view()}, opt,
                                                              detail::Kernel::fast),
                                 Compute::native);
  };
  const std::int64_t long_keys = 5000;  // 2 heads x 2 x 5000 keys x 16 > 2^18 values of K and V
  force_path("widened");
  EXPECT_TRUE(forward_of(DType::bf16, 64, long_keys, Compute::native));
  EXPECT_TRUE(forward_of(DType::bf16, 63, 100, Compute::native));
  EXPECT_FALSE(forward_of(DType::bf16, 63, long_keys, Compute::native));
  EXPECT_FALSE(forward_of(DType::bf16, 15, 100, Compute::native));
  EXPECT_TRUE(forward_of(DType::f32, 64, 100, Compute::bf16));
  EXPECT_FALSE(forward_of(DType::f32, 64, 100, Compute::native));
  EXPECT_TRUE(backward_of(16, long_keys));
  EXPECT_FALSE(backward_of(15, 100));
  // bfloat16 inputs read as stored where at most 8 query blocks read a tile (GQA counts each query
  // head's blocks), else copied; float32 inputs (rounded first) always copied.
  const auto stored = [&](DType dtype, std::int64_t Hq, std::int64_t Hkv, std::int64_t Nq) {
    const Tensor q = random_tensor(dtype, {1, Hq, Nq, 16}, 1, 0), k = random_tensor(dtype, {1, Hkv, 300, 16}, 1, 1),
                 v = random_tensor(dtype, {1, Hkv, 300, 16}, 1, 2);
    Tensor out(dtype, {1, Hq, Nq, 16});
    return detail::reads_as_stored(
        detail::make_forward_params(q.view(), k.view(), v.view(), {out.view()}, opt, detail::Kernel::fast));
  };
  EXPECT_TRUE(stored(DType::bf16, 2, 2, 512));
  EXPECT_FALSE(stored(DType::bf16, 2, 2, 513));
  EXPECT_TRUE(stored(DType::bf16, 8, 2, 128));
  EXPECT_FALSE(stored(DType::bf16, 8, 2, 129));
  EXPECT_FALSE(stored(DType::f32, 2, 2, 64));
  // A backward reads bfloat16 inputs as stored over at most 256 keys (four tiles); float32 inputs
  // with Compute::bf16 are copies (rounded) however few.
  const auto backward_stored = [&](DType dtype, std::int64_t Nkv) {
    const Tensor q = random_tensor(dtype, {1, 2, 64, 16}, 1, 0), k = random_tensor(dtype, {1, 2, Nkv, 16}, 1, 1),
                 v = random_tensor(dtype, {1, 2, Nkv, 16}, 1, 2), dout = random_tensor(dtype, {1, 2, 64, 16}, 1, 3);
    Tensor out(dtype, {1, 2, 64, 16}), lse(DType::f32, {1, 2, 64}), dq(dtype, {1, 2, 64, 16}),
        dk(dtype, {1, 2, Nkv, 16}), dv(dtype, {1, 2, Nkv, 16});
    return detail::reads_as_stored(detail::make_backward_params(q.view(), k.view(), v.view(), out.view(), lse.view(),
                                                                dout.view(), {dq.view(), dk.view(), dv.view()}, opt,
                                                                detail::Kernel::fast));
  };
  EXPECT_TRUE(backward_stored(DType::bf16, 1));
  EXPECT_TRUE(backward_stored(DType::bf16, 256));
  EXPECT_FALSE(backward_stored(DType::bf16, 257));
  EXPECT_FALSE(backward_stored(DType::f32, 64));
  force_path("portable");
  EXPECT_FALSE(forward_of(DType::bf16, 64, 100, Compute::native));
  EXPECT_FALSE(backward_of(64, 100));
  force_path("");
}

}  // namespace
}  // namespace attnscale
