// convert (tensor.h): one view into another of the same shape, element by element. float16 rows
// with a contiguous last dimension go through the CPU's conversion instructions (Highway's
// PromoteTo / DemoteTo: vcvtph2ps and vcvtps2ph, round to nearest even, on AVX2 and AVX-512),
// compiled once per Highway target; bfloat16 rows to and from float32 by the scalar conversions
// of tensor.h in loops vectorised per target (bfloat_rows.h); everything else, and float16 rows on targets without
// such instructions, element by element through double: exact between these types except towards a
// narrower one, which rounds to nearest even (float64 to bfloat16 or float16 by way of float32).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/convert.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstdint>

#include "attnscale/tensor.h"
#include "common/bfloat_rows.h"

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::convert::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// n float16 values to float32 (to_f32) or back: whole vectors, then the tail one at a time. Only
// x86's vector targets: Highway's emulated float16 conversions are not guaranteed to round to
// nearest even, and the scalar loop is what those targets would run anyway.
bool Vectorised() { return HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL; }

void HalfRow(const void* src, void* dst, std::int64_t n, bool to_f32) {
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t i = 0;
  if (to_f32) {
    const auto* s = static_cast<const hwy::float16_t*>(src);
    auto* d = static_cast<float*>(dst);
    for (; i + L <= n; i += L) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, s + i)), df, d + i);
    for (; i < n; ++i) d[i] = from_f16(static_cast<const f16*>(src)[i]);
  } else {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<hwy::float16_t*>(dst);
    for (; i + L <= n; i += L) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, s + i)), dh, d + i);
    for (; i < n; ++i) static_cast<f16*>(dst)[i] = to_f16(s[i]);
  }
#else
  if (to_f32)
    for (std::int64_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = from_f16(static_cast<const f16*>(src)[i]);
  else
    for (std::int64_t i = 0; i < n; ++i) static_cast<f16*>(dst)[i] = to_f16(static_cast<const float*>(src)[i]);
#endif
}

// n bfloat16 values to float32 (to_f32, exact: the bits shifted up) or back (to_bf16's rounding to
// nearest even): plain loops over the library's inline scalar conversions, which the compiler
// vectorises for each target.
void BfloatRow(const void* src, void* dst, std::int64_t n, bool to_f32) {
  if (to_f32) {
    const auto* s = static_cast<const bf16*>(src);
    auto* d = static_cast<float*>(dst);
    for (std::int64_t i = 0; i < n; ++i) d[i] = from_bf16(s[i]);
  } else {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<bf16*>(dst);
    for (std::int64_t i = 0; i < n; ++i) d[i] = to_bf16(s[i]);
  }
}

}  // namespace attnscale::detail::convert::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <string>

#include "attnscale/error.h"
#include "common/elements.h"

namespace attnscale {
namespace detail::convert {
HWY_EXPORT(HalfRow);
HWY_EXPORT(BfloatRow);
HWY_EXPORT(Vectorised);
}  // namespace detail::convert

namespace detail {
void bf16_row(const float* src, std::int64_t n, std::uint16_t* dst) {
  HWY_DYNAMIC_DISPATCH(convert::BfloatRow)(src, dst, n, false);
}
void f32_row(const std::uint16_t* src, std::int64_t n, float* dst) {
  HWY_DYNAMIC_DISPATCH(convert::BfloatRow)(src, dst, n, true);
}
}  // namespace detail

namespace {
bool floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16; }
}  // namespace

void convert(const TensorView& src, const TensorView& dst) {
  if (!floating(src.dtype))
    throw Error("src: dtype must be float32, float64, bfloat16 or float16, got " + std::string(dtype_name(src.dtype)));
  if (!floating(dst.dtype))
    throw Error("dst: dtype must be float32, float64, bfloat16 or float16, got " + std::string(dtype_name(dst.dtype)));
  if (src.rank < 1 || src.rank > kMaxRank) throw Error("src: expected rank 1 to 4, got " + std::to_string(src.rank));
  if (src.rank != dst.rank || src.shape != dst.shape)
    throw Error("dst: shape " + dst.shape_str() + " differs from src's " + src.shape_str());
  if (src.numel() == 0) return;
  if (src.data == nullptr || dst.data == nullptr) throw Error(std::string(src.data ? "dst" : "src") + ": missing (null data pointer)");
  // Rows of the last dimension; the leading ones (up to three) walked by index.
  std::int64_t lead[3] = {1, 1, 1}, ss[3] = {0, 0, 0}, ds[3] = {0, 0, 0};
  const int r = src.rank;
  for (int i = 0; i + 1 < r; ++i) {
    const int at = 3 - (r - 1) + i;  // the leading dimensions right-aligned in three
    lead[at] = src.shape[i], ss[at] = src.strides[i], ds[at] = dst.strides[i];
  }
  std::int64_t n = src.shape[r - 1], sc = src.strides[r - 1], dc = dst.strides[r - 1];
  const std::int64_t se = static_cast<std::int64_t>(dtype_size(src.dtype)), de = static_cast<std::int64_t>(dtype_size(dst.dtype));
  if (src.is_contiguous() && dst.is_contiguous()) {  // the usual case: one row of every element
    lead[0] = lead[1] = lead[2] = 1;
    n = src.numel();
    sc = dc = 1;
  }
  const bool unit_rows = (sc == 1 || n == 1) && (dc == 1 || n == 1);  // rows of adjacent elements
  const bool half_row = unit_rows &&
                        ((src.dtype == DType::f16 && dst.dtype == DType::f32) ||
                         (src.dtype == DType::f32 && dst.dtype == DType::f16)) &&
                        HWY_DYNAMIC_DISPATCH(detail::convert::Vectorised)();
  const bool bfloat_row = unit_rows &&
                          ((src.dtype == DType::bf16 && dst.dtype == DType::f32) ||
                           (src.dtype == DType::f32 && dst.dtype == DType::bf16));
  for (std::int64_t a = 0; a < lead[0]; ++a)
    for (std::int64_t b = 0; b < lead[1]; ++b)
      for (std::int64_t c = 0; c < lead[2]; ++c) {
        const char* s = static_cast<const char*>(src.data) + (a * ss[0] + b * ss[1] + c * ss[2]) * se;
        char* d = static_cast<char*>(dst.data) + (a * ds[0] + b * ds[1] + c * ds[2]) * de;
        if (half_row) {
          HWY_DYNAMIC_DISPATCH(detail::convert::HalfRow)(s, d, n, src.dtype == DType::f16);
          continue;
        }
        if (bfloat_row) {
          if (src.dtype == DType::bf16)
            detail::f32_row(static_cast<const std::uint16_t*>(static_cast<const void*>(s)), n,
                            static_cast<float*>(static_cast<void*>(d)));
          else
            detail::bf16_row(static_cast<const float*>(static_cast<const void*>(s)), n,
                             static_cast<std::uint16_t*>(static_cast<void*>(d)));
          continue;
        }
        for (std::int64_t i = 0; i < n; ++i)
          detail::store_element(dst.dtype, d + i * dc * de, detail::load_element(src.dtype, s + i * sc * se));
      }
}

}  // namespace attnscale
#endif  // HWY_ONCE
