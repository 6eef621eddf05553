// float16 storage (tensor.h): from_f16 is exact and to_f16 rounds to nearest even, checked against
// the value of every one of the 65536 bit patterns: each finite half converts to a float and back
// to itself; the midpoint of two neighbouring halves (exact in float32) rounds to the one with an
// even last bit, and a float32 step either side of it to the nearer; past the largest half,
// 65504, values below 65520 round down and the rest become infinity; NaN stays NaN; subnormal
// halves are fraction · 2^-24. convert() gives those conversions' bits (and to_bf16 / from_bf16's)
// on every SIMD target, for contiguous, strided and odd-length views, and refuses other dtypes and
// shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include <random>
#include <string>

#include "attention/kernels.h"
#include "attnscale/error.h"
#include "attnscale/tensor.h"

namespace attnscale {
namespace {

float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool is_nan_half(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

TEST(F16, EveryFiniteHalfRoundTripsExactly) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = from_f16(f16{bits});
    if (is_nan_half(bits)) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(is_nan_half(to_f16(f).bits)) << h;
      continue;
    }
    ASSERT_EQ(to_f16(f).bits, bits) << "half 0x" << std::hex << h;
  }
}

TEST(F16, ValuesOfKnownHalves) {
  EXPECT_EQ(from_f16(f16{0x3c00}), 1.0f);
  EXPECT_EQ(from_f16(f16{0xc000}), -2.0f);
  EXPECT_EQ(from_f16(f16{0x7bff}), 65504.0f);
  EXPECT_EQ(from_f16(f16{0x0001}), std::ldexp(1.0f, -24));  // the smallest subnormal
  EXPECT_EQ(from_f16(f16{0x03ff}), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(from_f16(f16{0x0400}), std::ldexp(1.0f, -14));  // the smallest normal
  EXPECT_EQ(from_f16(f16{0x7c00}), INFINITY);
  EXPECT_EQ(from_f16(f16{0xfc00}), -INFINITY);
  EXPECT_TRUE(std::signbit(from_f16(f16{0x8000})));
}

TEST(F16, TiesGoToEvenAndNeighboursToTheNearer) {
  // Neighbouring positive finite halves a, a + 1 (and the negatives): their midpoint is exact.
  for (std::uint32_t a = 0; a < 0x7bffu; ++a)
    for (const std::uint16_t sign : {std::uint16_t(0), std::uint16_t(0x8000)}) {
      const auto lo = static_cast<std::uint16_t>(a | sign), hi = static_cast<std::uint16_t>((a + 1) | sign);
      const float mid = 0.5f * (from_f16(f16{lo}) + from_f16(f16{hi}));
      const std::uint16_t even = (a & 1u) ? hi : lo;
      ASSERT_EQ(to_f16(mid).bits, even) << "between 0x" << std::hex << lo << " and 0x" << hi;
      std::uint32_t m;
      std::memcpy(&m, &mid, 4);
      const float toward_lo = bits_to_float(m - 1), toward_hi = bits_to_float(m + 1);  // |.| smaller, larger
      ASSERT_EQ(to_f16(toward_lo).bits, lo) << std::hex << lo;
      ASSERT_EQ(to_f16(toward_hi).bits, hi) << std::hex << hi;
    }
}

TEST(F16, OverflowAndSpecialValues) {
  EXPECT_EQ(to_f16(65519.996f).bits, 0x7bffu);
  EXPECT_EQ(to_f16(65520.0f).bits, 0x7c00u);
  EXPECT_EQ(to_f16(-1e9f).bits, 0xfc00u);
  EXPECT_EQ(to_f16(INFINITY).bits, 0x7c00u);
  EXPECT_EQ(to_f16(-0.0f).bits, 0x8000u);
  EXPECT_EQ(to_f16(std::ldexp(1.0f, -26)).bits, 0x0000u);  // a quarter of the smallest subnormal
  EXPECT_EQ(to_f16(std::ldexp(1.0f, -25)).bits, 0x0000u);  // half of it: a tie, to even (0)
  EXPECT_EQ(to_f16(std::ldexp(3.0f, -26)).bits, 0x0001u);  // three quarters
  EXPECT_TRUE(is_nan_half(to_f16(std::nanf("")).bits));
  EXPECT_TRUE(is_nan_half(to_f16(bits_to_float(0x7f800001u)).bits));  // a payload only in the low bits
}

// Every half bit pattern to float32 and back, in a contiguous row of 65536 + 7 values (vectors and
// a tail) and in a strided [5, 13] view; float32 values of random bits (every exponent) to float16;
// every bfloat16 bit pattern and the same float32 values to and from bfloat16; float64 through the
// scalar path; on every compiled target.
TEST(F16, ConvertMatchesTheScalarConversionsOnEveryTarget) {
  const std::int64_t n = 65536 + 7;
  Tensor halves(DType::f16, {n}), floats(DType::f32, {n}), back(DType::f16, {n}), wide(DType::f32, {n}),
      narrow(DType::f16, {n});
  std::mt19937 rng(7);
  for (std::int64_t i = 0; i < n; ++i) {
    halves.as<f16>()[i] = f16{static_cast<std::uint16_t>(i & 0xffff)};
    std::uint32_t u = rng();
    wide.as<float>()[i] = bits_to_float(u);
  }
  for (const std::string& target : detail::simd::available_targets()) {
    detail::simd::force_target(target);
    SCOPED_TRACE("target " + target);
    convert(halves.view(), floats.view());
    convert(floats.view(), back.view());
    convert(wide.view(), narrow.view());
    for (std::int64_t i = 0; i < n; ++i) {
      const f16 h = halves.as<f16>()[i];
      const float f = floats.as<float>()[i];
      if (is_nan_half(h.bits)) {
        ASSERT_TRUE(std::isnan(f)) << i;
        ASSERT_TRUE(is_nan_half(back.as<f16>()[i].bits)) << i;
      } else {
        const float want = from_f16(h);
        ASSERT_EQ(std::memcmp(&f, &want, 4), 0) << i;
        ASSERT_EQ(back.as<f16>()[i].bits, h.bits) << i;
      }
      const float x = wide.as<float>()[i];
      if (std::isnan(x)) ASSERT_TRUE(is_nan_half(narrow.as<f16>()[i].bits)) << i;
      else ASSERT_EQ(narrow.as<f16>()[i].bits, to_f16(x).bits) << "float bits 0x" << std::hex << i;
    }
    // bfloat16 rows (vectorised per target): every bit pattern to float32 exactly, and the random
    // float32 values to bfloat16 with to_bf16's bits (NaN included).
    Tensor bfs(DType::bf16, {n}), bf_wide(DType::f32, {n}), bf_narrow(DType::bf16, {n});
    for (std::int64_t i = 0; i < n; ++i) bfs.as<bf16>()[i] = bf16{static_cast<std::uint16_t>(i & 0xffff)};
    convert(bfs.view(), bf_wide.view());
    convert(wide.view(), bf_narrow.view());
    for (std::int64_t i = 0; i < n; ++i) {
      const float want = from_bf16(bfs.as<bf16>()[i]), got = bf_wide.as<float>()[i];
      ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "bf16 bits 0x" << std::hex << i;
      ASSERT_EQ(bf_narrow.as<bf16>()[i].bits, to_bf16(wide.as<float>()[i]).bits) << "float " << i;
    }
    // A strided view (every other column of a [5, 26] block) into a transposed one.
    Tensor block(DType::f32, {5, 26}), out(DType::f16, {13, 5});
    for (std::int64_t i = 0; i < block.numel(); ++i) block.as<float>()[i] = 0.37f * static_cast<float>(i) - 9.0f;
    const TensorView src = TensorView::strided(block.data(), DType::f32, {5, 13}, {26, 2});
    const TensorView dst = TensorView::strided(out.data(), DType::f16, {5, 13}, {1, 5});
    convert(src, dst);
    for (std::int64_t r = 0; r < 5; ++r)
      for (std::int64_t c = 0; c < 13; ++c)
        ASSERT_EQ(out.as<f16>()[c * 5 + r].bits, to_f16(block.as<float>()[r * 26 + 2 * c]).bits) << r << ", " << c;
  }
  detail::simd::force_target("");
  Tensor d(DType::f64, {3}), b(DType::bf16, {3}), h(DType::f16, {3});
  d.as<double>()[0] = 1.0 / 3, d.as<double>()[1] = -65504.0, d.as<double>()[2] = 1e-30;
  convert(d.view(), b.view());
  convert(b.view(), h.view());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(b.as<bf16>()[i].bits, to_bf16(static_cast<float>(d.as<double>()[i])).bits) << i;
    EXPECT_EQ(h.as<f16>()[i].bits, to_f16(from_bf16(b.as<bf16>()[i])).bits) << i;
  }
}

TEST(F16, ConvertRefusesOtherDtypesAndShapes) {
  Tensor a(DType::f32, {2, 3}), i8(DType::i8, {2, 3}), other(DType::f16, {3, 2});
  auto message = [](const TensorView& s, const TensorView& d) {
    try {
      convert(s, d);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(i8.view(), a.view()), "src: dtype must be float32, float64, bfloat16 or float16, got int8");
  EXPECT_EQ(message(a.view(), i8.view()), "dst: dtype must be float32, float64, bfloat16 or float16, got int8");
  EXPECT_EQ(message(a.view(), other.view()), "dst: shape [3, 2] differs from src's [2, 3]");
}

}  // namespace
}  // namespace attnscale
