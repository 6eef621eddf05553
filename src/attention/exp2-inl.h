// Per-target float32 arithmetic shared by the SIMD kernels (kernels-inl.h, kv_row_stream-inl.h): a
// multiply-add rounded once on every target, and e^x through 2^x. Included once per Highway
// target, like the kernels that use it; any vector width (D), so a 128-bit part of a wider
// target's vectors works too.
#if defined(ATTNSCALE_ATTENTION_EXP2_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNSCALE_ATTENTION_EXP2_INL_H_
#undef ATTNSCALE_ATTENTION_EXP2_INL_H_
#else
#define ATTNSCALE_ATTENTION_EXP2_INL_H_
#endif

#include <cstddef>

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// a·b + c rounded once, on every target. Targets without a fused multiply-add (scalar, emulated
// 128-bit) compute hn::MulAdd as a·b then + c, two roundings: every dot product of the GEMM and
// the softmax gradient then errs about √2 times as much as on AVX2/AVX-512 (seen: the backward's
// dq at d_k = 256 at 1.16x AVX2's error). The product of two floats is exact in double, so one
// double add rounded to float gives the fused result (up to rare double roundings).
#if HWY_TARGET == HWY_SCALAR
HWY_INLINE VF FusedMulAdd(VF a, VF b, VF c) {
  VF r;
  r.raw = static_cast<float>(static_cast<double>(a.raw) * b.raw + c.raw);
  return r;
}
#elif HWY_TARGET == HWY_EMU128
HWY_INLINE VF FusedMulAdd(VF a, VF b, VF c) {
  VF r;
  for (size_t i = 0; i < sizeof(r.raw) / sizeof(float); ++i)
    r.raw[i] = static_cast<float>(static_cast<double>(a.raw[i]) * b.raw[i] + c.raw[i]);
  return r;
}
#else
template <class V>
HWY_INLINE V FusedMulAdd(V a, V b, V c) {
  return hn::MulAdd(a, b, c);
}
#endif

// 2^x for x in base-2 units. Derivation: x = n + f with n = round(x), f in [-1/2, 1/2];
// 2^x = 2^n · 2^f, 2^f by the degree-6 minimax polynomial of Cephes' exp2f (relative error
// < 2e-7). NaN passes through; exp2(-inf) = 0, the value masked scores must give.
//
// AVX-512 (ScaleByPow2OrZero below): x is clamped above at 127 and 2^f · 2^n is one vscalefps,
// correctly rounded; where n <= -127 the result is 0 (the scaling's mask zeroes those lanes,
// Exp2). Min returns its second operand when one is NaN, so with x second a NaN survives the
// clamp and every later step.
// Elsewhere: x is clamped to [-127, 127] and 2^n built from the exponent bits (n + 127) << 23;
// at -127 the exponent field is 0 and the result exactly 0, and NaN, which the clamp hides, is put
// back by a select.
// Both agree bit for bit (the product p·2^n is exact or rounded the same; both 0 from n = -127).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// p·2^n where n >= -126.5 or n is NaN, else 0: vscalefps with its lanes zeroed by a mask (one
// compare; the same bits as scaling by n = -inf there, as p > 0).
HWY_INLINE __m512 ScaleByPow2OrZero(__m512 p, __m512 n) {
  return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(n, _mm512_set1_ps(-126.5f), _CMP_NLT_UQ), p, n);
}
HWY_INLINE __m256 ScaleByPow2OrZero(__m256 p, __m256 n) {
  return _mm256_maskz_scalef_ps(_mm256_cmp_ps_mask(n, _mm256_set1_ps(-126.5f), _CMP_NLT_UQ), p, n);
}
HWY_INLINE __m128 ScaleByPow2OrZero(__m128 p, __m128 n) {
  return _mm_maskz_scalef_ps(_mm_cmp_ps_mask(n, _mm_set1_ps(-126.5f), _CMP_NLT_UQ), p, n);
}
#endif

// kNonPositive: the caller guarantees x <= 0 or NaN (a score minus its row's maximum), so the
// upper clamp is the identity and is left out (the same bits, one instruction less).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// x − round(x), rounded to nearest even, in one instruction (AVX-512 DQ's vreduceps); 0 for ±inf.
HWY_INLINE __m512 Fraction(__m512 x) { return _mm512_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
HWY_INLINE __m256 Fraction(__m256 x) { return _mm256_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
HWY_INLINE __m128 Fraction(__m128 x) { return _mm_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
#endif

// 2^f for f in [-1/2, 1/2]: the polynomial above.
//
// kForBf16: where the result is rounded to bfloat16 next (the bf16 forward's P, bf16_forward.cc),
// a degree-3 polynomial instead: 1 + f·(c1 + f·(c2 + f·c3)),
// fitted for the least largest relative error on [-1/2, 1/2] with the constant term 1 (so 2^0 = 1
// exactly and 2^f <= 1 for f <= 0, as above). Its relative error is at most 1.01e-4, 1/19 of
// bfloat16's rounding error 2^-9 (1.95e-3); the degree-6 polynomial's own error, 2e-9, lies far below
// what that rounding keeps. Three multiply-adds fewer per 16 probabilities, where the bf16 forward's
// softmax is about a tenth of its time: 0.976-0.987 of the forward's time (docs/performance.md). The
// running sums l, the rescale factors and the probs output use the same polynomial as P, so
// O = Σ P·V / l stays consistent; the lse differs from float32's by at most 1.01e-4. The bf16
// backward's recomputed P (Exp2ColumnsBf16), rounded to bfloat16 for dV as dS = P∘(dP − D) is for
// dK and dQ, takes it too: 0.990-0.996 of that backward's time (docs/performance.md). Both also
// take the polynomial's argument x·s − m by one multiply-add from the unscaled score where
// |m| <= 4096 (ExpFolded below; the forward's only where no probabilities are written, whose
// l then sums those P): at most 7.2e-4 more on P and l, so on the lse 8.2e-4 in all.
template <class D, bool kForBf16 = false>
HWY_INLINE hn::Vec<D> Exp2Fraction(D d, hn::Vec<D> f) {
  using V = hn::Vec<D>;
  if constexpr (kForBf16) {
    V p = hn::Set(d, 5.500883e-2f);
    p = FusedMulAdd(p, f, hn::Set(d, 2.4221099e-1f));
    p = FusedMulAdd(p, f, hn::Set(d, 6.9328295e-1f));
    return FusedMulAdd(p, f, hn::Set(d, 1.0f));
  }
  V p = hn::Set(d, 1.535336188319500e-4f);
  p = FusedMulAdd(p, f, hn::Set(d, 1.339887440266574e-3f));
  p = FusedMulAdd(p, f, hn::Set(d, 9.618437357674640e-3f));
  p = FusedMulAdd(p, f, hn::Set(d, 5.550332471162809e-2f));
  p = FusedMulAdd(p, f, hn::Set(d, 2.402264791363012e-1f));
  p = FusedMulAdd(p, f, hn::Set(d, 6.931472028550421e-1f));
  return FusedMulAdd(p, f, hn::Set(d, 1.0f));
}

template <class D, bool kNonPositive = false, bool kForBf16 = false>
HWY_INLINE hn::Vec<D> Exp2(D d, hn::Vec<D> x) {
  using V = hn::Vec<D>;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  // On AVX-512 f = x − round(x) comes from vreduceps (0 for ±inf) and n = x − f is round(x)
  // exactly. From n = -127 down the result is 0, as on the other targets (2^-127·2^f and below
  // would be subnormal): a vscalefps whose result is subnormal or underflows takes a microcode
  // assist on Intel's cores, where a lane its mask zeroes (or n = -inf) gives 0 at full speed.
  // A 64 x 64 tile (an Intel Xeon, 2026-12-05; docs/performance.md): e^(x − lse) of masked scores
  // (-inf, clamped to -160 before) 18.0 µs against 0.8 for finite ones, now 0.8; the softmax of
  // scores 200 below their row's maximum 18.6 µs, now 2.6-2.8 as any. Results below 2^-126
  // (probabilities 87 or more below the row's largest, weights of no weight beside it) were
  // subnormal here before.
  // x is clamped above at 127 (2^127 rather than infinity), unless x <= 0 (kNonPositive).
  const V xc = kNonPositive ? x : hn::Min(hn::Set(d, 127.0f), x);
  const V f{Fraction(xc.raw)};
  const V n = hn::Sub(xc, f);
  return V{ScaleByPow2OrZero(Exp2Fraction<D, kForBf16>(d, f).raw, n.raw)};
#else
  // n = round(xc) by one float addition: t = xc + 1.5·2^23 lies in [2^23, 2^24), where floats are
  // the integers, so the addition rounds xc to the nearest integer, ties to even (the current
  // rounding mode, as Round's), and n = t − 1.5·2^23 is exact. t's bits are those of 1.5·2^23 plus
  // n in the low mantissa bits, so ((bits of t) + 127) << 23 = (n + 127) << 23 modulo 2^32 (the
  // exponent field of 2^n; the bits of 1.5·2^23 shift out). Round, then ConvertTo, took 9
  // instructions on AVX2 (ConvertTo mends the out-of-range lanes, which the clamp rules out) where
  // these take 5; the same n, f and bits.
  //
  // NaN: on x86 (maxps, minps: the second operand where either is NaN) x goes second into the
  // clamps, and a NaN x then passes every step with its bits (one NaN operand an operation; the
  // shifted bits are never NaN, as their mantissa is 0), as the select the other targets take
  // gives it: every x here is computed, so already quiet.
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  const V lo = hn::Max(hn::Set(d, -127.0f), x);
  const V xc = kNonPositive ? lo : hn::Min(hn::Set(d, 127.0f), lo);
#else
  const V lo = hn::Max(x, hn::Set(d, -127.0f));
  const V xc = kNonPositive ? lo : hn::Min(lo, hn::Set(d, 127.0f));
#endif
  const V shifter = hn::Set(d, 12582912.0f);  // 1.5·2^23
  const V t = hn::Add(xc, shifter);
  const V f = hn::Sub(xc, hn::Sub(t, shifter));
  const V p = Exp2Fraction<D, kForBf16>(d, f);
  const hn::RebindToSigned<D> di;
  const auto bits = hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, t), hn::Set(di, 127)));
  const V r = hn::Mul(p, hn::BitCast(d, bits));
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  return r;
#else
  return hn::IfThenElse(hn::IsNaN(x), x, r);
#endif
#endif
}

// log2 e, the change of base of every e^x here.
inline constexpr float kLog2E = 1.4426950408889634f;

// e^(x − m) as 2^((x − m)·log2 e), for scores x in natural units. Derivation of the order: the
// difference first, then the change of base. x − m is exact when x is within a factor of 2 of m
// (Sterbenz) and otherwise rounds relative to the small result, so the multiply by log2(e) adds
// an error of u/2·|x − m|: none where P is largest. Converting the scores to base 2 before the
// subtraction (folding log2 e into Q) would add u/2·|x| to every exponent instead — for logits of
// order 10-100 (unscaled, d_k = 64..4096) two to three times the error of a plain float32
// softmax, which computes exp(x − m) directly.
template <class D, bool kForBf16 = false>
HWY_INLINE hn::Vec<D> ExpDiff(D d, hn::Vec<D> x, hn::Vec<D> m) {
  return Exp2<D, false, kForBf16>(d, hn::Mul(hn::Sub(x, m), hn::Set(d, kLog2E)));
}
// ExpDiff where x <= m (m the running maximum of the x, or 0 with every x = -inf).
template <class D, bool kForBf16 = false>
HWY_INLINE hn::Vec<D> ExpBelowMax(D d, hn::Vec<D> x, hn::Vec<D> m) {
  return Exp2<D, true, kForBf16>(d, hn::Mul(hn::Sub(x, m), hn::Set(d, kLog2E)));
}

// The bf16 paths' e^(x·s − m) from an unscaled score x by one multiply-add: 2^(x·c1 + c0) with
// c1 = s·log2 e and c0 = −m·log2 e (each rounded once), where ExpDiff's order takes three
// operations, each rounded. It gives up what that order keeps, x·s − m exact near the maximum
// (Sterbenz): it errs by about u·(|x·s| + |m|)·log2 e more in the exponent (u = 2^-24). Its
// callers take it only where every |m| is at most kFoldLimit, so that for the P that weigh (x·s
// within 104 of m) that is at most 2^-24·(2·4096 + 104)·1.45 = 7.2e-4 relative, under the bfloat16
// rounding of P that follows (2^-9 = 1.95e-3); beyond it ExpDiff's order. Degree 3 (kForBf16).
inline constexpr float kFoldLimit = 4096.0f;
template <class D, bool kNonPositive>
HWY_INLINE hn::Vec<D> ExpFolded(D d, hn::Vec<D> x, hn::Vec<D> c1, hn::Vec<D> c0) {
  return Exp2<D, kNonPositive, true>(d, FusedMulAdd(x, c1, c0));
}

}  // namespace attnscale::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
