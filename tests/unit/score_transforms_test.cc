// Soft-capping, ALiBi, sinks, dropout and the gradients w.r.t. sinks and an additive mask, on every
// compiled SIMD target, against the float64 reference (reference.cc, written from the formulas):
// awkward sizes, causal/window/additive/bool masks, GQA, float32 and float64, forward (native and
// bf16 products) and backward (one-pass and two-pass, most cases with a gradient through lse).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attention/kernels.h"
#include "attention/params.h"
#include "attnscale/attention.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using testing::random_tensor;
using testing::scaled_error;
using testing::value_at;

struct Case {
  std::int64_t B, Hq, Hkv, Nq, Nkv, dk, dv;
  int mask;  // 0 none, 1 causal, 2 bottom-right window (3, 1), 3 additive float mask, 4 bool mask
};

TEST(ScoreTransforms, MatchTheReferenceOnEveryTarget) {
  const Case cases[] = {{1, 1, 1, 1, 1, 1, 1, 1}, {2, 4, 2, 37, 71, 24, 13, 1}, {1, 3, 1, 67, 130, 7, 5, 2},
                        {2, 2, 2, 5, 66, 16, 9, 3}, {1, 8, 2, 97, 53, 64, 64, 4},
                        {1, 2, 1, 1, 2500, 32, 8, 1}};  // the last: decode path
  const std::int64_t budgets[] = {std::int64_t{64} << 20, 0};                     // one-pass, two-pass backward
  for (const std::string& target : detail::simd::available_targets()) {
    detail::simd::force_target(target);
    for (const DType dt : {DType::f32, DType::f64})
      for (const Case& c : cases)
        for (int extra = 0; extra < 5; ++extra) {
          SCOPED_TRACE(target + " " + std::string(dtype_name(dt)) + " Nq " + std::to_string(c.Nq) + " Nkv " +
                       std::to_string(c.Nkv) + " extra " + std::to_string(extra));
          const std::uint64_t seed = 100 + extra;
          const Tensor q = random_tensor(dt, {c.B, c.Hq, c.Nq, c.dk}, seed, 0);
          const Tensor k = random_tensor(dt, {c.B, c.Hkv, c.Nkv, c.dk}, seed, 1);
          const Tensor v = random_tensor(dt, {c.B, c.Hkv, c.Nkv, c.dv}, seed, 2);
          const Tensor dout = random_tensor(dt, {c.B, c.Hq, c.Nq, c.dv}, seed, 3);
          const Tensor slopes = random_tensor(DType::f64, {c.B, c.Hq}, seed, 4, 0.05);
          const Tensor sinks = random_tensor(DType::f32, {c.Hq}, seed, 5);
          const Tensor bias = random_tensor(dt, {c.B, c.Hq, c.Nq, c.Nkv}, seed, 6);
          const Tensor keep = random_tensor(DType::u8, {c.Nq, c.Nkv}, seed, 7);
          const Tensor dlse = random_tensor(dt, {c.B, c.Hq, c.Nq}, seed, 8);
          Options opt;
          opt.mask.causal = c.mask == 1;
          if (c.mask == 2) {
            opt.mask.align = Align::bottom_right;
            opt.mask.window_left = 3;
            opt.mask.window_right = 1;
          }
          if (c.mask == 3) opt.mask.explicit_mask = bias.view();
          if (c.mask == 4) opt.mask.explicit_mask = keep.view();
          if (extra == 0 || extra == 4) opt.softcap = 1.5;
          if (extra == 1 || extra == 4) opt.alibi_slopes = slopes.view();
          if (extra == 2 || extra == 4) opt.sinks = sinks.view();
          if (extra == 3 || extra == 4) opt.dropout = Dropout{0.3, seed, 7};
          Tensor out(dt, {c.B, c.Hq, c.Nq, c.dv}), lse(dt, {c.B, c.Hq, c.Nq});
          Tensor ref(DType::f64, {c.B, c.Hq, c.Nq, c.dv}), ref_lse(DType::f64, {c.B, c.Hq, c.Nq});
          forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt);
          reference::forward(q.view(), k.view(), v.view(), {ref.view(), ref_lse.view()}, opt);
          const double tol = dt == DType::f64 ? 1e-12 : 3e-5;
          EXPECT_LE(scaled_error(out, ref), tol);
          EXPECT_LE(scaled_error(lse, ref_lse), tol);
          if (dt == DType::f32) {  // bf16 products: 8 significant bits
            Options bf = opt;
            bf.compute = Compute::bf16;
            Tensor ob(dt, {c.B, c.Hq, c.Nq, c.dv});
            forward(q.view(), k.view(), v.view(), {ob.view()}, bf);
            EXPECT_LE(scaled_error(ob, ref), 5e-2);
          }
          // Backward, with dsinks and dbias where they exist, and a gradient through lse (Options::dlse,
          // lse_gradient_test.cc) except with ALiBi alone.
          if (extra != 1) opt.dlse = dlse.view();
          Tensor rq(DType::f64, {c.B, c.Hq, c.Nq, c.dk}), rk(DType::f64, {c.B, c.Hkv, c.Nkv, c.dk}),
              rv(DType::f64, {c.B, c.Hkv, c.Nkv, c.dv}), rs(DType::f64, {c.Hq}), rb(DType::f64, {c.B, c.Hq, c.Nq, c.Nkv});
          Gradients want{rq.view(), rk.view(), rv.view()};
          if (!opt.sinks.empty()) want.dsinks = rs.view();
          if (c.mask == 3) want.dbias = rb.view();
          reference::backward(q.view(), k.view(), v.view(), dout.view(), want, opt);
          for (const std::int64_t budget : budgets) {
            const std::int64_t before = detail::set_backward_partial_budget(budget);
            Tensor dq(dt, {c.B, c.Hq, c.Nq, c.dk}), dk(dt, {c.B, c.Hkv, c.Nkv, c.dk}), dv(dt, {c.B, c.Hkv, c.Nkv, c.dv}),
                ds(dt, {c.Hq}), db(dt, {c.B, c.Hq, c.Nq, c.Nkv});
            testing::poison(db);
            Gradients got{dq.view(), dk.view(), dv.view()};
            if (!opt.sinks.empty()) got.dsinks = ds.view();
            if (c.mask == 3) got.dbias = db.view();
            backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), got, opt);
            detail::set_backward_partial_budget(before);
            const double gtol = dt == DType::f64 ? 1e-10 : 2e-4;
            EXPECT_LE(scaled_error(dq, rq), gtol) << "budget " << budget;
            EXPECT_LE(scaled_error(dk, rk), gtol) << "budget " << budget;
            EXPECT_LE(scaled_error(dv, rv), gtol) << "budget " << budget;
            if (!opt.sinks.empty()) {
              EXPECT_LE(scaled_error(ds, rs), gtol) << "dsinks, budget " << budget;
            }
            if (c.mask == 3) {
              EXPECT_LE(scaled_error(db, rb), gtol) << "dbias, budget " << budget;
            }
          }
        }
  }
  detail::simd::force_target("");
}

// The dropout mask is a pure function of its coordinates: the same bits for any thread count, and
// a different offset draws a different mask.
TEST(ScoreTransforms, DropoutIsTheSameForAnyThreadCount) {
  const Tensor q = random_tensor(DType::f32, {2, 3, 130, 16}, 9, 0), k = random_tensor(DType::f32, {2, 3, 90, 16}, 9, 1);
  const Tensor v = random_tensor(DType::f32, {2, 3, 90, 8}, 9, 2);
  std::vector<Tensor> outs;
  for (const int threads : {1, 2, 3, 0}) {
    Options opt;
    opt.dropout = Dropout{0.5, 42, 3};
    opt.threads = threads;
    outs.emplace_back(DType::f32, std::initializer_list<std::int64_t>{2, 3, 130, 8});
    forward(q.view(), k.view(), v.view(), {outs.back().view()}, opt);
  }
  for (const Tensor& o : outs) EXPECT_EQ(std::memcmp(o.data(), outs[0].data(), o.nbytes()), 0);
  Options other;
  other.dropout = Dropout{0.5, 42, 4};
  Tensor o4(DType::f32, {2, 3, 130, 8});
  forward(q.view(), k.view(), v.view(), {o4.view()}, other);
  EXPECT_NE(std::memcmp(o4.data(), outs[0].data(), o4.nbytes()), 0);
}

}  // namespace
}  // namespace attnscale
