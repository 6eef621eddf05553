// The bf16 backward (bfloat16 tile products, float32 accumulation) on every bf16 path this CPU
// runs, against the float64 reference backward: relative error <= 1e-2 for bf16 inputs and for
// float32 inputs with Options::compute = bf16, on awkward sizes, masks (causal in both
// alignments, window, explicit), GQA and the score transforms; bitwise the same for 1, 2 and 3
// threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attention/bf16_kernels.h"
#include "attention/kernels.h"
#include "attention/params.h"
#include "attnscale/attention.h"
#include "bf16_paths.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using testing::poison;
using testing::random_tensor;
using testing::rel_error;

struct Shape {
  std::int64_t B, Hq, Hkv, Nq, Nkv, dk, dv;
};

struct Inputs {
  Tensor q, k, v, dout, slopes, sinks;
};
Inputs inputs(DType dtype, const Shape& s, std::uint64_t seed) {
  return {random_tensor(dtype, {s.B, s.Hq, s.Nq, s.dk}, seed, 0), random_tensor(dtype, {s.B, s.Hkv, s.Nkv, s.dk}, seed, 1),
          random_tensor(dtype, {s.B, s.Hkv, s.Nkv, s.dv}, seed, 2), random_tensor(dtype, {s.B, s.Hq, s.Nq, s.dv}, seed, 3),
          random_tensor(DType::f32, {s.Hq}, seed, 4), random_tensor(DType::f32, {s.Hq}, seed, 5)};
}

struct Grads {
  Tensor dq, dk, dv, dsinks;
};
Grads gradients(DType dtype, const Shape& s, const Inputs& in, const Options& opt, bool ref) {
  Grads g{Tensor(dtype, {s.B, s.Hq, s.Nq, s.dk}), Tensor(dtype, {s.B, s.Hkv, s.Nkv, s.dk}),
          Tensor(dtype, {s.B, s.Hkv, s.Nkv, s.dv}), Tensor(ref ? DType::f64 : DType::f32, {s.Hq})};
  poison(g.dq);
  poison(g.dk);
  poison(g.dv);
  const Gradients out_grads{g.dq.view(), g.dk.view(), g.dv.view(), opt.sinks.empty() ? TensorView{} : g.dsinks.view()};
  if (ref) {
    reference::backward(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), out_grads, opt);
  } else {
    Tensor out(dtype, {s.B, s.Hq, s.Nq, s.dv}), lse(DType::f32, {s.B, s.Hq, s.Nq});
    forward(in.q.view(), in.k.view(), in.v.view(), {out.view(), lse.view()}, opt);
    backward(in.q.view(), in.k.view(), in.v.view(), out.view(), lse.view(), in.dout.view(), out_grads, opt);
  }
  return g;
}

Tensor as_f64(const Tensor& t) {
  Tensor d(DType::f64, {t.dim(0), t.dim(1), t.dim(2), t.dim(3)});
  const std::int64_t n = t.dim(0) * t.dim(1) * t.dim(2) * t.dim(3);
  for (std::int64_t i = 0; i < n; ++i)
    d.as<double>()[i] = t.dtype() == DType::bf16 ? static_cast<double>(from_bf16(t.as<bf16>()[i]))
                                                  : static_cast<double>(t.as<float>()[i]);
  return d;
}

// dsinks_h = −Σ_{b,i} P_sink,bhi·D_bhi (P_sink = e^(σ_h − lse), D = rowsum(dO ∘ O)) adds terms of
// both signs, so it can be much smaller than its terms, whose bf16 errors it keeps. Its error is
// judged against their size, Σ_{b,i} |P_sink·D| per head (from the float64 forward), as dq, dk
// and dv are against the size of their own values.
double dsinks_error(const Tensor& got, const Tensor& ref, const Shape& s, const Inputs& in64, const Tensor& sinks,
                    const Options& opt) {
  Tensor out(DType::f64, {s.B, s.Hq, s.Nq, s.dv}), lse(DType::f64, {s.B, s.Hq, s.Nq});
  reference::forward(in64.q.view(), in64.k.view(), in64.v.view(), {out.view(), lse.view()}, opt);
  double num = 0, den = 0;
  for (std::int64_t h = 0; h < s.Hq; ++h) {
    double size = 0;
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t i = 0; i < s.Nq; ++i) {
        const std::int64_t row = (b * s.Hq + h) * s.Nq + i;
        double D = 0;
        for (std::int64_t c = 0; c < s.dv; ++c) D += in64.dout.as<double>()[row * s.dv + c] * out.as<double>()[row * s.dv + c];
        size += std::abs(std::exp(static_cast<double>(sinks.as<float>()[h]) - lse.as<double>()[row]) * D);
      }
    const double e = got.as<float>()[h] - ref.as<double>()[h];
    num += e * e;
    den += size * size;
  }
  return std::sqrt(num) / std::sqrt(den);
}

// Options of case c: 0 none, 1 causal top-left, 2 causal bottom-right, 3 window, 4 explicit
// mask, 5 soft-cap + ALiBi + causal, 6 sinks, 7 dropout.
Options options_of(int c, const Inputs& in, const Tensor& keep) {
  Options opt;
  opt.compute = Compute::bf16;
  if (c == 1 || c == 2 || c == 5) opt.mask.causal = true;
  if (c == 2) opt.mask.align = Align::bottom_right;
  if (c == 3) {
    opt.mask.window_left = 37;
    opt.mask.window_right = 3;
  }
  if (c == 4) opt.mask.explicit_mask = keep.view();
  if (c == 5) {
    opt.softcap = 5.0;
    opt.alibi_slopes = in.slopes.view();
  }
  if (c == 6) opt.sinks = in.sinks.view();
  if (c == 7) opt.dropout = {0.2, 7, 3};
  return opt;
}

TEST(Bf16Backward, WithinOnePercentOfFloat64OnEveryPath) {
  const std::vector<Shape> shapes = {{1, 1, 1, 1, 1, 1, 1},       {2, 4, 2, 67, 131, 16, 24}, {1, 3, 1, 130, 77, 59, 5},
                                     {1, 2, 2, 64, 64, 128, 128}, {1, 1, 1, 3, 197, 8, 8}};
  // The inputs and the float64 reference of each case made once, the gradients on every path.
  for (const Shape& s : shapes)
    for (int c = 0; c < 8; ++c)
      for (DType dtype : {DType::bf16, DType::f32}) {
        const Inputs in = inputs(dtype, s, 90 + s.Nq);
        const Tensor keep = random_tensor(DType::u8, {s.Nq, s.Nkv}, 90 + s.Nq, 6);
        const Options opt = options_of(c, in, keep);
        // The reference on the same (bf16-representable or float32) values in float64.
        const Inputs in64{as_f64(in.q), as_f64(in.k), as_f64(in.v), as_f64(in.dout), Tensor(), Tensor()};
        const Grads r = gradients(DType::f64, s, in64, opt, true);
        const std::string what = "Nq " + std::to_string(s.Nq) + " case " + std::to_string(c) + " dtype " +
                                 std::string(dtype_name(dtype));
        // Gradients that vanish (one key: dS = 0) are compared in absolute terms.
        auto err = [](const Tensor& a, const Tensor& b) {
          double num = 0, den = 0;
          const std::int64_t n = a.dim(0) * a.dim(1) * a.dim(2) * a.dim(3);
          for (std::int64_t i = 0; i < n; ++i) {
            const double x = a.dtype() == DType::bf16 ? from_bf16(a.as<bf16>()[i]) : a.as<float>()[i];
            const double y = b.as<double>()[i];
            num += (x - y) * (x - y);
            den += y * y;
          }
          return std::sqrt(num) / std::max(std::sqrt(den), 1.0);
        };
        testing::for_each_bf16_path([&] {
          const Grads g = gradients(dtype, s, in, opt, false);
          EXPECT_LE(err(g.dq, r.dq), 1e-2) << what;
          EXPECT_LE(err(g.dk, r.dk), 1e-2) << what;
          EXPECT_LE(err(g.dv, r.dv), 1e-2) << what;
          if (c == 6) {
            EXPECT_LE(dsinks_error(g.dsinks, r.dsinks, s, in64, in.sinks, opt), 1e-2) << what;
          }
        });
      }
}

// The float32 steps between the products (exp2, softmax gradient) on every SIMD target.
TEST(Bf16Backward, WithinOnePercentOnEverySimdTarget) {
  const Shape s{1, 4, 2, 67, 131, 16, 24};
  for (const std::string& target : detail::simd::available_targets()) {
    detail::simd::force_target(target);
    for (int c : {0, 2, 5}) {
      const Inputs in = inputs(DType::f32, s, 31);
      const Tensor keep = random_tensor(DType::u8, {s.Nq, s.Nkv}, 31, 6);
      const Options opt = options_of(c, in, keep);
      const Grads g = gradients(DType::f32, s, in, opt, false);
      const Inputs in64{as_f64(in.q), as_f64(in.k), as_f64(in.v), as_f64(in.dout), Tensor(), Tensor()};
      const Grads r = gradients(DType::f64, s, in64, opt, true);
      EXPECT_LE(rel_error(g.dq.view(), r.dq.view()), 1e-2) << target << " case " << c;
      EXPECT_LE(rel_error(g.dk.view(), r.dk.view()), 1e-2) << target << " case " << c;
      EXPECT_LE(rel_error(g.dv.view(), r.dv.view()), 1e-2) << target << " case " << c;
    }
  }
  detail::simd::force_target("");
}

TEST(Bf16Backward, BitwiseSameForAnyThreadCount) {
  const Shape s{1, 4, 2, 150, 201, 40, 24};
  for (DType dtype : {DType::bf16, DType::f32})
    for (int c : {0, 2, 5}) {
      const Inputs in = inputs(dtype, s, 7);
      const Tensor keep = random_tensor(DType::u8, {s.Nq, s.Nkv}, 7, 6);
      Options opt = options_of(c, in, keep);
      opt.threads = 1;
      const Grads one = gradients(dtype, s, in, opt, false);
      for (int threads : {2, 3}) {
        opt.threads = threads;
        const Grads more = gradients(dtype, s, in, opt, false);
        for (auto [a, b] : {std::pair{&one.dq, &more.dq}, {&one.dk, &more.dk}, {&one.dv, &more.dv}})
          EXPECT_EQ(std::memcmp(a->data(), b->data(), a->nbytes()), 0) << threads << " threads, case " << c;
      }
    }
}

}  // namespace
}  // namespace attnscale

namespace attnscale {
namespace {
// What the bf16 path leaves to the float32 backward (a non-finite input, dbias) gives the float32
// backward's bits.
TEST(Bf16Backward, NonFiniteInputsAndDbiasTakeTheFloat32Path) {
  const Shape s{1, 2, 1, 9, 9, 8, 8};
  Inputs in = inputs(DType::f32, s, 5);
  in.k.as<float>()[8 * 8] = NAN;  // key 8: hidden from every row but the last under a causal mask
  const Tensor bias = random_tensor(DType::f32, {s.Nq, s.Nkv}, 5, 7);
  for (int variant = 0; variant < 2; ++variant) {
    Options opt;
    opt.mask.causal = variant == 0;
    if (variant == 1) {
      in.k.as<float>()[8 * 8] = 0.5f;
      opt.mask.explicit_mask = bias.view();
    }
    Tensor out(DType::f32, {s.B, s.Hq, s.Nq, s.dv}), lse(DType::f32, {s.B, s.Hq, s.Nq});
    forward(in.q.view(), in.k.view(), in.v.view(), {out.view(), lse.view()}, opt);
    Tensor g[2][4];
    for (int c = 0; c < 2; ++c) {
      opt.compute = c ? Compute::bf16 : Compute::native;
      g[c][0] = Tensor(DType::f32, {s.B, s.Hq, s.Nq, s.dk});
      g[c][1] = Tensor(DType::f32, {s.B, s.Hkv, s.Nkv, s.dk});
      g[c][2] = Tensor(DType::f32, {s.B, s.Hkv, s.Nkv, s.dv});
      g[c][3] = Tensor(DType::f32, {s.B, s.Hq, s.Nq, s.Nkv});
      Gradients grads{g[c][0].view(), g[c][1].view(), g[c][2].view()};
      if (variant == 1) grads.dbias = g[c][3].view();
      backward(in.q.view(), in.k.view(), in.v.view(), out.view(), lse.view(), in.dout.view(), grads, opt);
    }
    for (int t = 0; t < 3; ++t)
      EXPECT_EQ(std::memcmp(g[0][t].data(), g[1][t].data(), g[0][t].nbytes()), 0) << "variant " << variant << " grad " << t;
    // The rows that do not see key 8 keep finite gradients.
    if (variant == 0) {
      for (std::int64_t i = 0; i < 8 * s.dk; ++i) EXPECT_TRUE(std::isfinite(g[1][0].as<float>()[i])) << i;
    }
  }
}

// The bf16 backward takes only finite inputs (bfdot::backward_handles): one inf, -inf or NaN
// anywhere in q, k, v or dO, float32 or bfloat16, at any column of an odd-length row, sends the
// call to the float32 backward; all-finite inputs, the largest finite values included, stay.
TEST(Bf16Backward, EveryNonFiniteInputElementIsSeen) {
  const Shape s{1, 2, 1, 5, 6, 7, 7};
  for (const DType dt : {DType::f32, DType::bf16}) {
    Inputs in = inputs(dt, s, 11);
    Tensor out(dt, {s.B, s.Hq, s.Nq, s.dv}), lse(DType::f32, {s.B, s.Hq, s.Nq});
    Tensor dq(dt, {s.B, s.Hq, s.Nq, s.dk}), dk(dt, {s.B, s.Hkv, s.Nkv, s.dk}), dv(dt, {s.B, s.Hkv, s.Nkv, s.dv});
    Options opt;
    opt.compute = Compute::bf16;
    const auto handles = [&] {
      const auto p = detail::make_backward_params(in.q.view(), in.k.view(), in.v.view(), out.view(), lse.view(),
                                                  in.dout.view(), {dq.view(), dk.view(), dv.view()}, opt,
                                                  detail::Kernel::fast);
      return detail::bfdot::backward_handles(p);
    };
    const auto set = [&](Tensor& t, std::int64_t i, float x) {
      if (dt == DType::f32) t.as<float>()[i] = x;
      else t.as<bf16>()[i] = to_bf16(x);
    };
    const auto get = [&](const Tensor& t, std::int64_t i) {
      return dt == DType::f32 ? t.as<float>()[i] : from_bf16(t.as<bf16>()[i]);
    };
    EXPECT_TRUE(handles());
    set(in.v, 3, 3.0e38f);  // finite: the largest bfloat16 below inf is 3.39e38
    EXPECT_TRUE(handles());
    for (Tensor* t : {&in.q, &in.k, &in.v, &in.dout})
      for (std::int64_t i = 0; i < t->dim(0) * t->dim(1) * t->dim(2) * t->dim(3); i += 4)
        for (const float x : {INFINITY, -INFINITY, NAN}) {
          const float was = get(*t, i);
          set(*t, i, x);
          EXPECT_FALSE(handles()) << dtype_name(dt) << " element " << i << " " << x;
          set(*t, i, was);
        }
    EXPECT_TRUE(handles());
  }
}
}  // namespace
}  // namespace attnscale
