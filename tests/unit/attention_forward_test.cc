// forward() against the float64 reference on random inputs of awkward sizes, every mask kind and
// their combinations, GQA, strided views, fully masked rows and huge logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attention/tiles.h"
#include "attnscale/attention.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using testing::poison;
using testing::random_tensor;
using testing::rel_error;

enum class MaskKind { none, causal_tl, causal_br, window, window_causal, keep, additive, all };

struct Case {
  std::int64_t B, Hq, Hkv, Nq, Nkv, dk, dv;
  MaskKind mask = MaskKind::none;
  DType dtype = DType::f32;
  double sigma = 1.0;  // input spread: large values give huge logits
  Scale scale{};
};

const char* mask_name(MaskKind m) {
  constexpr const char* names[] = {"none", "causalTL", "causalBR", "window", "windowCausal", "keep", "additive", "all"};
  return names[static_cast<int>(m)];
}

std::string name(const Case& c) {
  return std::string("B") + std::to_string(c.B) + "_Hq" + std::to_string(c.Hq) + "_Hkv" + std::to_string(c.Hkv) + "_Nq" +
         std::to_string(c.Nq) + "_Nkv" + std::to_string(c.Nkv) + "_dk" + std::to_string(c.dk) + "_dv" +
         std::to_string(c.dv) + "_" + mask_name(c.mask) + (c.dtype == DType::f64 ? "_f64" : "_f32");
}
// gtest prints parameters with this (instead of their bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << name(c); }

// Runs forward and reference on the same inputs; returns the relative errors of out, lse, probs.
struct Errors {
  double out, lse, probs;
};
Errors compare(const Case& c, std::uint64_t seed) {
  const Tensor q = random_tensor(c.dtype, {c.B, c.Hq, c.Nq, c.dk}, seed, 0, c.sigma);
  const Tensor k = random_tensor(c.dtype, {c.B, c.Hkv, c.Nkv, c.dk}, seed, 1, c.sigma);
  const Tensor v = random_tensor(c.dtype, {c.B, c.Hkv, c.Nkv, c.dv}, seed, 2);
  Options opt;
  opt.scale = c.scale;
  Tensor mask;
  switch (c.mask) {
    case MaskKind::none: break;
    case MaskKind::causal_tl: opt.mask.causal = true; break;
    case MaskKind::causal_br: opt.mask.causal = true; opt.mask.align = Align::bottom_right; break;
    case MaskKind::window: opt.mask.window_left = 5; opt.mask.window_right = 3; break;
    case MaskKind::window_causal: opt.mask.causal = true; opt.mask.window_left = 7; break;
    case MaskKind::keep: mask = random_tensor(DType::u8, {c.Nq, c.Nkv}, seed, 3); break;
    case MaskKind::additive: mask = random_tensor(DType::f32, {c.B, 1, c.Nq, c.Nkv}, seed, 3); break;
    case MaskKind::all:
      opt.mask.causal = true;
      opt.mask.align = Align::bottom_right;
      opt.mask.window_left = 9;
      mask = random_tensor(DType::u8, {1, c.Hq, c.Nq, c.Nkv}, seed, 3);
      break;
  }
  if (!mask.empty()) opt.mask.explicit_mask = mask.view();
  Tensor out(c.dtype, {c.B, c.Hq, c.Nq, c.dv}), lse(c.dtype, {c.B, c.Hq, c.Nq}),
      probs(c.dtype, {c.B, c.Hq, c.Nq, c.Nkv});
  poison(out);
  poison(lse);
  poison(probs);
  Tensor ro(DType::f64, {c.B, c.Hq, c.Nq, c.dv}), rl(DType::f64, {c.B, c.Hq, c.Nq}),
      rp(DType::f64, {c.B, c.Hq, c.Nq, c.Nkv});
  forward(q.view(), k.view(), v.view(), {out.view(), lse.view(), probs.view()}, opt);
  reference::forward(q.view(), k.view(), v.view(), {ro.view(), rl.view(), rp.view()}, opt);
  return {rel_error(out.view(), ro.view()), rel_error(lse.view(), rl.view()), rel_error(probs.view(), rp.view())};
}

class ForwardSweep : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardSweep, MatchesFloat64Reference) {
  const Case& c = GetParam();
  const Errors e = compare(c, 1000 + c.Nq * 7 + c.dk);
  const double tol = c.dtype == DType::f64 ? 1e-12 : 1e-5;
  EXPECT_LE(e.out, tol) << name(c);
  EXPECT_LE(e.lse, tol) << name(c);
  EXPECT_LE(e.probs, tol) << name(c);
}

std::vector<Case> sweep() {
  std::vector<Case> cases;
  // Awkward sizes: d in {1, 3, 59, 128}, N in {1, 2, 37, 1000}.
  for (std::int64_t d : {1, 3, 59, 128})
    for (std::int64_t n : {1, 2, 37})
      for (MaskKind m : {MaskKind::none, MaskKind::causal_tl, MaskKind::keep})
        cases.push_back({1, 2, 1, n, n, d, d, m});
  cases.push_back({1, 1, 1, 1000, 1000, 128, 128, MaskKind::none});
  cases.push_back({1, 1, 1, 1000, 1000, 59, 3, MaskKind::causal_br});
  // Every mask kind, cross-attention (Nq != Nkv both ways), GQA and MQA, dk != dv.
  for (MaskKind m : {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window,
                     MaskKind::window_causal, MaskKind::keep, MaskKind::additive, MaskKind::all}) {
    cases.push_back({2, 4, 2, 37, 53, 16, 24, m});
    cases.push_back({1, 6, 1, 61, 29, 3, 7, m});
    cases.push_back({2, 3, 3, 17, 17, 33, 5, m, DType::f64});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Shapes, ForwardSweep, ::testing::ValuesIn(sweep()),
                         [](const auto& info) { return name(info.param); });

TEST(Forward, HugeUnscaledLogitsStayFinite) {
  // sigma = 12, dk = 128, s = 1: logits of order ±1e4.
  for (std::int64_t n : {2, 37, 257}) {
    Case c{1, 2, 2, n, n, 128, 64, MaskKind::none, DType::f32, 12.0, Scale::rule(ScaleRule::none)};
    const Errors e = compare(c, 77 + n);
    EXPECT_LE(e.out, 1e-5);
    EXPECT_LE(e.probs, 1e-5);
    EXPECT_LE(e.lse, 1e-5);
  }
}

TEST(Forward, ScaleRules) {
  for (const char* rule : {"none", "sqrt", "linear", "0.37", "-2"}) {
    Case c{1, 1, 1, 9, 11, 64, 8, MaskKind::causal_br, DType::f32, 1.0, Scale::parse(rule)};
    EXPECT_LE(compare(c, 5).out, 1e-5) << rule;
  }
}

TEST(Forward, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  // Window (0, 0) top-left with Nq > Nkv: queries past the last key see nothing.
  Tensor q = random_tensor(DType::f32, {1, 1, 6, 4}, 9, 0), k = random_tensor(DType::f32, {1, 1, 3, 4}, 9, 1),
         v = random_tensor(DType::f32, {1, 1, 3, 5}, 9, 2);
  Tensor out(DType::f32, {1, 1, 6, 5}), lse(DType::f32, {1, 1, 6}), probs(DType::f32, {1, 1, 6, 3});
  Options opt;
  opt.mask.window_left = 0;
  opt.mask.window_right = 0;
  forward(q.view(), k.view(), v.view(), {out.view(), lse.view(), probs.view()}, opt);
  for (int i = 3; i < 6; ++i) {
    EXPECT_EQ(lse.as<float>()[i], -INFINITY);
    for (int c = 0; c < 5; ++c) EXPECT_EQ(out.as<float>()[i * 5 + c], 0.0f);
    for (int j = 0; j < 3; ++j) EXPECT_EQ(probs.as<float>()[i * 3 + j], 0.0f);
  }
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(probs.as<float>()[i * 3 + i], 1.0f);
  // An all-false boolean mask row does the same.
  Tensor keep(DType::u8, {6, 3});
  for (int n = 0; n < 18; ++n) keep.as<std::uint8_t>()[n] = n / 3 != 2;
  Options o2;
  o2.mask.explicit_mask = keep.view();
  forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, o2);
  EXPECT_EQ(lse.as<float>()[2], -INFINITY);
  EXPECT_TRUE(std::isfinite(lse.as<float>()[1]));
  for (int c = 0; c < 5; ++c) EXPECT_EQ(out.as<float>()[2 * 5 + c], 0.0f);
}

TEST(Forward, NaNStaysInTheRowsItTouches) {
  Tensor q = random_tensor(DType::f32, {1, 1, 8, 4}, 3, 0), k = random_tensor(DType::f32, {1, 1, 8, 4}, 3, 1),
         v = random_tensor(DType::f32, {1, 1, 8, 4}, 3, 2);
  q.as<float>()[2 * 4 + 1] = NAN;  // query row 2
  k.as<float>()[5 * 4 + 0] = NAN;  // key 5: seen by causal rows 5..7 only
  Tensor out(DType::f32, {1, 1, 8, 4});
  Options opt;
  opt.mask.causal = true;
  forward(q.view(), k.view(), v.view(), {out.view()}, opt);
  for (int i = 0; i < 8; ++i) {
    const bool expect_nan = i == 2 || i >= 5;
    for (int c = 0; c < 4; ++c) EXPECT_EQ(std::isnan(out.as<float>()[i * 4 + c]), expect_nan) << i;
  }
}

TEST(Forward, StridedViewsNeedNoCopy) {
  // A [B, N, H, d] buffer viewed as [B, H, N, d]; output written into a [B, N, H, dv] buffer.
  const std::int64_t B = 2, N = 19, H = 3, d = 8;
  Tensor qb = random_tensor(DType::f32, {B, N, H, d}, 11, 0), kb = random_tensor(DType::f32, {B, N, H, d}, 11, 1),
         vb = random_tensor(DType::f32, {B, N, H, d}, 11, 2), ob(DType::f32, {B, N, H, d});
  auto bhnd = [&](Tensor& t) { return testing::bnhd_view(t.data(), DType::f32, B, H, N, d); };
  Options opt;
  opt.mask.causal = true;
  forward(bhnd(qb), bhnd(kb), bhnd(vb), {bhnd(ob)}, opt);
  Tensor ref(DType::f64, {B, H, N, d});
  reference::forward(bhnd(qb), bhnd(kb), bhnd(vb), {ref.view()}, opt);
  EXPECT_LE(rel_error(bhnd(ob), ref.view()), 1e-5);
}

// V rows off 64-byte boundaries (numpy's 16-byte alignment; a row of 24 floats) are read from an
// aligned copy of each head: the same bits as aligned V, and the reference's values.
TEST(Forward, MisalignedValuesGiveTheAlignedBits) {
  for (const std::int64_t dv : {128, 24}) {
    const std::int64_t B = 2, Hq = 4, Hkv = 2, Nq = 131, Nkv = 97, dk = 40;
    const Tensor q = random_tensor(DType::f32, {B, Hq, Nq, dk}, 31, 0), k = random_tensor(DType::f32, {B, Hkv, Nkv, dk}, 31, 1),
                 v = random_tensor(DType::f32, {B, Hkv, Nkv, dv}, 31, 2);
    std::vector<float> shifted(static_cast<std::size_t>(v.numel()) + 16);
    float* base = shifted.data() + (16 - reinterpret_cast<std::uintptr_t>(shifted.data()) % 64 / 4) % 16 + 4;  // 16 bytes past a line
    std::memcpy(base, v.data(), v.nbytes());
    const TensorView vm = TensorView::contiguous(base, DType::f32, {B, Hkv, Nkv, dv});
    Tensor o1(DType::f32, {B, Hq, Nq, dv}), o2(DType::f32, {B, Hq, Nq, dv});
    Tensor ref(DType::f64, {B, Hq, Nq, dv});
    for (const bool causal : {false, true}) {
      Options opt;
      opt.mask.causal = causal;
      forward(q.view(), k.view(), v.view(), {o1.view()}, opt);
      forward(q.view(), k.view(), vm, {o2.view()}, opt);
      EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.nbytes())) << "dv " << dv << " causal " << causal;
      reference::forward(q.view(), k.view(), vm, {ref.view()}, opt);
      EXPECT_LE(rel_error(o2.view(), ref.view()), 1e-5) << "dv " << dv << " causal " << causal;
    }
  }
}

// A [B, N, H, d] buffer of each of q, k, v and out (FlashAttention's and PyTorch's layout) viewed
// as [B, H, N, d]: a head's rows H·d apart, which the forward reads from aligned copies of each head
// (K and V, AlignedRows::gapped) when enough query blocks read them (Nq = 1031: 17 blocks; 131: 3,
// read in place). The same bits as contiguous views, and the reference's values; a sliding window
// (no copies) too.
TEST(Forward, GappedRowsGiveTheContiguousBits) {
  for (const auto& [Nq, dv] : {std::pair<std::int64_t, std::int64_t>{1031, 128}, {1031, 24}, {131, 128}, {131, 24}}) {
    const std::int64_t B = Nq > 1000 ? 1 : 2, Hq = 4, Hkv = 2, Nkv = 97, dk = 40;
    ASSERT_EQ(Nq > 1000, (Nq + detail::kBr - 1) / detail::kBr >= detail::AlignedRows<float>::kGappedReaders);
    const Tensor q = random_tensor(DType::f32, {B, Hq, Nq, dk}, 37, 0), k = random_tensor(DType::f32, {B, Hkv, Nkv, dk}, 37, 1),
                 v = random_tensor(DType::f32, {B, Hkv, Nkv, dv}, 37, 2);
    // t's values in a [B, N, H, d] buffer, and the [B, H, N, d] view of it.
    std::vector<std::vector<float>> buffers;
    buffers.reserve(4);
    auto bnhd = [&](const Tensor* t, std::int64_t H, std::int64_t N, std::int64_t d) {
      buffers.emplace_back(static_cast<std::size_t>(B * N * H * d));
      const TensorView view = testing::bnhd_view(buffers.back().data(), DType::f32, B, H, N, d);
      if (t) convert(t->view(), view);
      return view;
    };
    const TensorView qg = bnhd(&q, Hq, Nq, dk), kg = bnhd(&k, Hkv, Nkv, dk), vg = bnhd(&v, Hkv, Nkv, dv),
                     og = bnhd(nullptr, Hq, Nq, dv);
    ASSERT_TRUE(detail::AlignedRows<float>::gapped(kg) && detail::AlignedRows<float>::gapped(vg));
    Tensor o(DType::f32, {B, Hq, Nq, dv}), contiguous(DType::f32, {B, Hq, Nq, dv}), ref(DType::f64, {B, Hq, Nq, dv});
    for (int mask = 0; mask < 3; ++mask) {
      Options opt;
      opt.mask.causal = mask == 1;
      if (mask == 2) opt.mask.window_left = 20, opt.mask.window_right = 5;
      forward(q.view(), k.view(), v.view(), {o.view()}, opt);
      forward(qg, kg, vg, {og}, opt);
      convert(og, contiguous.view());
      const std::string what =
          "Nq " + std::to_string(Nq) + " dv " + std::to_string(dv) + " mask " + std::to_string(mask);
      EXPECT_EQ(0, std::memcmp(o.data(), contiguous.data(), o.nbytes())) << what;
      reference::forward(qg, kg, vg, {ref.view()}, opt);
      EXPECT_LE(rel_error(og, ref.view()), 1e-5) << what;
    }
  }
}

// The mask tensor's entries as the tiles apply them (MaskRows, tiles.h: row pointers looked up once
// a tile, a boolean entry chosen by the bits) against mask_bias, the reference's reading, score by
// score: uint8, float32 and float64 masks with -inf and NaN entries, broadcast ([1, 1, 1, Nkv]) and
// strided views, causal runs, and scores that are -0, inf and NaN, pair by pair and a row's run at
// once. The same bits.
TEST(Forward, MaskRowsApplyTheMaskAsMaskBiasDoes) {
  const std::int64_t Nq = 37, Nkv = 53;
  for (DType dt : {DType::u8, DType::f32, DType::f64})
    for (int shape = 0; shape < 3; ++shape) {
      // shape 0: [1, 1, Nq, Nkv]; 1: [1, 1, 1, Nkv] broadcast over rows; 2: a transposed [Nkv, Nq] buffer.
      Tensor buffer = random_tensor(dt == DType::u8 ? DType::u8 : dt, {1, 1, Nkv, Nq}, 5 + shape, 0);
      if (dt != DType::u8)
        for (std::int64_t e = 0; e < Nkv * Nq; e += 7) {
          if (dt == DType::f32) buffer.as<float>()[e] = e % 2 ? -INFINITY : NAN;
          else buffer.as<double>()[e] = e % 2 ? -INFINITY : NAN;
        }
      detail::Params p;
      p.Nq = Nq, p.Nkv = Nkv, p.causal = shape == 0;
      p.mask = buffer.view();
      if (shape == 0) p.mask.strides[2] = Nkv, p.mask.strides[3] = 1;
      if (shape == 1) p.mask.strides[2] = 0, p.mask.strides[3] = 1;
      if (shape == 2) p.mask.strides[2] = 1, p.mask.strides[3] = Nq;
      p.mask.shape[2] = Nq, p.mask.shape[3] = Nkv;
      detail::RowBlock rb;
      for (std::int64_t i = 0; i < Nq; ++i) rb.add(p, 0, i);
      const float scores[] = {1.5f, -0.0f, 0.0f, INFINITY, -INFINITY, NAN, -3.25e30f};
      detail::with_mask_rows(p, rb, [&](const auto& mask) {
        for (std::int64_t r = 0; r < rb.n; ++r)
          for (std::int64_t j = 0; j < Nkv; ++j)
            for (float s : scores) {
              const double bias = detail::mask_bias(p, 0, 0, rb.i[r], j);
              const float want = j < rb.lo[r] || j >= rb.hi[r] || bias == -INFINITY ? -INFINITY : s + static_cast<float>(bias);
              const float got = mask.apply(rb, s, r, j);
              EXPECT_EQ(0, std::memcmp(&want, &got, sizeof(float))) << dtype_name(dt) << " shape " << shape << " r " << r
                                                                   << " j " << j << " s " << s;
            }
        // A row's run at once (the row layout's loop): the same values.
        for (std::int64_t r = 0; r < rb.n; ++r)
          for (float s : scores) {
            std::vector<float> row(static_cast<std::size_t>(Nkv), s);
            mask.apply_run(row.data(), r, rb.lo[r], rb.hi[r]);
            for (std::int64_t j = rb.lo[r]; j < rb.hi[r]; ++j) {
              const float want = mask.apply(rb, s, r, j);
              EXPECT_EQ(0, std::memcmp(&want, &row[static_cast<std::size_t>(j)], sizeof(float)))
                  << dtype_name(dt) << " shape " << shape << " r " << r << " j " << j << " s " << s;
            }
          }
      });
    }
}

TEST(Forward, ResultDoesNotDependOnThreads) {
  const Tensor q = random_tensor(DType::f32, {2, 4, 33, 16}, 21, 0), k = random_tensor(DType::f32, {2, 2, 40, 16}, 21, 1),
               v = random_tensor(DType::f32, {2, 2, 40, 16}, 21, 2);
  Tensor o1(DType::f32, {2, 4, 33, 16}), o2(DType::f32, {2, 4, 33, 16});
  Options a, b;
  a.threads = 1;
  b.threads = 2;
  forward(q.view(), k.view(), v.view(), {o1.view()}, a);
  forward(q.view(), k.view(), v.view(), {o2.view()}, b);
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.nbytes()));
}

TEST(Forward, LowerRankViewsAreBatchAndHeadOne) {
  const Tensor q = random_tensor(DType::f64, {5, 3}, 4, 0), k = random_tensor(DType::f64, {7, 3}, 4, 1),
               v = random_tensor(DType::f64, {7, 2}, 4, 2);
  Tensor o(DType::f64, {5, 2}), lse(DType::f64, {5}), ref(DType::f64, {1, 1, 5, 2});
  forward(q.view(), k.view(), v.view(), {o.view(), lse.view()});
  reference::forward(q.view(), k.view(), v.view(), {ref.view()});
  EXPECT_LE(rel_error(o.view(), ref.view()), 1e-12);
}

}  // namespace
}  // namespace attnscale
