// Per-target pieces every cache-decode kernel shares (kv_tile_scores.cc, kv_pv_accumulate.cc,
// kv_stream_row.cc, kv_stream_heads.cc, kv_gqa_scores.cc, kv_key_widening.cc): a float32, bfloat16,
// float16 or int8 row read as float32 (LoadRaw, LoadRow, Element; bfloat16 words as their even and
// odd elements, PairLow / PairHigh), rows at a fixed stride (StridedRows), four lane sums at once
// (Sum4), the register budget of a block of sums, and the one switch from the run-time element type
// to a template argument (WithType). Included once per Highway target like the kernels.
//
// Every key row is read once for all the group's query rows: a vector of the row is loaded and
// widened (bf16: the bits shifted into a float32's upper half; float16: converted, vcvtph2ps on
// x86; int8: sign-extended, converted and multiplied by its block's scale) once, then multiplied
// into each row's accumulator.
#if defined(ATTNSCALE_ATTENTION_KV_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNSCALE_ATTENTION_KV_ROWS_INL_H_
#undef ATTNSCALE_ATTENTION_KV_ROWS_INL_H_
#else
#define ATTNSCALE_ATTENTION_KV_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attention/kv_kernels.h"
#include "attention/lane_reduce-inl.h"
#include "attention/raw_vectors-inl.h"
#include "attnscale/tensor.h"

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::kv::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using detail::HWY_NAMESPACE::FromRaw;  // raw_vectors-inl.h
using detail::HWY_NAMESPACE::RawF;
using detail::HWY_NAMESPACE::ToRaw;
using detail::HWY_NAMESPACE::LaneSum;  // lane_reduce-inl.h
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
using detail::HWY_NAMESPACE::Lane16Row;
using detail::HWY_NAMESPACE::LaneSums16;
#endif
#if HWY_TARGET != HWY_SCALAR
using detail::HWY_NAMESPACE::AddOp;
using detail::HWY_NAMESPACE::Reduce4;
#endif

// Where one query row's keys lie (stream_row_strided): at a fixed stride from a base (StridedRows /
// StridedScales: a contiguous cache, no array of pointers to build). They index as rows[j] and
// shift as rows + j, as arrays of row pointers (the scores and P·V of GQA's tiles) do.
struct StridedRows {
  const char* base = nullptr;
  std::ptrdiff_t stride = 0;  // bytes
  const void* operator[](size_t j) const { return base + static_cast<std::ptrdiff_t>(j) * stride; }
  StridedRows operator+(size_t j) const { return {base + static_cast<std::ptrdiff_t>(j) * stride, stride}; }
};
struct StridedScales {
  const float* base = nullptr;
  std::ptrdiff_t stride = 0;  // floats
  StridedScales() = default;
  StridedScales(std::nullptr_t) {}  // NOLINT: as a null pointer of the pointer form
  StridedScales(const float* b, std::ptrdiff_t st) : base(b), stride(st) {}
  const float* operator[](size_t j) const { return base + static_cast<std::ptrdiff_t>(j) * stride; }
  StridedScales operator+(size_t j) const { return {base + static_cast<std::ptrdiff_t>(j) * stride, stride}; }
  explicit operator bool() const { return base != nullptr; }
};

// Lanes [c, c + L) of a row as float32, an int8 row without its block's scale (a caller that
// multiplies by a coefficient anyway folds the scale into it).
template <int kType>
HWY_INLINE VF LoadRaw(DF d, const void* row, size_t c) {
  if constexpr (kType == kF32) {
    return hn::LoadU(d, static_cast<const float*>(row) + c);
  } else if constexpr (kType == kBF16) {
    const hn::RebindToUnsigned<DF> du32;
    const hn::Rebind<uint16_t, DF> du16;
    const auto wide = hn::PromoteTo(du32, hn::LoadU(du16, static_cast<const uint16_t*>(row) + c));
    return hn::BitCast(d, hn::ShiftLeft<16>(wide));
  } else if constexpr (kType == kF16) {
#if HWY_TARGET == HWY_SCALAR
    // Highway's portable conversion (1.0) reads exponent 31 as a finite power of two, so an Inf or
    // NaN in the cache became 65536 or more; tensor.h's from_f16 keeps them.
    return hn::Set(d, from_f16(static_cast<const f16*>(row)[c]));
#else
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, static_cast<const hwy::float16_t*>(row) + c));
#endif
  } else {
    const hn::RebindToSigned<DF> di32;
    const hn::Rebind<int8_t, DF> di8;
    return hn::ConvertTo(d, hn::PromoteTo(di32, hn::LoadU(di8, static_cast<const int8_t*>(row) + c)));
  }
}

// Lanes [c, c + L) of a row, as float32. L divides 32, so one int8 vector lies in one scale block.
template <int kType>
HWY_INLINE VF LoadRow(DF d, const void* row, const float* scales, size_t c) {
  const VF x = LoadRaw<kType>(d, row, c);
  if constexpr (kType == kI8) return hn::Mul(x, hn::Set(d, scales[c / 32]));
  return x;
}

// Element c of a row as float32 (the tail past the last whole vector).
template <int kType>
HWY_INLINE float Element(const void* row, const float* scales, size_t c) {
  if constexpr (kType == kF32) {
    return static_cast<const float*>(row)[c];
  } else if constexpr (kType == kBF16) {
    const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(row)[c]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  } else if constexpr (kType == kF16) {
    return from_f16(static_cast<const f16*>(row)[c]);
  } else {
    return static_cast<float>(static_cast<const int8_t*>(row)[c]) * scales[c / 32];
  }
}

#if HWY_TARGET != HWY_SCALAR
// Lane i of the result: the sum of a_i's lanes (lane_reduce-inl.h).
HWY_INLINE hn::Vec<hn::Full128<float>> Sum4(DF d, VF a0, VF a1, VF a2, VF a3) { return Reduce4(d, a0, a1, a2, a3, AddOp()); }
HWY_INLINE void StoreSum4(DF d, VF a0, VF a1, VF a2, VF a3, float* out4) {
  hn::StoreU(Sum4(d, a0, a1, a2, a3), hn::Full128<float>(), out4);
}
#endif

// bfloat16 rows a 32-bit word at a time. A bfloat16 is the upper half of a float32, so a word
// holding elements 2i (low half) and 2i + 1 (high half) gives both as float32 with one operation
// each: the word shifted left by 16 (PairLow) and the word with its low half cleared (PairHigh).
// LoadRow's widening takes two (a cross-lane PromoteTo and a shift) for 16 values, where these
// take two for 32. The lanes then hold a chunk of 2L elements as two vectors, its even elements
// and its odd ones (the "pair order"): Q and the output row are put in that order once per call
// (PairOrder) and back (RowOrder), and a dot product takes its terms in any order. One query row
// a KV head, one thread, K and V in L2, calls alternated in one process: 0.85-0.95 of the time
// (d = 64 and 128); from L3 and DRAM, where the reads bound it, no change (docs/performance.md).
using VU = hn::Vec<hn::RebindToUnsigned<DF>>;
HWY_INLINE VF PairLow(DF d, VU w) { return hn::BitCast(d, hn::ShiftLeft<16>(w)); }
HWY_INLINE VF PairHigh(DF d, VU w) {
  return hn::BitCast(d, hn::And(w, hn::Set(hn::RebindToUnsigned<DF>(), 0xFFFF0000u)));
}
// Words [c / 2, c / 2 + L) of a bfloat16 row: its elements [c, c + 2L).
HWY_INLINE VU LoadPairs(const void* row, size_t c) {
  return hn::LoadU(hn::RebindToUnsigned<DF>(), reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(row) + c));
}

// Vector accumulators a kernel keeps in registers (a block of sums: NR rows x CB vectors).
#if HWY_TARGET == HWY_AVX2
constexpr size_t kAccumulators = 8;  // of 16 vector registers
#else
constexpr size_t kAccumulators = 16;  // of 32 (AVX-512); the scalar target has no limit that matters
#endif

// Rows in blocks of up to kRowBlock, each block with its accumulators in registers.
constexpr size_t kRowBlock = 8;

// f(std::integral_constant<int, type>) for the element type given at run time: the one place the
// run-time type becomes a template argument.
template <class F>
HWY_INLINE void WithType(int type, F&& f) {
  switch (type) {
    case kF32: return f(std::integral_constant<int, kF32>());
    case kBF16: return f(std::integral_constant<int, kBF16>());
    case kF16: return f(std::integral_constant<int, kF16>());
    default: return f(std::integral_constant<int, kI8>());
  }
}

}  // namespace attnscale::detail::kv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
