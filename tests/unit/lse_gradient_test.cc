// The gradient through lse (Options::dlse): a loss that reads lse as well as out, as one that merges
// partial results by their lse does. Derivation: lse_i = log Σ_j e^(t_ij) (+ e^(sink_h)), so
// ∂lse_i/∂t_ij = P_ij and ∂lse_i/∂sink_h = P_sink; the score gradient P ∘ (dP − D) gains
// dlse_i·P_ij, i.e. D becomes D − dlse. Checked: the reference against finite differences of
// L = Σ dout ∘ out + Σ dlse ∘ lse, the kernels against the reference on every target (awkward
// sizes, masks, GQA, sinks, softcap, ALiBi, dropout, both backward paths: score_transforms_test.cc,
// which passes a dlse to most of its cases), bfloat16 inputs, a zero dlse giving the bits of none,
// any thread count the same bits, packed sequences, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attention/kernels.h"
#include "attention/params.h"
#include "attnscale/attention.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using testing::random_tensor;
using testing::rel_error;
using testing::scaled_error;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.numel() * dtype_size(a.dtype())) == 0;
}

TEST(LseGradient, ReferenceMatchesFiniteDifferences) {
  const std::int64_t B = 1, Hq = 2, Hkv = 1, Nq = 4, Nkv = 5, dk = 3, dv = 2;
  const Tensor q = random_tensor(DType::f64, {B, Hq, Nq, dk}, 12, 0), k = random_tensor(DType::f64, {B, Hkv, Nkv, dk}, 12, 1),
               v = random_tensor(DType::f64, {B, Hkv, Nkv, dv}, 12, 2),
               dout = random_tensor(DType::f64, {B, Hq, Nq, dv}, 12, 3),
               dlse = random_tensor(DType::f64, {B, Hq, Nq}, 12, 4), sinks = random_tensor(DType::f64, {Hq}, 12, 5),
               bias = random_tensor(DType::f64, {B, Hq, Nq, Nkv}, 12, 6);
  Options opt;
  opt.mask.causal = true;
  opt.mask.align = Align::bottom_right;
  opt.mask.explicit_mask = bias.view();
  opt.sinks = sinks.view();
  opt.softcap = 2.0;
  Options with_dlse = opt;
  with_dlse.dlse = dlse.view();
  Tensor dq(DType::f64, {B, Hq, Nq, dk}), dk_(DType::f64, {B, Hkv, Nkv, dk}), dv_(DType::f64, {B, Hkv, Nkv, dv}),
      ds(DType::f64, {Hq}), db(DType::f64, {B, Hq, Nq, Nkv});
  reference::backward(q.view(), k.view(), v.view(), dout.view(),
                      {dq.view(), dk_.view(), dv_.view(), ds.view(), db.view()}, with_dlse);
  auto loss = [&]() {
    Tensor out(DType::f64, {B, Hq, Nq, dv}), lse(DType::f64, {B, Hq, Nq});
    reference::forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt);
    double l = 0;
    for (std::int64_t i = 0; i < out.numel(); ++i) l += out.as<double>()[i] * dout.as<double>()[i];
    for (std::int64_t i = 0; i < lse.numel(); ++i) l += lse.as<double>()[i] * dlse.as<double>()[i];
    return l;
  };
  // dbias is 0 where the causal mask hides the pair, and so is the difference (bias unused there).
  for (auto [x, dx] : {std::pair{&q, &dq}, {&k, &dk_}, {&v, &dv_}, {&sinks, &ds}, {&bias, &db}})
    EXPECT_LE(testing::central_difference_error(*x, *dx, loss), 1e-7);
}

TEST(LseGradient, BfloatInputsMatchTheReference) {
  const std::int64_t B = 1, Hq = 4, Hkv = 2, Nq = 61, Nkv = 83, d = 32;
  const Tensor q = random_tensor(DType::bf16, {B, Hq, Nq, d}, 51, 0), k = random_tensor(DType::bf16, {B, Hkv, Nkv, d}, 51, 1),
               v = random_tensor(DType::bf16, {B, Hkv, Nkv, d}, 51, 2), dout = random_tensor(DType::bf16, {B, Hq, Nq, d}, 51, 3),
               dlse = random_tensor(DType::f32, {B, Hq, Nq}, 51, 4);
  Options opt;
  opt.mask.causal = true;
  Tensor out(DType::bf16, {B, Hq, Nq, d}), lse(DType::f32, {B, Hq, Nq});
  forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt);
  opt.dlse = dlse.view();
  Tensor dq(DType::bf16, {B, Hq, Nq, d}), dk(DType::bf16, {B, Hkv, Nkv, d}), dv(DType::bf16, {B, Hkv, Nkv, d});
  Tensor rq(DType::f64, {B, Hq, Nq, d}), rk(DType::f64, {B, Hkv, Nkv, d}), rv(DType::f64, {B, Hkv, Nkv, d});
  backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view()}, opt);
  reference::backward(q.view(), k.view(), v.view(), dout.view(), {rq.view(), rk.view(), rv.view()}, opt);
  EXPECT_LE(rel_error(dq.view(), rq.view()), 2e-2);
  EXPECT_LE(rel_error(dk.view(), rk.view()), 2e-2);
  EXPECT_LE(rel_error(dv.view(), rv.view()), 2e-2);
}

// dlse = 0 is a loss on out alone: the same bits as no dlse (D − 0 = D). And any thread count
// gives the same bits with a dlse, as without.
TEST(LseGradient, ZeroGivesTheBitsOfNoneAndThreadsTheSameBits) {
  const std::int64_t B = 2, Hq = 6, Hkv = 3, Nq = 131, Nkv = 97, d = 40;
  const Tensor q = random_tensor(DType::f32, {B, Hq, Nq, d}, 61, 0), k = random_tensor(DType::f32, {B, Hkv, Nkv, d}, 61, 1),
               v = random_tensor(DType::f32, {B, Hkv, Nkv, d}, 61, 2), dout = random_tensor(DType::f32, {B, Hq, Nq, d}, 61, 3),
               dlse = random_tensor(DType::f32, {B, Hq, Nq}, 61, 4);
  Tensor zero(DType::f32, {B, Hq, Nq});
  std::memset(zero.data(), 0, zero.numel() * sizeof(float));
  Options opt;
  opt.mask.causal = true;
  opt.mask.align = Align::bottom_right;
  Tensor out(DType::f32, {B, Hq, Nq, d}), lse(DType::f32, {B, Hq, Nq});
  forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt);
  auto grads = [&](const Tensor* g, int threads) {
    Options o = opt;
    o.threads = threads;
    if (g) o.dlse = g->view();
    std::vector<Tensor> t;
    t.emplace_back(DType::f32, std::initializer_list<std::int64_t>{B, Hq, Nq, d});
    t.emplace_back(DType::f32, std::initializer_list<std::int64_t>{B, Hkv, Nkv, d});
    t.emplace_back(DType::f32, std::initializer_list<std::int64_t>{B, Hkv, Nkv, d});
    backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), {t[0].view(), t[1].view(), t[2].view()}, o);
    return t;
  };
  const std::vector<Tensor> none = grads(nullptr, 2), zeros = grads(&zero, 2), one = grads(&dlse, 1);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(same_bits(zeros[i], none[i])) << i;
  for (const int threads : {2, 3}) {
    const std::vector<Tensor> many = grads(&dlse, threads);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(same_bits(many[i], one[i])) << "threads " << threads << " grad " << i;
  }
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(same_bits(one[i], none[i])) << i;  // dlse reaches dq and dk
  EXPECT_TRUE(same_bits(one[2], none[2]));  // not dv: dV = Pᵀ·dO does not read D
}

// Packed sequences (cu_seqlens): each sequence's rows read their slice of dlse; a sequence with
// no key has lse = sink_h, so its rows add their dlse to dsinks.
TEST(LseGradient, PackedSequences) {
  const std::int64_t Hq = 4, Hkv = 2, d = 16;
  const std::vector<std::int64_t> cu_q{0, 5, 5, 17, 20}, cu_k{0, 9, 12, 30, 30};  // the last: no key
  const std::int64_t total_q = cu_q.back(), total_k = cu_k.back();
  const Tensor q = random_tensor(DType::f32, {Hq, total_q, d}, 71, 0), k = random_tensor(DType::f32, {Hkv, total_k, d}, 71, 1),
               v = random_tensor(DType::f32, {Hkv, total_k, d}, 71, 2), dout = random_tensor(DType::f32, {Hq, total_q, d}, 71, 3),
               dlse = random_tensor(DType::f32, {Hq, total_q}, 71, 4), sinks = random_tensor(DType::f32, {Hq}, 71, 5);
  Options opt;
  opt.cu_seqlens_q = cu_q;
  opt.cu_seqlens_k = cu_k;
  opt.mask.causal = true;
  opt.mask.align = Align::bottom_right;
  opt.sinks = sinks.view();
  Tensor out(DType::f32, {Hq, total_q, d}), lse(DType::f32, {Hq, total_q});
  forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt);
  opt.dlse = dlse.view();
  Tensor dq(DType::f32, {Hq, total_q, d}), dk(DType::f32, {Hkv, total_k, d}), dv(DType::f32, {Hkv, total_k, d}),
      ds(DType::f32, {Hq});
  Tensor rq(DType::f64, {Hq, total_q, d}), rk(DType::f64, {Hkv, total_k, d}), rv(DType::f64, {Hkv, total_k, d}),
      rs(DType::f64, {Hq});
  backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view(), ds.view()},
           opt);
  reference::backward(q.view(), k.view(), v.view(), dout.view(), {rq.view(), rk.view(), rv.view(), rs.view()}, opt);
  EXPECT_LE(rel_error(dq.view(), rq.view()), 1e-4);
  EXPECT_LE(rel_error(dk.view(), rk.view()), 1e-4);
  EXPECT_LE(rel_error(dv.view(), rv.view()), 1e-4);
  EXPECT_LE(rel_error(ds.view(), rs.view()), 1e-4);
  // A sequence with no key (rows 0-2) has lse = sink_h, so dsinks gains the sum of its rows' dlse:
  // the packed call's dsinks is that sum plus the dsinks of sequence 1 (rows 3-6, keys 0-4) alone.
  const std::vector<std::int64_t> two_q{0, 3, 7}, two_k{0, 0, 5};
  auto head_rows = [](const Tensor& t, std::int64_t i0, std::int64_t n) {  // rows [i0, i0 + n) of [H, N, ...]
    TensorView view = t.view();
    view.data = static_cast<char*>(view.data) + i0 * view.strides[1] * static_cast<std::int64_t>(dtype_size(view.dtype));
    view.shape[1] = n;
    return view;
  };
  Options packed = opt;
  packed.cu_seqlens_q = two_q;
  packed.cu_seqlens_k = two_k;
  packed.dlse = {};
  const TensorView q7 = head_rows(q, 0, 7), k5 = head_rows(k, 0, 5), v5 = head_rows(v, 0, 5), dout7 = head_rows(dout, 0, 7);
  Tensor o7(DType::f32, {Hq, 7, d}), l7(DType::f32, {Hq, 7});
  forward(q7, k5, v5, {o7.view(), l7.view()}, packed);
  packed.dlse = head_rows(dlse, 0, 7);
  Tensor pq(DType::f32, {Hq, 7, d}), pk(DType::f32, {Hkv, 5, d}), pv(DType::f32, {Hkv, 5, d}), ps(DType::f64, {Hq});
  backward(q7, k5, v5, o7.view(), l7.view(), dout7, {pq.view(), pk.view(), pv.view(), ps.view()}, packed);
  Options alone = opt;
  alone.cu_seqlens_q = {};
  alone.cu_seqlens_k = {};
  alone.dlse = {};
  Tensor o4(DType::f32, {Hq, 4, d}), l4(DType::f32, {Hq, 4});
  forward(head_rows(q, 3, 4), k5, v5, {o4.view(), l4.view()}, alone);
  alone.dlse = head_rows(dlse, 3, 4);
  Tensor aq(DType::f32, {Hq, 4, d}), ak(DType::f32, {Hkv, 5, d}), av(DType::f32, {Hkv, 5, d}), as(DType::f64, {Hq});
  backward(head_rows(q, 3, 4), k5, v5, o4.view(), l4.view(), head_rows(dout, 3, 4),
           {aq.view(), ak.view(), av.view(), as.view()}, alone);
  for (std::int64_t h = 0; h < Hq; ++h) {
    double want = as.as<double>()[h];
    for (std::int64_t i = 0; i < 3; ++i) want += dlse.as<float>()[h * total_q + i];
    EXPECT_NEAR(ps.as<double>()[h], want, 1e-12) << h;
  }
  EXPECT_TRUE(same_bits(pk, ak));
}

TEST(LseGradient, Refusals) {
  const Tensor q = random_tensor(DType::f32, {1, 2, 5, 8}, 81, 0), k = random_tensor(DType::f32, {1, 2, 7, 8}, 81, 1),
               v = random_tensor(DType::f32, {1, 2, 7, 8}, 81, 2), bad = random_tensor(DType::f32, {1, 2, 4}, 81, 3);
  Tensor out(DType::f32, {1, 2, 5, 8}), lse(DType::f32, {1, 2, 5}), dq(DType::f32, {1, 2, 5, 8}),
      dk(DType::f32, {1, 2, 7, 8}), dv(DType::f32, {1, 2, 7, 8});
  Options opt;
  opt.dlse = lse.view();
  try {
    forward(q.view(), k.view(), v.view(), {out.view()}, opt);
    FAIL() << "forward took a dlse";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("dlse: ", 0), 0u) << e.what();
  }
  opt.dlse = {};
  forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt);
  opt.dlse = bad.view();
  try {
    backward(q.view(), k.view(), v.view(), out.view(), lse.view(), out.view(), {dq.view(), dk.view(), dv.view()}, opt);
    FAIL() << "a dlse of the wrong shape was taken";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "dlse: expected shape [1, 2, 5], got [1, 2, 4]");
  }
}

}  // namespace
}  // namespace attnscale
