// backward() against the float64 reference backward, and the reference against finite differences.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attention/params.h"
#include "attention/tiles.h"
#include "attnscale/attention.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using testing::random_tensor;
using testing::rel_error;

struct Grads {
  Tensor dq, dk, dv;
};

Grads run_backward(DType dtype, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                   const Options& opt, bool ref) {
  Grads g{Tensor(dtype, {q.dim(0), q.dim(1), q.dim(2), q.dim(3)}), Tensor(dtype, {k.dim(0), k.dim(1), k.dim(2), k.dim(3)}),
          Tensor(dtype, {v.dim(0), v.dim(1), v.dim(2), v.dim(3)})};
  testing::poison(g.dq);
  testing::poison(g.dk);
  testing::poison(g.dv);
  if (ref) {
    reference::backward(q.view(), k.view(), v.view(), dout.view(), {g.dq.view(), g.dk.view(), g.dv.view()}, opt);
  } else {
    Tensor out(q.dtype(), {q.dim(0), q.dim(1), q.dim(2), v.dim(3)}), lse(q.dtype(), {q.dim(0), q.dim(1), q.dim(2)});
    forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt);
    backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), {g.dq.view(), g.dk.view(), g.dv.view()},
             opt);
  }
  return g;
}

// q, k, v and dout of a shape, float32 normals from seed.
struct Inputs {
  Tensor q, k, v, dout;
};
Inputs random_inputs(std::int64_t B, std::int64_t Hq, std::int64_t Hkv, std::int64_t Nq, std::int64_t Nkv,
                     std::int64_t dk, std::int64_t dv, std::uint64_t seed) {
  return {random_tensor(DType::f32, {B, Hq, Nq, dk}, seed, 0), random_tensor(DType::f32, {B, Hkv, Nkv, dk}, seed, 1),
          random_tensor(DType::f32, {B, Hkv, Nkv, dv}, seed, 2), random_tensor(DType::f32, {B, Hq, Nq, dv}, seed, 3)};
}

// fn(budget) on both backward paths: one pass (dQ partials within their memory budget) and the
// two-pass fallback (forced by a zero budget).
template <class F>
void on_both_paths(F fn) {
  for (std::int64_t budget : {std::int64_t{64} << 20, std::int64_t{0}}) {
    const std::int64_t old = detail::set_backward_partial_budget(budget);
    fn(budget);
    detail::set_backward_partial_budget(old);
  }
}

TEST(Backward, MatchesReferenceWithMasksAndGQA) {
  for (int variant = 0; variant < 4; ++variant) {
    const std::int64_t B = 2, Hq = 4, Hkv = variant % 2 ? 1 : 2, Nq = 23, Nkv = 31, dk = 13, dv = 9;
    const Tensor q = random_tensor(DType::f32, {B, Hq, Nq, dk}, 40 + variant, 0),
                 k = random_tensor(DType::f32, {B, Hkv, Nkv, dk}, 40 + variant, 1),
                 v = random_tensor(DType::f32, {B, Hkv, Nkv, dv}, 40 + variant, 2),
                 dout = random_tensor(DType::f32, {B, Hq, Nq, dv}, 40 + variant, 3);
    Options opt;
    Tensor mask = random_tensor(DType::u8, {Nq, Nkv}, 40 + variant, 4);
    if (variant >= 2) {
      opt.mask.causal = true;
      opt.mask.align = Align::bottom_right;
      opt.mask.explicit_mask = mask.view();
    }
    const Grads fast = run_backward(DType::f32, q, k, v, dout, opt, false);
    const Grads ref = run_backward(DType::f64, q, k, v, dout, opt, true);
    EXPECT_LE(rel_error(fast.dq.view(), ref.dq.view()), 1e-4) << variant;
    EXPECT_LE(rel_error(fast.dk.view(), ref.dk.view()), 1e-4) << variant;
    EXPECT_LE(rel_error(fast.dv.view(), ref.dv.view()), 1e-4) << variant;
  }
}

// L = Σ dout ∘ out; dL/dx by central differences in float64 against the reference backward.
TEST(Backward, ReferenceMatchesFiniteDifferences) {
  const Tensor q = random_tensor(DType::f64, {1, 2, 4, 3}, 8, 0), k = random_tensor(DType::f64, {1, 1, 5, 3}, 8, 1),
               v = random_tensor(DType::f64, {1, 1, 5, 2}, 8, 2), dout = random_tensor(DType::f64, {1, 2, 4, 2}, 8, 3);
  Options opt;
  opt.mask.causal = true;
  opt.mask.align = Align::bottom_right;
  const Grads g = run_backward(DType::f64, q, k, v, dout, opt, true);
  auto loss = [&]() {
    Tensor out(DType::f64, {1, 2, 4, 2});
    reference::forward(q.view(), k.view(), v.view(), {out.view()}, opt);
    double l = 0;
    for (int i = 0; i < out.numel(); ++i) l += out.as<double>()[i] * dout.as<double>()[i];
    return l;
  };
  for (auto [x, dx] : {std::pair{&q, &g.dq}, {&k, &g.dk}, {&v, &g.dv}})
    EXPECT_LE(testing::central_difference_error(*x, *dx, loss), 1e-7);
}

// A backward over a shard of the keys with the lse of all keys (Options::lse_covers_keys = false,
// as ring attention calls it) gives that shard's rows of dK and dV from the full backward: its
// probabilities are taken as given, not rescaled to sum to 1 over the shard.
TEST(Backward, ShardOfKeysWithTheGlobalLse) {
  const std::int64_t B = 1, H = 2, Nq = 37, Nkv = 101, shard = 41, d = 12;
  const Tensor q = random_tensor(DType::f32, {B, H, Nq, d}, 71, 0), k = random_tensor(DType::f32, {B, H, Nkv, d}, 71, 1),
               v = random_tensor(DType::f32, {B, H, Nkv, d}, 71, 2), dout = random_tensor(DType::f32, {B, H, Nq, d}, 71, 3);
  Options opt;
  Tensor out(DType::f32, {B, H, Nq, d}), lse(DType::f32, {B, H, Nq});
  forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt);
  const Grads full = run_backward(DType::f32, q, k, v, dout, opt, false);
  auto first = [&](const Tensor& t) {  // keys [0, shard) of a [B, H, Nkv, d] tensor, as a view
    TensorView view = t.view();
    view.shape[2] = shard;
    return view;
  };
  Tensor dq(DType::f32, {B, H, Nq, d}), dk(DType::f32, {B, H, shard, d}), dv(DType::f32, {B, H, shard, d});
  opt.lse_covers_keys = false;
  backward(q.view(), first(k), first(v), out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view()}, opt);
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t j = 0; j < shard; ++j)
      for (std::int64_t c = 0; c < d; ++c) {
        const std::int64_t mine = (h * shard + j) * d + c, theirs = (h * Nkv + j) * d + c;
        EXPECT_NEAR(dk.as<float>()[mine], full.dk.as<float>()[theirs], 1e-5) << h << " " << j << " " << c;
        EXPECT_NEAR(dv.as<float>()[mine], full.dv.as<float>()[theirs], 1e-5) << h << " " << j << " " << c;
      }
}

// The one-pass backward (dQ partials per key group, summed in order) and the two-pass fallback
// (taken when the partials would exceed their memory budget, forced here with a zero budget):
// bitwise the same for 1, 2 and 3 threads, and both against the float64 reference. Shapes: one
// key group (B·Hkv = 8), several (B·Hkv = 2 and 1, so 4 and 8 groups over 5 and 9 key blocks,
// ragged), GQA, causal and a window.
TEST(Backward, BitwiseSameForAnyThreadCountOnBothPaths) {
  struct Shape {
    std::int64_t B, Hq, Hkv, Nq, Nkv, d;
    bool causal;
  };
  const std::vector<Shape> shapes = {{2, 8, 4, 17, 19, 8, false}, {1, 4, 2, 131, 257, 16, true},
                                     {1, 3, 1, 67, 541, 5, false}, {2, 4, 4, 70, 64, 33, true}};
  on_both_paths([&](std::int64_t budget) {
    for (const Shape& sh : shapes) {
      const auto [q, k, v, dout] = random_inputs(sh.B, sh.Hq, sh.Hkv, sh.Nq, sh.Nkv, sh.d, sh.d, 5 + sh.Nkv);
      Options opt;
      opt.mask.causal = sh.causal;
      opt.mask.align = Align::bottom_right;
      if (sh.Nkv == 541) opt.mask.window_left = 200;
      opt.threads = 1;
      const Grads a = run_backward(DType::f32, q, k, v, dout, opt, false);
      const Grads ref = run_backward(DType::f64, q, k, v, dout, opt, true);
      const std::string what = "Nkv " + std::to_string(sh.Nkv) + " budget " + std::to_string(budget);
      EXPECT_LE(rel_error(a.dq.view(), ref.dq.view()), 1e-5) << what;
      EXPECT_LE(rel_error(a.dk.view(), ref.dk.view()), 1e-5) << what;
      EXPECT_LE(rel_error(a.dv.view(), ref.dv.view()), 1e-5) << what;
      for (int threads : {2, 3}) {
        opt.threads = threads;
        const Grads b = run_backward(DType::f32, q, k, v, dout, opt, false);
        EXPECT_EQ(0, std::memcmp(a.dq.data(), b.dq.data(), a.dq.nbytes())) << what << " threads " << threads;
        EXPECT_EQ(0, std::memcmp(a.dk.data(), b.dk.data(), a.dk.nbytes())) << what << " threads " << threads;
        EXPECT_EQ(0, std::memcmp(a.dv.data(), b.dv.data(), a.dv.nbytes())) << what << " threads " << threads;
      }
    }
  });
}

// Under causal and window masks a partial tile computes its products over only the pairs some of
// its rows see (GroupRuns, tiles.h); the same pattern given as a keep-mask tensor tells no run, so
// its tiles take every pair. Both must give the same bits, forward (out, lse) and backward, with
// GQA, dk != dv, sizes that are not multiples of the tiles, rows that see no key, dropout, and
// both backward paths. (A window's left edge would start the forward's key tiles past 0, which
// the tensor does not know: other tiles, other sums.)
TEST(Backward, NarrowedTilesGiveTheBitsOfTheirMaskTensor) {
  struct Shape {
    std::int64_t B, Hq, Hkv, Nq, Nkv, dk, dv;
    bool causal;
    Align align;
    std::int64_t left, right;
    double dropout;
  };
  const std::vector<Shape> shapes = {{1, 4, 2, 131, 131, 48, 48, true, Align::top_left, -1, -1, 0.0},
                                     {2, 2, 1, 77, 200, 80, 40, true, Align::bottom_right, -1, -1, 0.0},
                                     {1, 3, 3, 150, 97, 64, 96, false, Align::top_left, -1, 5, 0.0},
                                     {1, 2, 1, 90, 70, 32, 32, true, Align::bottom_right, -1, -1, 0.0},
                                     {1, 2, 2, 100, 100, 17, 33, true, Align::top_left, -1, -1, 0.25}};
  on_both_paths([&](std::int64_t budget) {
    for (const Shape& sh : shapes) {
      const auto [q, k, v, dout] = random_inputs(sh.B, sh.Hq, sh.Hkv, sh.Nq, sh.Nkv, sh.dk, sh.dv, 77 + sh.Nq);
      Options runs;
      runs.mask.causal = sh.causal;
      runs.mask.align = sh.align;
      runs.mask.window_left = sh.left;
      runs.mask.window_right = sh.right;
      runs.dropout.p = sh.dropout;
      runs.dropout.seed = 9;
      // The same pattern as a tensor: key j visible from row i when diag - left <= j <= diag + right
      // (causal: right = 0), diag = i, or i + Nkv - Nq bottom-right.
      Tensor keep(DType::u8, {sh.Nq, sh.Nkv});
      for (std::int64_t i = 0; i < sh.Nq; ++i)
        for (std::int64_t j = 0; j < sh.Nkv; ++j) {
          const std::int64_t diag = sh.align == Align::bottom_right ? i + sh.Nkv - sh.Nq : i;
          const bool seen = (sh.left < 0 || j >= diag - sh.left) && (!sh.causal || j <= diag) &&
                            (sh.right < 0 || j <= diag + sh.right);
          keep.as<std::uint8_t>()[i * sh.Nkv + j] = seen ? 1 : 0;
        }
      Options tensor;
      tensor.mask.explicit_mask = keep.view();
      tensor.dropout = runs.dropout;
      const std::string what = "Nq " + std::to_string(sh.Nq) + " budget " + std::to_string(budget);
      Tensor o1(DType::f32, {sh.B, sh.Hq, sh.Nq, sh.dv}), o2(DType::f32, {sh.B, sh.Hq, sh.Nq, sh.dv});
      Tensor l1(DType::f32, {sh.B, sh.Hq, sh.Nq}), l2(DType::f32, {sh.B, sh.Hq, sh.Nq});
      forward(q.view(), k.view(), v.view(), {o1.view(), l1.view()}, runs);
      forward(q.view(), k.view(), v.view(), {o2.view(), l2.view()}, tensor);
      EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.nbytes())) << what;
      EXPECT_EQ(0, std::memcmp(l1.data(), l2.data(), l1.nbytes())) << what;
      const Grads a = run_backward(DType::f32, q, k, v, dout, runs, false);
      const Grads b = run_backward(DType::f32, q, k, v, dout, tensor, false);
      EXPECT_EQ(0, std::memcmp(a.dq.data(), b.dq.data(), a.dq.nbytes())) << what;
      EXPECT_EQ(0, std::memcmp(a.dk.data(), b.dk.data(), a.dk.nbytes())) << what;
      EXPECT_EQ(0, std::memcmp(a.dv.data(), b.dv.data(), a.dv.nbytes())) << what;
      const Grads ref = run_backward(DType::f64, q, k, v, dout, runs, true);
      EXPECT_LE(rel_error(a.dq.view(), ref.dq.view()), 1e-5) << what;
      EXPECT_LE(rel_error(a.dk.view(), ref.dk.view()), 1e-5) << what;
      EXPECT_LE(rel_error(a.dv.view(), ref.dv.view()), 1e-5) << what;
    }
  });
}

// The backward on the views view_of(t, copy) makes for q, k, v, out, dout and the gradients (copy:
// holding t's values) against the backward on the contiguous tensors: the same bits.
template <class ViewOf>
void expect_contiguous_bits(const Inputs& in, const Options& opt, ViewOf view_of, const std::string& what) {
  const Grads a = run_backward(DType::f32, in.q, in.k, in.v, in.dout, opt, false);
  Tensor out(DType::f32, {in.q.dim(0), in.q.dim(1), in.q.dim(2), in.v.dim(3)}),
      lse(DType::f32, {in.q.dim(0), in.q.dim(1), in.q.dim(2)});
  forward(in.q.view(), in.k.view(), in.v.view(), {out.view(), lse.view()}, opt);
  const TensorView dq = view_of(a.dq, false), dk = view_of(a.dk, false), dv = view_of(a.dv, false);
  backward(view_of(in.q, true), view_of(in.k, true), view_of(in.v, true), view_of(out, true), lse.view(),
           view_of(in.dout, true), {dq, dk, dv}, opt);
  for (const auto& [want, got] : {std::pair{&a.dq, dq}, std::pair{&a.dk, dk}, std::pair{&a.dv, dv}}) {
    Tensor g(DType::f32, {want->dim(0), want->dim(1), want->dim(2), want->dim(3)});
    convert(got, g.view());
    EXPECT_EQ(0, std::memcmp(want->data(), g.data(), g.nbytes())) << what;
  }
}

// Views 16 bytes past a cache line (numpy's alignment): the backward reads aligned copies of the
// rows it uses as vectors and keeps dQ's sums in its own buffer; the same bits as aligned views,
// on both paths (one pass, two passes).
TEST(Backward, MisalignedViewsGiveTheAlignedBits) {
  const Inputs in = random_inputs(1, 4, 2, 131, 150, 64, 64, 77);
  std::vector<std::vector<float>> buffers;
  buffers.reserve(16);
  // A copy of t (or room for one) starting 16 bytes past a 64-byte boundary.
  auto shifted = [&](const Tensor& t, bool copy) {
    buffers.emplace_back(static_cast<std::size_t>(t.numel()) + 32);
    float* base = buffers.back().data();
    base += (16 - reinterpret_cast<std::uintptr_t>(base) % 64 / 4) % 16 + 4;
    if (copy) std::memcpy(base, t.data(), t.nbytes());
    return TensorView::contiguous(base, DType::f32, {t.dim(0), t.dim(1), t.dim(2), t.dim(3)});
  };
  on_both_paths([&](std::int64_t budget) {
    Options opt;
    opt.mask.causal = true;
    expect_contiguous_bits(in, opt, shifted, "budget " + std::to_string(budget));
  });
}

// Views of [B, N, H, d] buffers (FlashAttention's and PyTorch's layout: a head's rows H·d apart),
// inputs and gradients: the backward reads aligned copies of the rows it uses as vectors where
// enough blocks read them (AlignedRows::gapped: Nq = 1031 and Nkv = 977 make 17 and 16 blocks);
// the same bits as contiguous views, on both paths.
TEST(Backward, GappedViewsGiveTheContiguousBits) {
  const std::int64_t Nkv = 977;
  ASSERT_GE((Nkv + detail::kBc - 1) / detail::kBc, detail::AlignedRows<float>::kGappedReaders);
  const Inputs in = random_inputs(1, 4, 2, 1031, Nkv, 64, 64, 78);
  std::vector<std::vector<float>> buffers;
  buffers.reserve(32);
  // A [B, N, H, d] buffer holding t (or room for it), viewed as [B, H, N, d].
  auto bnhd = [&](const Tensor& t, bool copy) {
    const std::int64_t B = t.dim(0), H = t.dim(1), N = t.dim(2), d = t.dim(3);
    buffers.emplace_back(static_cast<std::size_t>(t.numel()));
    const TensorView view = testing::bnhd_view(buffers.back().data(), DType::f32, B, H, N, d);
    if (copy) convert(t.view(), view);
    return view;
  };
  ASSERT_TRUE(detail::AlignedRows<float>::gapped(bnhd(in.q, false)));
  on_both_paths([&](std::int64_t budget) {
    for (const bool causal : {false, true}) {
      Options opt;
      opt.mask.causal = causal;
      expect_contiguous_bits(in, opt, bnhd, "budget " + std::to_string(budget) + " causal " + std::to_string(causal));
    }
  });
}

}  // namespace
}  // namespace attnscale
