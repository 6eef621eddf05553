// merge_partials() (attnscale/decode.h): attention over key chunks, merged, equals attention over
// all keys; chunks that show a row nothing are neutral; mismatched shapes are rejected.
#include <gtest/gtest.h>

#include <cmath>

#include "attnscale/attention.h"
#include "attnscale/decode.h"
#include "attnscale/error.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using testing::poison;
using testing::random_tensor;
using testing::rel_error;

TensorView keys(const Tensor& t, std::int64_t j0, std::int64_t j1) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + j0 * v.strides[2] * dtype_size(v.dtype);
  v.shape[2] = j1 - j0;
  return v;
}

TEST(MergePartials, ChunksMergeToFullAttention) {
  const std::int64_t B = 2, Hq = 4, Hkv = 2, Nq = 5, Nkv = 301, dk = 16, dv = 9;
  const Tensor q = random_tensor(DType::f32, {B, Hq, Nq, dk}, 3, 0), k = random_tensor(DType::f32, {B, Hkv, Nkv, dk}, 3, 1),
               v = random_tensor(DType::f32, {B, Hkv, Nkv, dv}, 3, 2);
  const std::int64_t cuts[] = {0, 1, 130, 301};
  std::vector<Tensor> o, l;
  std::vector<TensorView> ov, lv;
  for (int c = 0; c < 3; ++c) {
    o.emplace_back(DType::f32, std::initializer_list<std::int64_t>{B, Hq, Nq, dv});
    l.emplace_back(DType::f32, std::initializer_list<std::int64_t>{B, Hq, Nq});
    forward(q.view(), keys(k, cuts[c], cuts[c + 1]), keys(v, cuts[c], cuts[c + 1]), {o.back().view(), l.back().view()});
  }
  for (int c = 0; c < 3; ++c) {
    ov.push_back(o[c].view());
    lv.push_back(l[c].view());
  }
  Tensor out(DType::f64, {B, Hq, Nq, dv}), lse(DType::f64, {B, Hq, Nq}), ro(DType::f64, {B, Hq, Nq, dv}),
      rl(DType::f64, {B, Hq, Nq});
  poison(out);
  poison(lse);
  merge_partials(ov, lv, out.view(), lse.view());
  reference::forward(q.view(), k.view(), v.view(), {ro.view(), rl.view()});
  EXPECT_LE(rel_error(out.view(), ro.view()), 1e-6);
  EXPECT_LE(rel_error(lse.view(), rl.view()), 1e-6);
}

TEST(MergePartials, EmptyChunksAreNeutralAndAllEmptyGivesZero) {
  Tensor o1(DType::f64, {2, 3}), o2(DType::f64, {2, 3}), l1(DType::f64, {2}), l2(DType::f64, {2});
  for (int n = 0; n < 6; ++n) {
    o1.as<double>()[n] = n;
    o2.as<double>()[n] = 100 + n;
  }
  l1.as<double>()[0] = 0.5;
  l2.as<double>()[0] = -INFINITY;  // row 0: only chunk 1
  l1.as<double>()[1] = -INFINITY;
  l2.as<double>()[1] = -INFINITY;  // row 1: nothing
  Tensor out(DType::f32, {2, 3}), lse(DType::f32, {2});
  merge_partials({o1.view(), o2.view()}, {l1.view(), l2.view()}, out.view(), lse.view());
  EXPECT_FLOAT_EQ(lse.as<float>()[0], 0.5f);
  for (int c = 0; c < 3; ++c) EXPECT_FLOAT_EQ(out.as<float>()[c], c);
  EXPECT_EQ(lse.as<float>()[1], -INFINITY);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(out.as<float>()[3 + c], 0.0f);
}

TEST(MergePartials, RejectsMismatchedShapes) {
  Tensor o(DType::f32, {2, 3}), l(DType::f32, {2}), bad(DType::f32, {3});
  try {
    merge_partials({o.view()}, {bad.view()}, o.view(), l.view());
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "lses[0]: shape [3] must equal lse's [2]");
  }
  EXPECT_THROW(merge_partials({}, {}, o.view(), l.view()), Error);
  EXPECT_THROW(merge_partials({o.view()}, {l.view()}, o.view(), bad.view()), Error);
}

// Decode (one query, many keys: keys split across threads) gives the same bits for any thread
// count, as do multi-block forward and backward.
TEST(Determinism, SameBitsForAnyThreadCount) {
  const Tensor q = random_tensor(DType::f32, {1, 4, 150, 32}, 8, 0), k = random_tensor(DType::f32, {1, 2, 200, 32}, 8, 1),
               v = random_tensor(DType::f32, {1, 2, 200, 16}, 8, 2), dout = random_tensor(DType::f32, {1, 4, 150, 16}, 8, 3);
  const Tensor q1 = random_tensor(DType::f32, {1, 4, 1, 32}, 8, 4), kl = random_tensor(DType::f32, {1, 2, 5000, 32}, 8, 5),
               vl = random_tensor(DType::f32, {1, 2, 5000, 16}, 8, 6);
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2, 3}) {
    Options opt;
    opt.threads = threads;
    opt.mask.causal = true;
    Tensor out(DType::f32, {1, 4, 150, 16}), lse(DType::f32, {1, 4, 150}), dq(DType::f32, {1, 4, 150, 32}),
        dk(DType::f32, {1, 2, 200, 32}), dv(DType::f32, {1, 2, 200, 16}), od(DType::f32, {1, 4, 1, 16});
    forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt);
    backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view()}, opt);
    Tensor ob(DType::f32, {1, 4, 150, 16});  // the bf16 forward (K, V packed once per KV head)
    Options bf = opt;
    bf.compute = Compute::bf16;
    forward(q.view(), k.view(), v.view(), {ob.view()}, bf);
    opt.mask.align = Align::bottom_right;
    forward(q1.view(), kl.view(), vl.view(), {od.view()}, opt);
    std::vector<float> all;
    for (const Tensor* t : {&out, &lse, &dq, &dk, &dv, &od, &ob})
      all.insert(all.end(), t->as<float>(), t->as<float>() + t->numel());
    runs.push_back(all);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

}  // namespace
}  // namespace attnscale
