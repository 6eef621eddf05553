// Numerical robustness of forward() (and backward() on masked rows) on every compiled SIMD target:
// logits up to ±1e4 and down to denormals, rows entirely masked, mixed masks, NaN confined to
// the rows it touches, and the log-sum-exp correct to 1e-6 relative.
//
// Tolerances. The float64 reference sees the same (exactly converted) inputs, so the fast path's
// only error is its own arithmetic: a logit s = scale·Σ q_c k_c carries an absolute rounding error
// of about (dk + 2)·eps·M, with M = max |s| over the row, and exp() turns an absolute logit error
// into the same relative error in the probabilities; hence outputs are compared to within
// 8·(dk + 2)·eps·(M + 1)·max|v|. The log-sum-exp inherits the same absolute error, which is below
// 1e-6 relative whenever (dk + 2)·eps·M < 1e-6·|lse| — true for every case here, |lse| ≥ 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attention/params.h"
#include "attnscale/attention.h"
#include "random_tensors.h"

#if __has_include("attention/kernels.h")
#include "attention/kernels.h"
#define ATTNSCALE_HAVE_SIMD_TARGETS 1
#endif

namespace attnscale {
namespace {
using testing::random_tensor;
using testing::value_at;

// Every target the fast path can run on here; each test runs once per target.
std::vector<std::string> targets() {
#ifdef ATTNSCALE_HAVE_SIMD_TARGETS
  return detail::simd::available_targets();
#else
  return {"portable"};
#endif
}

struct ForceTarget {
  explicit ForceTarget(const std::string& name) {
#ifdef ATTNSCALE_HAVE_SIMD_TARGETS
    detail::simd::force_target(name);
#endif
  }
  ~ForceTarget() {
#ifdef ATTNSCALE_HAVE_SIMD_TARGETS
    detail::simd::force_target("");
#endif
  }
};

double eps_of(DType t) { return t == DType::f64 ? 0x1p-52 : 0x1p-23; }

struct Result {
  Tensor out, lse, probs;
};

// Forward with out, lse and probs (lse/probs in float64 for the reference).
Result run(bool reference, const Tensor& q, const Tensor& k, const Tensor& v, const Options& opt) {
  const DType od = reference ? DType::f64 : q.dtype();
  const std::int64_t B = q.dim(0), H = q.dim(1), Nq = q.dim(2), Nkv = k.dim(2), dv = v.dim(3);
  Result r{Tensor(od, {B, H, Nq, dv}), Tensor(reference ? DType::f64 : q.dtype(), {B, H, Nq}),
           Tensor(reference ? DType::f64 : q.dtype(), {B, H, Nq, Nkv})};
  testing::poison(r.out);
  testing::poison(r.lse);
  testing::poison(r.probs);
  const Outputs o{r.out.view(), r.lse.view(), r.probs.view()};
  if (reference)
    reference::forward(q.view(), k.view(), v.view(), o, opt);
  else
    forward(q.view(), k.view(), v.view(), o, opt);
  return r;
}

// max |x| over a tensor.
double max_abs(const Tensor& t) {
  double m = 0;
  for (std::int64_t n = 0; n < t.numel(); ++n) m = std::max(m, std::fabs(value_at(t.view(), n)));
  return m;
}

// Compares the fast path with the reference row by row: masked rows exactly (0, -inf, 0),
// others within the tolerance of the header comment; probabilities in [0, 1] summing to 1.
// A bound on scale·Σ_c |q_ic k_jc| + |bias_ij| over all (i, j): |scale|·max‖q_i‖·max‖k_j‖
// (Cauchy-Schwarz) plus the largest finite additive mask value.
double logit_bound(const Tensor& q, const Tensor& k, const Options& opt) {
  const auto max_row_norm = [](const Tensor& t) {
    const std::int64_t d = t.dim(t.rank() - 1);
    double m = 0;
    for (std::int64_t r = 0; r < t.numel() / d; ++r) {
      double s = 0;
      for (std::int64_t c = 0; c < d; ++c) s += value_at(t.view(), r * d + c) * value_at(t.view(), r * d + c);
      m = std::max(m, std::sqrt(s));
    }
    return m;
  };
  double bias = 0;
  const TensorView& mk = opt.mask.explicit_mask;
  if (!mk.empty() && mk.dtype != DType::u8)
    for (std::int64_t n = 0; n < mk.numel(); ++n)
      if (std::isfinite(value_at(mk, n))) bias = std::max(bias, std::fabs(value_at(mk, n)));
  return std::fabs(opt.scale.resolve(q.dim(3))) * max_row_norm(q) * max_row_norm(k) + bias;
}

// lse_from_bound: hold the lse to its absolute error 2·(dk + 2)·eps·(M + 1) as well as 1e-6
// relative (rows whose lse is small beside M, e.g. cancelling logits of order 1e4).
void expect_matches_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Options& opt,
                              bool lse_from_bound = false) {
  const Result f = run(false, q, k, v, opt), r = run(true, q, k, v, opt);
  const std::int64_t rows = q.dim(0) * q.dim(1) * q.dim(2), Nkv = k.dim(2), dv = v.dim(3), dk = q.dim(3);
  const double bound = logit_bound(q, k, opt);
  const double eps = eps_of(q.dtype());
  const double vmax = max_abs(v) + 1e-300;
  const double out_tol = std::max(8.0 * (dk + 2) * eps * (bound + 1), 16 * eps) * vmax;
  for (std::int64_t row = 0; row < rows; ++row) {
    const double lse_r = value_at(r.lse.view(), row), lse_f = value_at(f.lse.view(), row);
    if (lse_r == -INFINITY) {  // every key masked
      EXPECT_EQ(lse_f, -INFINITY) << "row " << row;
      for (std::int64_t c = 0; c < dv; ++c) EXPECT_EQ(value_at(f.out.view(), row * dv + c), 0.0) << "row " << row;
      for (std::int64_t j = 0; j < Nkv; ++j) EXPECT_EQ(value_at(f.probs.view(), row * Nkv + j), 0.0) << "row " << row;
      continue;
    }
    const double lse_tol = std::max(1e-6 * std::max(1.0, std::fabs(lse_r)),
                                    lse_from_bound ? 2.0 * (dk + 2) * eps * (bound + 1) : 0.0);
    EXPECT_NEAR(lse_f, lse_r, lse_tol) << "row " << row;
    for (std::int64_t c = 0; c < dv; ++c)
      ASSERT_NEAR(value_at(f.out.view(), row * dv + c), value_at(r.out.view(), row * dv + c), out_tol)
          << "row " << row << " col " << c;
    double sum = 0;
    for (std::int64_t j = 0; j < Nkv; ++j) {
      const double p = value_at(f.probs.view(), row * Nkv + j);
      ASSERT_GE(p, 0.0);
      ASSERT_LE(p, 1.0);
      sum += p;
    }
    EXPECT_NEAR(sum, 1.0, (Nkv + 4) * 4 * eps) << "row " << row;
  }
}

// A tensor of integers drawn uniformly from [-limit, limit]: products and sums of a few of them
// are exact in float32, so logits up to ±1e4 carry no input rounding.
Tensor integer_tensor(DType dtype, std::initializer_list<std::int64_t> shape, std::uint64_t seed, std::uint32_t stream,
                      int limit) {
  Tensor t = random_tensor(dtype, shape, seed, stream);
  const lab::Stream rng(seed, stream + 100, 0);
  for (std::int64_t n = 0; n < t.numel(); ++n) {
    const double x = std::floor(rng.uniform(n) * (2 * limit + 1)) - limit;
    if (dtype == DType::f32) t.as<float>()[n] = static_cast<float>(x);
    else t.as<double>()[n] = x;
  }
  return t;
}

class Robustness : public ::testing::TestWithParam<DType> {};

TEST_P(Robustness, LogitsUpTo1e4) {
  const DType dt = GetParam();
  for (const auto& target : targets()) {
    SCOPED_TRACE("target " + target);
    ForceTarget force(target);
    // dk = 1, scale 1, integers in [-100, 100]: logits are exact integers in [-1e4, 1e4].
    Options opt;
    opt.scale = Scale::rule(ScaleRule::none);
    for (std::int64_t nkv : {1, 7, 33, 130}) {
      const Tensor q = integer_tensor(dt, {1, 2, 9, 1}, 1, 0, 100), k = integer_tensor(dt, {1, 2, nkv, 1}, 1, 1, 100);
      const Tensor v = random_tensor(dt, {1, 2, nkv, 5}, 1, 2);
      expect_matches_reference(q, k, v, opt);
      opt.mask.causal = !opt.mask.causal;
      expect_matches_reference(q, k, v, opt);
    }
    // Non-integer logits of order ±1e4 over dk = 16 (sqrt scale): the rounding bound applies.
    const Tensor q = random_tensor(dt, {2, 2, 17, 16}, 2, 0, 50.0), k = random_tensor(dt, {2, 2, 31, 16}, 2, 1, 50.0);
    const Tensor v = random_tensor(dt, {2, 2, 31, 3}, 2, 2);
    Options sqrt_opt;
    expect_matches_reference(q, k, v, sqrt_opt);
  }
}

// Huge scales (±1e30, 1e4) and huge inputs, with logits still inside float32's range: probs stay
// in [0, 1] and sum to 1 (the scores of the probs pass are those of the statistics); out and lse
// are within the bounds of the header comment (lse: its absolute error, the logits cancelling).
TEST_P(Robustness, HugeScalesKeepProbabilities) {
  const DType dt = GetParam();
  for (const auto& target : targets()) {
    SCOPED_TRACE("target " + target);
    ForceTarget force(target);
    for (const auto& [scale, sigma] : std::vector<std::pair<double, double>>{
             {1e4, 1}, {1e4, 100}, {1e30, 1}, {-1e30, 1}, {1e30, 1e3}, {1, 1e17}, {-1, 1e17}}) {
      SCOPED_TRACE("scale " + std::to_string(scale) + " sigma " + std::to_string(sigma));
      const Tensor q = random_tensor(dt, {1, 2, 37, 2}, 3, 0, sigma), k = random_tensor(dt, {1, 2, 83, 2}, 3, 1, sigma);
      const Tensor v = random_tensor(dt, {1, 2, 83, 5}, 3, 2);
      Options opt;
      opt.scale = Scale::value(scale);
      expect_matches_reference(q, k, v, opt, true);
      opt.mask.causal = true;
      expect_matches_reference(q, k, v, opt, true);
      opt.mask.causal = false;
      opt.mask.window_left = 9;
      opt.mask.window_right = 70;
      expect_matches_reference(q, k, v, opt, true);
    }
  }
}

TEST_P(Robustness, DenormalLogitsGiveUniformWeights) {
  const DType dt = GetParam();
  // Entries whose products are denormal (or underflow to zero): every logit is ~0, so every
  // visible key weighs 1/Nkv, out is the mean of v and lse = log(Nkv).
  const double tiny = dt == DType::f64 ? 1e-160 : 1e-20;
  for (const auto& target : targets()) {
    SCOPED_TRACE("target " + target);
    ForceTarget force(target);
    for (std::int64_t nkv : {1, 5, 64, 129}) {
      Tensor q = random_tensor(dt, {1, 1, 6, 8}, 3, 0, tiny), k = random_tensor(dt, {1, 1, nkv, 8}, 3, 1, tiny);
      const Tensor v = random_tensor(dt, {1, 1, nkv, 4}, 3, 2);
      expect_matches_reference(q, k, v, Options{});
      const Result f = run(false, q, k, v, Options{});
      for (std::int64_t i = 0; i < 6; ++i) {
        EXPECT_NEAR(value_at(f.lse.view(), i), std::log(static_cast<double>(nkv)),
                    1e-6 * std::max(1.0, std::log(static_cast<double>(nkv))));
        for (std::int64_t c = 0; c < 4; ++c) {
          double mean = 0;
          for (std::int64_t j = 0; j < nkv; ++j) mean += value_at(v.view(), j * 4 + c) / nkv;
          EXPECT_NEAR(value_at(f.out.view(), i * 4 + c), mean, 64 * eps_of(dt) * (max_abs(v) + 1));
        }
      }
      // Denormal inputs themselves (float32: below 1.2e-38).
      if (dt == DType::f32) {
        for (std::int64_t n = 0; n < q.numel(); ++n) q.as<float>()[n] = 1e-41f * static_cast<float>(n % 7 - 3);
        expect_matches_reference(q, k, v, Options{});
      }
    }
  }
}

TEST_P(Robustness, RowsEntirelyMasked) {
  const DType dt = GetParam();
  for (const auto& target : targets()) {
    SCOPED_TRACE("target " + target);
    ForceTarget force(target);
    const Tensor q = random_tensor(dt, {2, 4, 11, 6}, 4, 0), k = random_tensor(dt, {2, 2, 5, 6}, 4, 1);
    const Tensor v = random_tensor(dt, {2, 2, 5, 3}, 4, 2);
    // (a) causal, bottom-right, Nq > Nkv: the first Nq - Nkv query rows see no key.
    Options a;
    a.mask.causal = true;
    a.mask.align = Align::bottom_right;
    expect_matches_reference(q, k, v, a);
    // (b) a window of width 0 on a diagonal that leaves the key range.
    Options b;
    b.mask.align = Align::bottom_right;
    b.mask.window_left = 0;
    b.mask.window_right = 0;
    expect_matches_reference(q, k, v, b);
    // (c) a boolean mask hiding every key of every third row, broadcast over batch and heads.
    Tensor m(DType::u8, {11, 5});
    for (std::int64_t i = 0; i < 11; ++i)
      for (std::int64_t j = 0; j < 5; ++j) m.as<std::uint8_t>()[i * 5 + j] = i % 3 == 0 ? 0 : (i + j) % 2 == 0 || j == 4;
    Options c;
    c.mask.explicit_mask = m.view();
    expect_matches_reference(q, k, v, c);
    // (d) an additive mask of -inf rows, per batch and head.
    Tensor add(dt, {2, 4, 11, 5});
    for (std::int64_t n = 0; n < add.numel(); ++n) {
      const double x = (n / 5) % 4 == 1 ? -INFINITY : 0.25 * (n % 3);
      if (dt == DType::f32) add.as<float>()[n] = static_cast<float>(x);
      else add.as<double>()[n] = x;
    }
    Options d;
    d.mask.explicit_mask = add.view();
    expect_matches_reference(q, k, v, d);

    // Backward through masked rows: every gradient finite, and a masked row's dq is 0.
    for (const Options* opt : {&a, &c, &d}) {
      Tensor out(dt, {2, 4, 11, 3}), lse(dt, {2, 4, 11});
      forward(q.view(), k.view(), v.view(), Outputs{out.view(), lse.view()}, *opt);
      const Tensor dout = random_tensor(dt, {2, 4, 11, 3}, 4, 3);
      Tensor dq(dt, {2, 4, 11, 6}), dk(dt, {2, 2, 5, 6}), dv(dt, {2, 2, 5, 3});
      backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), Gradients{dq.view(), dk.view(), dv.view()},
               *opt);
      for (const Tensor* g : {&dq, &dk, &dv})
        for (std::int64_t n = 0; n < g->numel(); ++n) ASSERT_TRUE(std::isfinite(value_at(g->view(), n)));
      for (std::int64_t row = 0; row < 2 * 4 * 11; ++row)
        if (value_at(lse.view(), row) == -INFINITY) {
          for (std::int64_t c = 0; c < 6; ++c) EXPECT_EQ(value_at(dq.view(), row * 6 + c), 0.0);
        }
    }
  }
}

TEST_P(Robustness, MixedMasksWithGroupedHeads) {
  const DType dt = GetParam();
  for (const auto& target : targets()) {
    SCOPED_TRACE("target " + target);
    ForceTarget force(target);
    for (std::int64_t nkv : {13, 64, 67}) {
      const Tensor q = random_tensor(dt, {2, 6, 7, 5}, 5, 0, 2.0), k = random_tensor(dt, {2, 3, nkv, 5}, 5, 1, 2.0);
      const Tensor v = random_tensor(dt, {2, 3, nkv, 3}, 5, 2);
      Tensor bias(dt, {1, 6, 7, nkv});  // finite biases and -inf holes, broadcast over the batch
      for (std::int64_t n = 0; n < bias.numel(); ++n) {
        const double x = n % 11 == 0 ? -INFINITY : 0.5 * static_cast<double>(n % 5) - 1.0;
        if (dt == DType::f32) bias.as<float>()[n] = static_cast<float>(x);
        else bias.as<double>()[n] = x;
      }
      for (Align align : {Align::top_left, Align::bottom_right}) {
        Options opt;
        opt.mask.causal = true;
        opt.mask.align = align;
        opt.mask.window_left = 4;
        opt.mask.window_right = 1;
        opt.mask.explicit_mask = bias.view();
        expect_matches_reference(q, k, v, opt);
        opt.mask.causal = false;
        expect_matches_reference(q, k, v, opt);
      }
    }
  }
}

// Bitwise equality of one output row, NaN patterns included.
bool same_row(const Tensor& a, const Tensor& b, std::int64_t row, std::int64_t width) {
  const std::size_t es = dtype_size(a.dtype());
  return std::memcmp(static_cast<const char*>(a.data()) + row * width * es,
                     static_cast<const char*>(b.data()) + row * width * es, width * es) == 0;
}

TEST_P(Robustness, NanStaysInItsRows) {
  const DType dt = GetParam();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto set = [&](Tensor& t, std::int64_t n, double x) {
    if (dt == DType::f32) t.as<float>()[n] = static_cast<float>(x);
    else t.as<double>()[n] = x;
  };
  for (const auto& target : targets()) {
    SCOPED_TRACE("target " + target);
    ForceTarget force(target);
    constexpr std::int64_t Nq = 9, Nkv = 70, dk = 8, dv = 4;
    const Tensor q0 = random_tensor(dt, {1, 1, Nq, dk}, 6, 0), k0 = random_tensor(dt, {1, 1, Nkv, dk}, 6, 1);
    const Tensor v0 = random_tensor(dt, {1, 1, Nkv, dv}, 6, 2);
    Options opt;
    opt.mask.causal = true;
    opt.mask.align = Align::bottom_right;  // query i sees keys j <= i + Nkv - Nq
    const Result clean = run(false, q0, k0, v0, opt);
    const std::int64_t first_key_of_last_rows = Nkv - Nq + 3;  // visible to rows i >= 3 only

    // NaN in query row 4: that row is NaN, every other row bit-identical to the clean run.
    {
      Tensor q = random_tensor(dt, {1, 1, Nq, dk}, 6, 0);
      set(q, 4 * dk + 2, nan);
      const Result r = run(false, q, k0, v0, opt);
      for (std::int64_t i = 0; i < Nq; ++i) {
        if (i == 4) {
          for (std::int64_t c = 0; c < dv; ++c) EXPECT_TRUE(std::isnan(value_at(r.out.view(), i * dv + c)));
          EXPECT_TRUE(std::isnan(value_at(r.lse.view(), i)));
        } else {
          EXPECT_TRUE(same_row(r.out, clean.out, i, dv)) << "row " << i;
          EXPECT_TRUE(same_row(r.lse, clean.lse, i, 1)) << "row " << i;
          EXPECT_TRUE(same_row(r.probs, clean.probs, i, Nkv)) << "row " << i;
        }
      }
    }
    // NaN in a key (or value) row that only rows >= 3 can see: rows 0..2 untouched, rows 3.. NaN.
    for (int which = 0; which < 2; ++which) {
      Tensor k = random_tensor(dt, {1, 1, Nkv, dk}, 6, 1), v = random_tensor(dt, {1, 1, Nkv, dv}, 6, 2);
      if (which == 0) set(k, first_key_of_last_rows * dk + 1, nan);
      else set(v, first_key_of_last_rows * dv + 1, nan);
      const Result r = run(false, q0, k, v, opt);
      for (std::int64_t i = 0; i < Nq; ++i) {
        if (i < 3) {
          EXPECT_TRUE(same_row(r.out, clean.out, i, dv)) << (which ? "v" : "k") << " row " << i;
          EXPECT_TRUE(same_row(r.lse, clean.lse, i, 1)) << (which ? "v" : "k") << " row " << i;
        } else {
          EXPECT_TRUE(std::isnan(value_at(r.out.view(), i * dv + 1))) << (which ? "v" : "k") << " row " << i;
        }
      }
    }
    // NaN in an additive mask entry (2, 5): row 2 only.
    Tensor bias(dt, {Nq, Nkv});
    for (std::int64_t n = 0; n < bias.numel(); ++n) set(bias, n, 0.0);
    Options with_bias = opt;
    with_bias.mask.explicit_mask = bias.view();
    const Result zero_bias = run(false, q0, k0, v0, with_bias);
    set(bias, 2 * Nkv + 5, nan);
    const Result r = run(false, q0, k0, v0, with_bias);
    for (std::int64_t i = 0; i < Nq; ++i) {
      if (i == 2) EXPECT_TRUE(std::isnan(value_at(r.out.view(), i * dv)));
      else EXPECT_TRUE(same_row(r.out, zero_bias.out, i, dv)) << "row " << i;
    }
  }
}

// Keys no query can see (the unused tail of a preallocated KV cache; keys before a window) may
// hold NaN and inf: no output row and no gradient may change, on any path. Each case is compared
// with the reference on the same inputs with those keys replaced by finite numbers; the gradient
// of a hidden key is exactly zero.
TEST_P(Robustness, HiddenNonFiniteKeysNeverReachARow) {
  const DType dt = GetParam();
  struct Case {
    std::int64_t Hq, Hkv, Nq, Nkv, dk, dv, left;  // left: window to the left (-1: none)
    bool bottom_right;
    std::int64_t bad0, bad1;  // keys [bad0, bad1) no query sees
  };
  const Case cases[] = {{1, 1, 3, 8, 16, 16, -1, false, 3, 8},  // causal: 3 queries over a cache of 8
                        {4, 2, 5, 40, 7, 9, -1, false, 5, 40},   // GQA, awkward dims
                        {2, 1, 70, 131, 33, 5, -1, false, 70, 131},
                        // window of 2 at the bottom right: keys 0..32 before every row's window,
                        // whose first key (33) is odd
                        {2, 2, 5, 40, 8, 8, 2, true, 0, 33}};
  const double bad_values[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()};
  for (const auto& target : targets()) {
    SCOPED_TRACE("target " + target);
    ForceTarget force(target);
    for (const Case& c : cases)
      for (const double bad : bad_values)
        for (const Compute compute : {Compute::native, Compute::bf16}) {
          if (compute == Compute::bf16 && dt != DType::f32) continue;
          SCOPED_TRACE("Nq " + std::to_string(c.Nq) + " Nkv " + std::to_string(c.Nkv) + " bad " + std::to_string(bad) +
                       (compute == Compute::bf16 ? " bf16" : " native"));
          Options opt;
          opt.mask.causal = true;
          opt.mask.window_left = c.left;
          opt.mask.align = c.bottom_right ? Align::bottom_right : Align::top_left;
          opt.compute = compute;
          const Tensor q = random_tensor(dt, {1, c.Hq, c.Nq, c.dk}, 8, 0);
          Tensor k = random_tensor(dt, {1, c.Hkv, c.Nkv, c.dk}, 8, 1), v = random_tensor(dt, {1, c.Hkv, c.Nkv, c.dv}, 8, 2);
          const Result clean = run(true, q, k, v, opt);
          const auto poison_keys = [&](Tensor& t, std::int64_t d) {
            for (std::int64_t h = 0; h < c.Hkv; ++h)
              for (std::int64_t j = c.bad0; j < c.bad1; ++j)
                for (std::int64_t e = 0; e < d; ++e) {
                  const std::int64_t n = (h * c.Nkv + j) * d + e;
                  if (dt == DType::f32) t.as<float>()[n] = static_cast<float>(bad);
                  else t.as<double>()[n] = bad;
                }
          };
          poison_keys(k, c.dk);
          poison_keys(v, c.dv);
          const Result r = run(false, q, k, v, opt);
          const double tol = compute == Compute::bf16 ? 3e-2 : 1e3 * eps_of(dt);
          for (std::int64_t n = 0; n < r.out.numel(); ++n) {
            ASSERT_TRUE(std::isfinite(value_at(r.out.view(), n))) << "out element " << n;
            EXPECT_NEAR(value_at(r.out.view(), n), value_at(clean.out.view(), n), tol) << "out element " << n;
          }
          if (compute == Compute::bf16) continue;  // the backward has one arithmetic
          Tensor dout = random_tensor(dt, {1, c.Hq, c.Nq, c.dv}, 8, 3);
          Tensor dq(dt, {1, c.Hq, c.Nq, c.dk}), dk(dt, {1, c.Hkv, c.Nkv, c.dk}), dv(dt, {1, c.Hkv, c.Nkv, c.dv});
          backward(q.view(), k.view(), v.view(), r.out.view(), r.lse.view(), dout.view(),
                   {dq.view(), dk.view(), dv.view()}, opt);
          for (std::int64_t n = 0; n < dq.numel(); ++n) ASSERT_TRUE(std::isfinite(value_at(dq.view(), n))) << "dq " << n;
          for (std::int64_t h = 0; h < c.Hkv; ++h)
            for (std::int64_t j = 0; j < c.Nkv; ++j) {
              const bool hidden = j >= c.bad0 && j < c.bad1;
              for (std::int64_t e = 0; e < c.dk; ++e) {
                const double g = value_at(dk.view(), (h * c.Nkv + j) * c.dk + e);
                if (hidden) ASSERT_EQ(g, 0.0) << "dk of hidden key " << j;
                else ASSERT_TRUE(std::isfinite(g)) << "dk of key " << j;
              }
              for (std::int64_t e = 0; e < c.dv; ++e) {
                const double g = value_at(dv.view(), (h * c.Nkv + j) * c.dv + e);
                if (hidden) ASSERT_EQ(g, 0.0) << "dv of hidden key " << j;
                else ASSERT_TRUE(std::isfinite(g)) << "dv of key " << j;
              }
            }
        }
  }
}

// lse to 1e-6 relative (to max(1, |lse|)) for logits of order 1 in both precisions, and for
// logits of order 10 in float64. Float32 logits of order 10 carry absolute rounding errors of
// about (dk + 2)·eps·M from the dot product alone, which is more than 1e-6·|lse| when lse is
// small; there the bound of the header comment is asserted instead.
TEST_P(Robustness, LseWithin1e6RelativeOnAwkwardSizes) {
  const DType dt = GetParam();
  for (const auto& target : targets()) {
    SCOPED_TRACE("target " + target);
    ForceTarget force(target);
    for (double sigma : {1.0, 3.0})
      for (std::int64_t n : {1, 3, 17, 64, 129})
        for (std::int64_t dk : {1, 7, 64}) {
          const Tensor q = random_tensor(dt, {1, 2, n, dk}, 7, 0, sigma), k = random_tensor(dt, {1, 1, n + 2, dk}, 7, 1, sigma);
          const Tensor v = random_tensor(dt, {1, 1, n + 2, 2}, 7, 2);
          for (bool causal : {false, true}) {
            Options opt;
            opt.mask.causal = causal;
            const double rounding = dt == DType::f32 && sigma > 1 ? (dk + 2) * eps_of(dt) * logit_bound(q, k, opt) : 0.0;
            const Result f = run(false, q, k, v, opt), r = run(true, q, k, v, opt);
            for (std::int64_t row = 0; row < 2 * n; ++row) {
              const double a = value_at(f.lse.view(), row), b = value_at(r.lse.view(), row);
              ASSERT_NEAR(a, b, 1e-6 * std::max(1.0, std::fabs(b)) + rounding)
                  << "sigma " << sigma << " n " << n << " dk " << dk << " row " << row;
            }
          }
        }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Robustness, ::testing::Values(DType::f32, DType::f64),
                         [](const auto& info) { return std::string(info.param == DType::f32 ? "f32" : "f64"); });

}  // namespace
}  // namespace attnscale
