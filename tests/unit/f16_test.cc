// float16 storage (tensor.h): from_f16 is exact and to_f16 rounds to nearest even, checked against
// the value of every one of the 65536 bit patterns: each finite half converts to a float and back
// to itself; the midpoint of two neighbouring halves (exact in float32) rounds to the one with an
// even last bit, and a float32 step either side of it to the nearer; past the largest half,
// 65504, values below 65520 round down and the rest become infinity; NaN stays NaN; subnormal
// halves are fraction · 2^-24.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

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

}  // namespace
}  // namespace attnscale
