// SIMD kernels of cache decode (kv_decode.cc): scores and the P·V update for one tile of keys
// whose rows are given by pointers (so the layout, contiguous or paged, stays outside), over
// float32, bfloat16, float16 or int8 rows, with float32 products and sums. Compiled once per
// Highway target like kernels.cc.
//
// Every key row is read once for all the group's query rows: a vector of the row is loaded and
// widened (bf16: the bits shifted into a float32's upper half; float16: converted, vcvtph2ps on
// x86; int8: sign-extended, converted and multiplied by its block's scale) once, then multiplied
// into each row's accumulator.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kv_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attention/kv_kernels.h"
#include "attention/alibi.h"
#include "attention/exp2-inl.h"
#include "attention/lane_reduce-inl.h"
#include "attention/raw_vectors-inl.h"
#include "attention/softcap-inl.h"
#include "attnscale/tensor.h"
#include "common/prefetch.h"

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

// S[r][j] = Σ_c Q[r][c] · K_j[c] for NR rows (row stride ldq) and keys j < nk. Two
// accumulators per row (even and odd vectors of the row) halve the chain of dependent FMAs.
template <int kType, size_t NR>
HWY_INLINE void ScoresRows(size_t nk, size_t dk, const void* const* krow, const float* const* ksc, const float* Q,
                           size_t ldq, float* S, size_t lds) {
  const DF d;
  const size_t L = hn::Lanes(d), full = dk / L * L;
  for (size_t j = 0; j < nk; ++j) {
    const float* sc = ksc ? ksc[j] : nullptr;
    VF acc[NR][2];
    for (size_t r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = hn::Zero(d);
    size_t c = 0;
    for (; c + 2 * L <= full; c += 2 * L) {
      const VF k0 = LoadRow<kType>(d, krow[j], sc, c), k1 = LoadRow<kType>(d, krow[j], sc, c + L);
      for (size_t r = 0; r < NR; ++r) {
        acc[r][0] = hn::MulAdd(k0, hn::LoadU(d, Q + r * ldq + c), acc[r][0]);
        acc[r][1] = hn::MulAdd(k1, hn::LoadU(d, Q + r * ldq + c + L), acc[r][1]);
      }
    }
    if (c < full) {
      const VF k0 = LoadRow<kType>(d, krow[j], sc, c);
      for (size_t r = 0; r < NR; ++r) acc[r][0] = hn::MulAdd(k0, hn::LoadU(d, Q + r * ldq + c), acc[r][0]);
    }
    for (size_t r = 0; r < NR; ++r) {
      float s = LaneSum(d, hn::Add(acc[r][0], acc[r][1]));
      for (size_t e = full; e < dk; ++e) s += Q[r * ldq + e] * Element<kType>(krow[j], sc, e);
      S[r * lds + j] = s;
    }
  }
}

#if HWY_TARGET != HWY_SCALAR
// Lane i of the result: the sum of a_i's lanes (lane_reduce-inl.h).
HWY_INLINE hn::Vec<hn::Full128<float>> Sum4(DF d, VF a0, VF a1, VF a2, VF a3) { return Reduce4(d, a0, a1, a2, a3, AddOp()); }
HWY_INLINE void StoreSum4(DF d, VF a0, VF a1, VF a2, VF a3, float* out4) {
  hn::StoreU(Sum4(d, a0, a1, a2, a3), hn::Full128<float>(), out4);
}

// ScoresRows for NR a multiple of 4, two keys at a time: each vector of Q is loaded once for both
// keys, and the lane sums go four rows at a time through Sum4.
template <int kType, size_t NR>
HWY_INLINE void ScoresRowsPairs(size_t nk, size_t dk, const void* const* krow, const float* const* ksc,
                                const float* Q, size_t ldq, float* S, size_t lds) {
  static_assert(NR % 4 == 0);
  const DF d;
  const size_t L = hn::Lanes(d), full = dk / L * L;
  size_t j = 0;
  for (; j + 2 <= nk; j += 2) {
    const float* sc0 = ksc ? ksc[j] : nullptr;
    const float* sc1 = ksc ? ksc[j + 1] : nullptr;
    VF acc[NR][2];
    for (size_t r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = hn::Zero(d);
    for (size_t c = 0; c < full; c += L) {
      const VF k0 = LoadRow<kType>(d, krow[j], sc0, c), k1 = LoadRow<kType>(d, krow[j + 1], sc1, c);
      for (size_t r = 0; r < NR; ++r) {
        const VF q = hn::LoadU(d, Q + r * ldq + c);
        acc[r][0] = hn::MulAdd(k0, q, acc[r][0]);
        acc[r][1] = hn::MulAdd(k1, q, acc[r][1]);
      }
    }
    for (size_t x = 0; x < 2; ++x) {
      float sums[NR];
      for (size_t r = 0; r < NR; r += 4)
        StoreSum4(d, acc[r][x], acc[r + 1][x], acc[r + 2][x], acc[r + 3][x], sums + r);
      for (size_t r = 0; r < NR; ++r) {
        float s = sums[r];
        for (size_t e = full; e < dk; ++e) s += Q[r * ldq + e] * Element<kType>(krow[j + x], x ? sc1 : sc0, e);
        S[r * lds + j + x] = s;
      }
    }
  }
  if (j < nk) ScoresRows<kType, NR>(1, dk, krow + j, ksc ? ksc + j : nullptr, Q, ldq, S + j, lds);
}

// ScoresRows for four rows, four keys at a time: 16 accumulators, and every step loads four
// vectors of Q and four of K for 16 FMAs, where two keys against eight rows (ScoresRowsPairs)
// load ten for 16, Q's from L1 at every step. Eight rows take two calls, the tile's K rows staying
// in L1 between them; float32 only, since the other types would widen each K vector twice.
// (Interleaved call by call, Hq = 32, Hkv = 4, d = 128, load average 0.7-1.3: 1.06x at
// Nkv = 65536, 1.12x at 4096, 1.05x for Hq = 8, Hkv = 1 at 262144.)
template <int kType>
HWY_INLINE void ScoresRowsQuads(size_t nk, size_t dk, const void* const* krow, const float* const* ksc,
                                const float* Q, size_t ldq, float* S, size_t lds) {
  constexpr size_t NR = 4, NK = 4;
  const DF d;
  const size_t L = hn::Lanes(d), full = dk / L * L;
  size_t j = 0;
  for (; j + NK <= nk; j += NK) {
    const float* sc[NK];
    for (size_t x = 0; x < NK; ++x) sc[x] = ksc ? ksc[j + x] : nullptr;
    VF acc[NR][NK];
    for (size_t r = 0; r < NR; ++r)
      for (size_t x = 0; x < NK; ++x) acc[r][x] = hn::Zero(d);
    for (size_t c = 0; c < full; c += L) {
      VF k[NK];
      for (size_t x = 0; x < NK; ++x) k[x] = LoadRow<kType>(d, krow[j + x], sc[x], c);
      for (size_t r = 0; r < NR; ++r) {
        const VF q = hn::LoadU(d, Q + r * ldq + c);
        for (size_t x = 0; x < NK; ++x) acc[r][x] = hn::MulAdd(k[x], q, acc[r][x]);
      }
    }
    for (size_t x = 0; x < NK; ++x) {
      float sums[NR];
      StoreSum4(d, acc[0][x], acc[1][x], acc[2][x], acc[3][x], sums);
      for (size_t r = 0; r < NR; ++r) {
        float s = sums[r];
        for (size_t e = full; e < dk; ++e) s += Q[r * ldq + e] * Element<kType>(krow[j + x], sc[x], e);
        S[r * lds + j + x] = s;
      }
    }
  }
  if (j < nk) ScoresRowsPairs<kType, NR>(nk - j, dk, krow + j, ksc ? ksc + j : nullptr, Q, ldq, S + j, lds);
}

// ScoresRows for one row (no GQA), four keys at a time: four independent accumulators, and the
// four lane sums in one Sum4 instead of a SumOfLanes per key. (Interleaved call by call with
// ScoresRows, H = 8, d = 128, load average 1.1-1.4: int8 K/V 1.03x at Nkv = 65536 and about 1.1x
// at 4096; float32 the same speed.)
template <int kType>
HWY_INLINE void ScoresKeys4(size_t nk, size_t dk, const void* const* krow, const float* const* ksc, const float* Q,
                            float* S) {
  constexpr size_t NK = 4;
  const DF d;
  const size_t L = hn::Lanes(d), full = dk / L * L;
  size_t j = 0;
  for (; j + NK <= nk; j += NK) {
    const float* sc[NK];
    for (size_t x = 0; x < NK; ++x) sc[x] = ksc ? ksc[j + x] : nullptr;
    VF acc[NK];
    for (size_t x = 0; x < NK; ++x) acc[x] = hn::Zero(d);
    for (size_t c = 0; c < full; c += L) {
      const VF q = hn::LoadU(d, Q + c);
      for (size_t x = 0; x < NK; ++x) acc[x] = hn::MulAdd(LoadRow<kType>(d, krow[j + x], sc[x], c), q, acc[x]);
    }
    float sums[NK];
    StoreSum4(d, acc[0], acc[1], acc[2], acc[3], sums);
    for (size_t x = 0; x < NK; ++x) {
      float s = sums[x];
      for (size_t e = full; e < dk; ++e) s += Q[e] * Element<kType>(krow[j + x], sc[x], e);
      S[j + x] = s;
    }
  }
  if (j < nk) ScoresRows<kType, 1>(nk - j, dk, krow + j, ksc ? ksc + j : nullptr, Q, 0, S + j, 0);
}
#endif

// O[r] = alpha[r]·O[r] + Σ_j P[r][j]·V_j for NR rows (row stride ldo). The output columns go in
// blocks of CB vectors whose NR x CB accumulators stay in registers while all nk keys stream
// through (one load and widening of each V vector for all rows).
#if HWY_TARGET == HWY_AVX2
constexpr size_t kAccumulators = 8;  // of 16 vector registers
// AVX2 with four rows also takes blocks of 3 vectors: 12 accumulators, the key's 3 V vectors and
// one broadcast of P fill its 16 registers. A key's 4 broadcasts of P and its step of the feed
// then serve 12 multiply-adds instead of 8. (Zen 3, GQA 32/4, d = 128, calls alternated, load
// 0.8-1.0: time 0.93-0.97 of 4 x 2's with K/V in cache, Nkv = 2048; 0.95-1.02 from DRAM,
// Nkv = 65536, where the reads dominate. Eight chains alone do reach the FMA rate there.)
constexpr size_t kThreeVectorRows = 4;
#else
constexpr size_t kAccumulators = 16;  // of 32 (AVX-512); the scalar target has no limit that matters
constexpr size_t kThreeVectorRows = 0;  // no blocks of 3 vectors
#endif

// Whether nr rows take a block of 3 vectors with `vectors` full vectors left: while 3 or more are
// left, but 4 go as 2 + 2 (3 + 1 would leave a pass of one vector, half the sums of the others).
constexpr bool TakeThree(size_t nr, size_t vectors) {
  return nr == kThreeVectorRows && vectors >= 3 && vectors != 4;
}

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
// AVX-512, bfloat16 V and whole pairs of vectors: each pair of vectors (2L columns) read as L
// words, split into its even and odd columns (PairLow, PairHigh: two operations for 2L values,
// where LoadRow's widening takes two for L), the sums kept in that order, the output's columns
// put in it as the block loads them and back as it stores them (a permute a vector each way, once
// a block of keys). Each output element sums the same products in the same order: the same bits.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
template <int kType, size_t CB>
constexpr bool kAccumulatePairs = kType == kBF16 && CB % 2 == 0;
HWY_INLINE void ToPairOrder(DF d, VF& lo, VF& hi) {
  const VF even = hn::ConcatEven(d, hi, lo), odd = hn::ConcatOdd(d, hi, lo);
  lo = even, hi = odd;
}
HWY_INLINE void ToRowOrder(VF& even, VF& odd) {
  const __m512i low = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i high = _mm512_add_epi32(low, _mm512_set1_epi32(8));
  const __m512 lo = _mm512_permutex2var_ps(even.raw, low, odd.raw), hi = _mm512_permutex2var_ps(even.raw, high, odd.raw);
  even = VF{lo}, odd = VF{hi};
}
#else
template <int kType, size_t CB>
constexpr bool kAccumulatePairs = false;
HWY_INLINE void ToPairOrder(DF, VF&, VF&) {}
HWY_INLINE void ToRowOrder(VF&, VF&) {}
#endif

template <int kType, size_t NR, size_t CB, class R = const void* const*>
HWY_INLINE void AccumulateBlock(size_t nk, size_t c0, R vrow, const float* const* vsc, const float* P,
                                const float* alpha, float* O, size_t ldo, LineFeed& feed, size_t vc0 = ~size_t{0}) {
  const DF d;
  if (vc0 == ~size_t{0}) vc0 = c0;  // V's columns: those of O, or (a panel) from vc0
  const size_t L = hn::Lanes(d);
  constexpr bool kPairs = kAccumulatePairs<kType, CB>;
  VF acc[NR][CB];
  for (size_t r = 0; r < NR; ++r) {
    for (size_t b = 0; b < CB; ++b) acc[r][b] = hn::LoadU(d, O + r * ldo + c0 + b * L);
    if constexpr (kPairs)
      for (size_t b = 0; b < CB; b += 2) ToPairOrder(d, acc[r][b], acc[r][b + 1]);
    for (size_t b = 0; b < CB; ++b) acc[r][b] = hn::Mul(acc[r][b], hn::Set(d, alpha[r]));
  }
  for (size_t j = 0; j < nk; ++j) {
    feed.next();
    if constexpr (CB >= NR || CB == 3) {  // 4 rows x 3: 12 sums, 3 V and 1 P in AVX2's 16 registers
      // The key's CB vectors first, then each row's P into its CB sums. Loaded inside the loop
      // over the vectors (below) the widest of these blocks left GCC short of registers: with 2
      // rows x 8 vectors it kept one accumulator on the stack, whose chain then ran through memory
      // (one 64-key tile in L1, float32, d = 128: 2 rows 7.6-8.4 -> 5.6 ns a key, 3 rows
      // 11.6 -> 6.8-7.0; docs/performance.md).
      VF v[CB];
      if constexpr (kPairs) {
        for (size_t b = 0; b < CB; b += 2) {
          const VU w = LoadPairs(vrow[j], vc0 + b * L);
          v[b] = PairLow(d, w), v[b + 1] = PairHigh(d, w);
        }
      } else {
        for (size_t b = 0; b < CB; ++b) v[b] = LoadRow<kType>(d, vrow[j], vsc ? vsc[j] : nullptr, vc0 + b * L);
      }
      for (size_t r = 0; r < NR; ++r) {
        const VF p = hn::Set(d, P[r * kTileKeys + j]);
        for (size_t b = 0; b < CB; ++b) acc[r][b] = hn::MulAdd(p, v[b], acc[r][b]);
      }
    } else {  // more rows than vectors (8 x 2 on AVX-512): the rows' P first (8 bf16 rows 13.2 ns a
              // key in L1, 13.7 in the order above)
      VF p[NR];
      for (size_t r = 0; r < NR; ++r) p[r] = hn::Set(d, P[r * kTileKeys + j]);
      if constexpr (kPairs) {
        for (size_t b = 0; b < CB; b += 2) {
          const VU w = LoadPairs(vrow[j], vc0 + b * L);
          const VF even = PairLow(d, w);
          for (size_t r = 0; r < NR; ++r) acc[r][b] = hn::MulAdd(p[r], even, acc[r][b]);
          const VF odd = PairHigh(d, w);
          for (size_t r = 0; r < NR; ++r) acc[r][b + 1] = hn::MulAdd(p[r], odd, acc[r][b + 1]);
        }
      } else {
        for (size_t b = 0; b < CB; ++b) {
          const VF v = LoadRow<kType>(d, vrow[j], vsc ? vsc[j] : nullptr, vc0 + b * L);
          for (size_t r = 0; r < NR; ++r) acc[r][b] = hn::MulAdd(p[r], v, acc[r][b]);
        }
      }
    }
  }
  for (size_t r = 0; r < NR; ++r) {
    if constexpr (kPairs)
      for (size_t b = 0; b < CB; b += 2) ToRowOrder(acc[r][b], acc[r][b + 1]);
    for (size_t b = 0; b < CB; ++b) hn::StoreU(acc[r][b], d, O + r * ldo + c0 + b * L);
  }
}

// The passes AccumulateRows makes over the keys for a block of nr rows and `vectors` full vectors
// of a row: blocks of 3 (TakeThree), then 8, 4, 2, 1 vectors, each as wide as nr rows'
// accumulators allow.
constexpr size_t AccumulatePasses(size_t nr, size_t vectors) {
  size_t passes = 0;
  for (; TakeThree(nr, vectors); vectors -= 3) ++passes;
  for (size_t cb : {8, 4, 2, 1})
    if (cb * nr <= kAccumulators || cb == 1) passes += vectors / cb, vectors %= cb;
  return passes;
}

// A block of NR rows; the caller paced the feed over all its blocks' passes (AccumulateT).
template <int kType, size_t NR>
HWY_INLINE void AccumulateRows(size_t nk, size_t dv, const void* const* vrow, const float* const* vsc, const float* P,
                               const float* alpha, float* O, size_t ldo, LineFeed& shared) {
  const DF d;
  const size_t L = hn::Lanes(d), full = dv / L * L;
  LineFeed feed = shared;  // in registers while the keys stream
  // Blocks of 3 vectors (TakeThree), then of 8, 4, 2, 1, as wide as the register budget allows:
  // each V row is then read in as few passes as possible (one for d = 128 and one row on AVX-512).
  size_t c = 0;
  while (TakeThree(NR, (full - c) / L)) {
    AccumulateBlock<kType, NR, 3>(nk, c, vrow, vsc, P, alpha, O, ldo, feed);
    c += 3 * L;
  }
  if constexpr (8 * NR <= kAccumulators)
    for (; c + 8 * L <= full; c += 8 * L) AccumulateBlock<kType, NR, 8>(nk, c, vrow, vsc, P, alpha, O, ldo, feed);
  if constexpr (4 * NR <= kAccumulators)
    for (; c + 4 * L <= full; c += 4 * L) AccumulateBlock<kType, NR, 4>(nk, c, vrow, vsc, P, alpha, O, ldo, feed);
  if constexpr (2 * NR <= kAccumulators)
    for (; c + 2 * L <= full; c += 2 * L) AccumulateBlock<kType, NR, 2>(nk, c, vrow, vsc, P, alpha, O, ldo, feed);
  for (; c < full; c += L) AccumulateBlock<kType, NR, 1>(nk, c, vrow, vsc, P, alpha, O, ldo, feed);
  for (size_t e = full; e < dv; ++e)
    for (size_t r = 0; r < NR; ++r) {
      float o = O[r * ldo + e] * alpha[r];
      for (size_t j = 0; j < nk; ++j) o += P[r * kTileKeys + j] * Element<kType>(vrow[j], vsc ? vsc[j] : nullptr, e);
      O[r * ldo + e] = o;
    }
  shared = feed;
}

// Rows in blocks of up to kRowBlock, each block with its accumulators in registers.
constexpr size_t kRowBlock = 8;

template <int kType>
void ScoresT(size_t nk, size_t rows, size_t dk, const void* const* krow, const float* const* ksc, const float* Q,
             size_t ldq, float* S, size_t lds) {
  for (size_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const float* q = Q + r0 * ldq;
    float* s = S + r0 * lds;
    switch (rows - r0 < kRowBlock ? rows - r0 : kRowBlock) {
#if HWY_TARGET != HWY_SCALAR
      case 1:
        ScoresKeys4<kType>(nk, dk, krow, ksc, q, s);
        break;
#else
      case 1: ScoresRows<kType, 1>(nk, dk, krow, ksc, q, ldq, s, lds); break;
#endif
      case 2: ScoresRows<kType, 2>(nk, dk, krow, ksc, q, ldq, s, lds); break;
      case 3: ScoresRows<kType, 3>(nk, dk, krow, ksc, q, ldq, s, lds); break;
#if HWY_TARGET != HWY_SCALAR
      case 4:
        if constexpr (kType == kF32) ScoresRowsQuads<kType>(nk, dk, krow, ksc, q, ldq, s, lds);
        else ScoresRowsPairs<kType, 4>(nk, dk, krow, ksc, q, ldq, s, lds);
        break;
#else
      case 4: ScoresRows<kType, 4>(nk, dk, krow, ksc, q, ldq, s, lds); break;
#endif
      case 5: ScoresRows<kType, 5>(nk, dk, krow, ksc, q, ldq, s, lds); break;
      case 6: ScoresRows<kType, 6>(nk, dk, krow, ksc, q, ldq, s, lds); break;
      case 7: ScoresRows<kType, 7>(nk, dk, krow, ksc, q, ldq, s, lds); break;
#if HWY_TARGET != HWY_SCALAR
      default:
        if constexpr (kType == kF32) {
          ScoresRowsQuads<kType>(nk, dk, krow, ksc, q, ldq, s, lds);
          ScoresRowsQuads<kType>(nk, dk, krow, ksc, q + 4 * ldq, ldq, s + 4 * lds, lds);
        } else {
          ScoresRowsPairs<kType, 8>(nk, dk, krow, ksc, q, ldq, s, lds);
        }
        break;
#else
      default: ScoresRows<kType, 8>(nk, dk, krow, ksc, q, ldq, s, lds); break;
#endif
    }
  }
}

// P·V's row blocks: AVX2's 8 accumulators hold 4 rows x 2 vectors, where 8 rows x 1 vector would
// load 8 broadcasts of P and one V vector for every 8 multiply-adds.
#if HWY_TARGET == HWY_AVX2
constexpr size_t kAccumulateRows = 4;
#else
constexpr size_t kAccumulateRows = kRowBlock;
#endif

// The feed is paced over the passes of all the row blocks. Paced over each block's own passes, the
// first of AVX2's two blocks of 4 rows (a group of 5-8) took a float32 tile's V lines two a step
// and the second none. d = 128, Nkv = 65536, two threads, calls alternated in one process, time
// against that: Hq = 32, Hkv = 4 0.87-0.94, Hq = 24 0.85; in cache 0.98-1.00 (bf16 and int8 tiles
// take one line a step either way; docs/performance.md).
#if HWY_TARGET == HWY_AVX2
// int8 V rows for groups of more than 4 rows on AVX2 (two or more row blocks of AccumulateRows,
// each of which would widen every V vector again), other V rows for more than kPanelRows: the column blocks go outside the row blocks.
// A column block's vectors of the tile's keys are widened once (LoadRow: sign extension,
// conversion, the block's scale) into a panel, nk·CB vectors one after another (at most 6 KiB),
// then every row block takes its float32 P·V over the panel: the panel stays in L1 from one row
// block to the next. Each output element sums the same products in the same order as
// AccumulateRows: the same bits.
// Why not widen the tile's V rows once into a float32 tile (32 KiB at d = 128, as K's were): that
// tile is all of Zen 3's L1, its stores missed L1, and the row blocks read it back through L2
// with its rows 512 bytes apart (a column block's lines in 16 of the 64 sets). Why not the panel
// for float32 rows too: the copy cost more than the second row block's reads from L2 (Nkv = 2048,
// one thread, 1.055 of the time); bf16 rows, whose widening is a shift, 1.03. Groups of more than
// kPanelRows rows (MQA's 32) take the panel for every type: there the copy serves five or more
// row blocks, each of which read the tile's V again from L2 (Hq = 32, Hkv = 1, d = 128, one
// thread: float32 0.93-0.95, bf16 0.94-0.97, float16 0.98 of the time; 16 rows 0.98-0.99;
// docs/performance.md).
constexpr size_t kPanelRows = 16;
template <int kType, size_t CB>
HWY_INLINE void PanelBlock(size_t nk, size_t rows, size_t c0, const void* const* vrow, const float* const* vsc,
                           const float* P, const float* alpha, float* O, size_t ldo, float* panel, LineFeed& feed) {
  const DF d;
  const size_t L = hn::Lanes(d);
  for (size_t j = 0; j < nk; ++j) {
    const float* sc = vsc ? vsc[j] : nullptr;
#pragma GCC unroll 3
    for (size_t b = 0; b < CB; ++b) hn::Store(LoadRow<kType>(d, vrow[j], sc, c0 + b * L), d, panel + (j * CB + b) * L);
  }
  const StridedRows pr{reinterpret_cast<const char*>(panel), static_cast<std::ptrdiff_t>(CB * L * sizeof(float))};
  for (size_t r0 = 0; r0 < rows; r0 += kThreeVectorRows) {
    const float* p = P + r0 * kTileKeys;
    const float* a = alpha + r0;
    float* o = O + r0 * ldo;
    switch (rows - r0 < kThreeVectorRows ? rows - r0 : kThreeVectorRows) {  // the panel's vector c0 + b·L at b·L
      case 1: AccumulateBlock<kF32, 1, CB>(nk, c0, pr, nullptr, p, a, o, ldo, feed, 0); break;
      case 2: AccumulateBlock<kF32, 2, CB>(nk, c0, pr, nullptr, p, a, o, ldo, feed, 0); break;
      case 3: AccumulateBlock<kF32, 3, CB>(nk, c0, pr, nullptr, p, a, o, ldo, feed, 0); break;
      default: AccumulateBlock<kF32, 4, CB>(nk, c0, pr, nullptr, p, a, o, ldo, feed, 0); break;
    }
  }
}
// Column blocks as 4 rows take them (AccumulateRows: 3 vectors while TakeThree, then 2, then 1),
// for every row block (fewer rows take the same blocks); the feed paced over all the passes.
template <int kType>
HWY_NOINLINE void AccumulatePanels(size_t nk, size_t rows, size_t dv, const void* const* vrow, const float* const* vsc,
                                   const float* P, const float* alpha, float* O, size_t ldo, LineFeed& shared) {
  const DF d;
  const size_t L = hn::Lanes(d), full = dv / L * L;
  HWY_ALIGN float panel[kTileKeys * 3 * hn::MaxLanes(DF())];
  size_t blocks = 0, vectors = full / L;
  for (; TakeThree(kThreeVectorRows, vectors); vectors -= 3) ++blocks;
  blocks += vectors / 2 + vectors % 2;
  const size_t row_blocks = (rows + kThreeVectorRows - 1) / kThreeVectorRows;
  shared.pace(static_cast<std::int64_t>(nk * blocks * row_blocks));
  LineFeed feed = shared;  // in registers while the keys stream
  size_t c = 0;
  while (TakeThree(kThreeVectorRows, (full - c) / L)) {
    PanelBlock<kType, 3>(nk, rows, c, vrow, vsc, P, alpha, O, ldo, panel, feed);
    c += 3 * L;
  }
  for (; c + 2 * L <= full; c += 2 * L) PanelBlock<kType, 2>(nk, rows, c, vrow, vsc, P, alpha, O, ldo, panel, feed);
  for (; c < full; c += L) PanelBlock<kType, 1>(nk, rows, c, vrow, vsc, P, alpha, O, ldo, panel, feed);
  for (size_t e = full; e < dv; ++e)  // not for int8 rows (dv % 32 == 0); as AccumulateRows
    for (size_t r = 0; r < rows; ++r) {
      float o = O[r * ldo + e] * alpha[r];
      for (size_t j = 0; j < nk; ++j) o += P[r * kTileKeys + j] * Element<kType>(vrow[j], vsc ? vsc[j] : nullptr, e);
      O[r * ldo + e] = o;
    }
  shared = feed;
}
#endif

template <int kType>
void AccumulateT(size_t nk, size_t rows, size_t dv, const void* const* vrow, const float* const* vsc, const float* P,
                 const float* alpha, float* O, size_t ldo, LineFeed& feed) {
#if HWY_TARGET == HWY_AVX2
  if (rows > (kType == kI8 ? kAccumulateRows : kPanelRows))
    return AccumulatePanels<kType>(nk, rows, dv, vrow, vsc, P, alpha, O, ldo, feed);
#endif
  size_t passes = 0;
  for (size_t r0 = 0; r0 < rows; r0 += kAccumulateRows)
    passes += AccumulatePasses(rows - r0 < kAccumulateRows ? rows - r0 : kAccumulateRows, dv / hn::Lanes(DF()));
  feed.pace(static_cast<std::int64_t>(nk * passes));
  for (size_t r0 = 0; r0 < rows; r0 += kAccumulateRows) {
    const float* p = P + r0 * kTileKeys;
    const float* a = alpha + r0;
    float* o = O + r0 * ldo;
    switch (rows - r0 < kAccumulateRows ? rows - r0 : kAccumulateRows) {
      case 1: AccumulateRows<kType, 1>(nk, dv, vrow, vsc, p, a, o, ldo, feed); break;
      case 2: AccumulateRows<kType, 2>(nk, dv, vrow, vsc, p, a, o, ldo, feed); break;
      case 3: AccumulateRows<kType, 3>(nk, dv, vrow, vsc, p, a, o, ldo, feed); break;
      case 4: AccumulateRows<kType, 4>(nk, dv, vrow, vsc, p, a, o, ldo, feed); break;
      case 5: AccumulateRows<kType, 5>(nk, dv, vrow, vsc, p, a, o, ldo, feed); break;
      case 6: AccumulateRows<kType, 6>(nk, dv, vrow, vsc, p, a, o, ldo, feed); break;
      case 7: AccumulateRows<kType, 7>(nk, dv, vrow, vsc, p, a, o, ldo, feed); break;
      default: AccumulateRows<kType, 8>(nk, dv, vrow, vsc, p, a, o, ldo, feed); break;
    }
  }
}

// stream_row_strided (kv_kernels.h). The scalar target goes key by key (StreamRowT); vector targets in
// tiles of 16 keys (StreamKeys where dv is 4, 8 or 16 vectors, but for int8 rows with dk != dv;
// else StreamTiles; below).
// Why K and V side by side: a path that reads a tile's K rows, then (after the softmax) its V
// rows, makes its arithmetic and its memory traffic add up rather than overlap; reading K rows
// beside V rows keeps both streams moving together (measured in docs/performance.md).
//
// One key's score s = Q·K_j (two accumulators, as ScoresRows), then its online-softmax step:
// alpha rescales what was summed before, p weighs this key.
template <int kType>
HWY_INLINE float KeyScore(DF d, size_t dk, const void* krow, const float* ks, const float* Q) {
  const size_t L = hn::Lanes(d), full = dk / L * L;
  VF a0 = hn::Zero(d), a1 = hn::Zero(d);
  size_t c = 0;
  for (; c + 2 * L <= full; c += 2 * L) {
    a0 = hn::MulAdd(LoadRow<kType>(d, krow, ks, c), hn::LoadU(d, Q + c), a0);
    a1 = hn::MulAdd(LoadRow<kType>(d, krow, ks, c + L), hn::LoadU(d, Q + c + L), a1);
  }
  if (c < full) a0 = hn::MulAdd(LoadRow<kType>(d, krow, ks, c), hn::LoadU(d, Q + c), a0);
  float s = LaneSum(d, hn::Add(a0, a1));
  for (size_t e = full; e < dk; ++e) s += Q[e] * Element<kType>(krow, ks, e);
  return s;
}
HWY_INLINE void SoftmaxStep(float s, float& m, float& l, float& alpha, float& p) {
  alpha = 1.0f;
  if (s > m) {  // a new maximum: the output so far is rescaled (e^(-inf) = 0 before the first key)
    alpha = std::exp(m - s);
    m = s;
  }
  // While every score is -inf, m stays -inf and e^(s − m) would be NaN: subtract 0 instead (P = 0).
  p = std::exp(s - (m == -INFINITY ? 0.0f : m));
  l = alpha * l + p;
}

// The row's score transforms (RowTransform) on scores s[x] of the call's keys j + x, x < n: the cap
// as simd::softcap computes it (softcap-inl.h), over whole vectors (s holds n rounded up to the
// lane count), ALiBi's distance as the tile path subtracts it.
HWY_INLINE void TransformScores(DF d, float* s, size_t j, size_t n, const RowTransform& tf) {
  if (tf.cap > 0.0f) {
    const size_t L = hn::Lanes(d);
    const VF cap = hn::Set(d, tf.cap), inv = hn::Set(d, 1.0f / tf.cap);
    for (size_t x = 0; x < n; x += L)
      hn::StoreU(hn::Mul(cap, detail::HWY_NAMESPACE::CapTanh(d, hn::LoadU(d, s + x), inv)), d, s + x);
  }
  if (tf.slope != 0.0f) subtract_alibi(s, static_cast<std::int64_t>(n), 1, tf.slope, tf.diag - static_cast<std::int64_t>(j));
}

// Keys one at a time, any dv: the output row in O between keys.
template <int kType, class R, class S>
void StreamRowT(size_t nk, size_t dk, size_t dv, R krow, S ksc, R vrow, S vsc, const float* Q, float* m, float* l,
                float* O, const RowTransform* tf) {
  const DF d;
  const size_t L = hn::Lanes(d), fullv = dv / L * L;
  float mm = *m, ll = *l;
  for (size_t j = 0; j < nk; ++j) {
    const float* vs = vsc ? vsc[j] : nullptr;
    float alpha, p;
    HWY_ALIGN float s[hn::MaxLanes(DF())] = {KeyScore<kType>(d, dk, krow[j], ksc ? ksc[j] : nullptr, Q)};
    if (tf) TransformScores(d, s, j, 1, *tf);  // on a whole vector: its other lanes are 0
    SoftmaxStep(s[0], mm, ll, alpha, p);
    const VF va = hn::Set(d, alpha), vp = hn::Set(d, p);
    for (size_t e = 0; e < fullv; e += L) {
      const VF o = alpha == 1.0f ? hn::LoadU(d, O + e) : hn::Mul(hn::LoadU(d, O + e), va);
      hn::StoreU(hn::MulAdd(vp, LoadRow<kType>(d, vrow[j], vs, e), o), d, O + e);
    }
    for (size_t e = fullv; e < dv; ++e) O[e] = O[e] * alpha + p * Element<kType>(vrow[j], vs, e);
  }
  *m = mm;
  *l = ll;
}

#if HWY_TARGET != HWY_SCALAR
// The scores of four keys, lane x = Q·K_x. An int8 row's score is Σ_b scale_b·(Q·K)_b over its
// blocks b of 32 (dk is a multiple of 32 for int8): one multiply by the scale per block, not per
// vector. Other types: two accumulators per key (even and odd vectors), as KeyScore. With NK = 1,
// one key's score in lane 0 with the same bits (a key's lane of the four-way reduction depends on
// its own sums alone).
template <int kType, size_t NK = 4, class R, class S>
HWY_INLINE hn::Vec<hn::Full128<float>> Scores4(DF d, size_t dk, R krow, S ksc, const float* Q) {
  static_assert(NK == 4 || NK == 1);
  const size_t L = hn::Lanes(d), full = dk / L * L;
  VF acc[NK];
  if constexpr (kType == kI8) {
    for (size_t x = 0; x < NK; ++x) acc[x] = hn::Zero(d);
    for (size_t c = 0; c < dk; c += 32) {
      VF t[NK];
      const VF q0 = hn::LoadU(d, Q + c);
      for (size_t x = 0; x < NK; ++x) t[x] = hn::Mul(LoadRaw<kI8>(d, krow[x], c), q0);
      for (size_t e = c + L; e < c + 32; e += L) {
        const VF q = hn::LoadU(d, Q + e);
        for (size_t x = 0; x < NK; ++x) t[x] = hn::MulAdd(LoadRaw<kI8>(d, krow[x], e), q, t[x]);
      }
      for (size_t x = 0; x < NK; ++x) acc[x] = hn::MulAdd(hn::Set(d, ksc[x][c / 32]), t[x], acc[x]);
    }
  } else {
    VF odd[NK];
    for (size_t x = 0; x < NK; ++x) acc[x] = odd[x] = hn::Zero(d);
    size_t c = 0;
    for (; c + 2 * L <= full; c += 2 * L) {
      const VF q0 = hn::LoadU(d, Q + c), q1 = hn::LoadU(d, Q + c + L);
      for (size_t x = 0; x < NK; ++x) {
        acc[x] = hn::MulAdd(LoadRaw<kType>(d, krow[x], c), q0, acc[x]);
        odd[x] = hn::MulAdd(LoadRaw<kType>(d, krow[x], c + L), q1, odd[x]);
      }
    }
    if (c < full) {
      const VF q0 = hn::LoadU(d, Q + c);
      for (size_t x = 0; x < NK; ++x) acc[x] = hn::MulAdd(LoadRaw<kType>(d, krow[x], c), q0, acc[x]);
    }
    for (size_t x = 0; x < NK; ++x) acc[x] = hn::Add(acc[x], odd[x]);
  }
  const hn::Full128<float> d4;
  auto s = Sum4(d, acc[0], acc[1 % NK], acc[2 % NK], acc[3 % NK]);
  if (full < dk) {  // float32 / bf16 rows whose length is not a whole number of vectors
    HWY_ALIGN float tail[4] = {0, 0, 0, 0};
    for (size_t x = 0; x < NK; ++x)
      for (size_t e = full; e < dk; ++e) tail[x] += Q[e] * Element<kType>(krow[x], nullptr, e);
    s = hn::Add(s, hn::Load(d4, tail));
  }
  return s;
}

// A tile of stream_row_strided on vector targets: kStreamKeys keys, their scores as one vector (on
// 16-lane targets; two or four on narrower ones), one online-softmax step with the tile's
// exponentials in a vector exp, then the output row by the tile's V rows. The tiles start at the
// first key of the call, so a key's tile (and the result's bits) follow from its position alone.
constexpr size_t kStreamKeys = 16;

// Scores of the tile's keys [x0, x1) into s: four at a time (Scores4) from x0 (a multiple of 4)
// while four remain, the keys past the last four one at a time (KeyScore).
template <int kType, class R, class S>
HWY_INLINE void TileScores(DF d, size_t x0, size_t x1, size_t dk, R krow, S ksc,
                           const float* Q, float* s) {
  const hn::Full128<float> d4;
  size_t x = x0;
  for (; x + 4 <= x1; x += 4) hn::Store(Scores4<kType>(d, dk, krow + x, ksc ? ksc + x : S(), Q), d4, s + x);
  for (; x < x1; ++x) s[x] = KeyScore<kType>(d, dk, krow[x], ksc ? ksc[x] : nullptr, Q);
}

// The tile's online-softmax step: M = max(m, max_x s_x); alpha = e^(m − M) rescales what was
// summed before; p_x = e^(s_x − M) (ExpDiff, exp2-inl.h) written over s; l = alpha·l + Σ_x p_x.
// Lanes past the tile's nk keys are set to -inf first (p = 0). As in SoftmaxStep, while every
// score is -inf the exponent subtracts 0 instead of M (P = 0, not NaN). Returns alpha.
HWY_INLINE float TileSoftmax(DF d, size_t nk, float* s, float& m, float& l) {
  for (size_t x = nk; x < kStreamKeys; ++x) s[x] = -INFINITY;
  const size_t L = hn::Lanes(d);  // 4, 8 or 16: divides kStreamKeys
  VF mx = hn::Load(d, s);
  for (size_t i = L; i < kStreamKeys; i += L) mx = hn::Max(mx, hn::Load(d, s + i));
  const float bm = hn::GetLane(hn::MaxOfLanes(d, mx));
  float alpha = 1.0f;
  if (bm > m) {
    alpha = std::exp(m - bm);
    m = bm;
  }
  const VF mu = hn::Set(d, m == -INFINITY ? 0.0f : m);
  VF sum = hn::Zero(d);
  for (size_t i = 0; i < kStreamKeys; i += L) {
    const VF p = detail::HWY_NAMESPACE::ExpBelowMax(d, hn::Load(d, s + i), mu);
    sum = hn::Add(sum, p);
    hn::Store(p, d, s + i);
  }
  l = alpha * l + LaneSum(d, sum);
  return alpha;
}

// acc (dv = CB vectors) += Σ_x p_x·V_x over the tile's keys [x0, x1): each V row loaded and
// widened once, its vectors multiplied into CB independent sums; an int8 row goes block by block
// of 32 values, its coefficient p_x·scale_b formed once per block.
template <int kType, size_t CB, class R, class S>
HWY_INLINE void TileUpdate(DF d, size_t x0, size_t x1, R vrow, S vsc,
                           const float* p, RawF (&acc)[CB]) {
  constexpr size_t kL = hn::MaxLanes(DF());
  constexpr size_t kPer = kType == kI8 ? 32 / kL : CB;  // vectors of one coefficient per row
  static_assert(CB % kPer == 0);
  for (size_t x = x0; x < x1; ++x)
#pragma GCC unroll 16
    for (size_t b0 = 0; b0 < CB; b0 += kPer) {
      const VF cf = hn::Set(d, kType == kI8 ? p[x] * vsc[x][b0 / kPer] : p[x]);
#pragma GCC unroll 16
      for (size_t b = b0; b < b0 + kPer; ++b)
        acc[b] = ToRaw(hn::MulAdd(cf, LoadRaw<kType>(d, vrow[x], b * kL), FromRaw(acc[b])));
    }
}

// The same for any dv, the row in O: O = alpha·O + Σ_x p_x·V_x over the tile's nk keys, a vector
// of O at a time.
template <int kType, class R, class S>
HWY_INLINE void TileUpdateRow(DF d, size_t nk, size_t dv, R vrow, S vsc,
                              const float* p, float alpha, float* O) {
  constexpr size_t kL = hn::MaxLanes(DF());
  const size_t fullv = dv / kL * kL;
  if constexpr (kType == kI8 && kL == 8) {
    // int8 on 8 lanes: a block of 32 values (4 vectors) at a time, p_x·scale_b formed once a key and
    // block rather than once a vector: the same coefficient, so the same sums (H = 8, d = 128,
    // Nkv = 65536, two threads, alternated: 0.76 of the time; docs/performance.md).
    for (size_t e = 0; e < dv; e += 32) {
      VF o[4];
      for (size_t i = 0; i < 4; ++i) {
        o[i] = hn::LoadU(d, O + e + i * kL);
        if (alpha != 1.0f) o[i] = hn::Mul(o[i], hn::Set(d, alpha));
      }
      for (size_t x = 0; x < nk; ++x) {
        const VF cf = hn::Set(d, p[x] * vsc[x][e / 32]);
        for (size_t i = 0; i < 4; ++i) o[i] = hn::MulAdd(cf, LoadRaw<kType>(d, vrow[x], e + i * kL), o[i]);
      }
      for (size_t i = 0; i < 4; ++i) hn::StoreU(o[i], d, O + e + i * kL);
    }
    return;
  }
  for (size_t e = 0; e < fullv; e += kL) {
    VF o = hn::LoadU(d, O + e);
    if (alpha != 1.0f) o = hn::Mul(o, hn::Set(d, alpha));
    for (size_t x = 0; x < nk; ++x)
      o = hn::MulAdd(hn::Set(d, kType == kI8 ? p[x] * vsc[x][e / 32] : p[x]), LoadRaw<kType>(d, vrow[x], e), o);
    hn::StoreU(o, d, O + e);
  }
  for (size_t e = fullv; e < dv; ++e) {  // float32 / bf16 rows only (int8 dv is a multiple of 32)
    float o = O[e] * alpha;
    for (size_t x = 0; x < nk; ++x) o += p[x] * Element<kType>(vrow[x], nullptr, e);
    O[e] = o;
  }
}

// Rows 0, 1, 2, .. of a contiguous cache (StridedRows, StridedScales) in turn, walked by a pointer
// stepped by the stride: with row x formed as base + x·stride for every key (a multiply on each
// row's address) the same loop read K and V from DRAM at 0.78-0.88 of a copy's rate, stepped at
// 0.93-1.0 (float32, H = 8, d = 128, Nkv = 65536, alternated call by call; docs/performance.md).
template <class R>
struct RowCursor {
  decltype(R::base) p;  // const char* (stride in bytes) or const float* (in floats)
  std::ptrdiff_t stride;
  explicit RowCursor(R r) : p(r.base), stride(r.stride) {}
  auto operator*() const { return p; }
  void operator++() { p += stride; }
};

// out = x (n elements, a multiple of 2L) in pair order: out[c + i] = x[c + 2i], out[c + L + i] =
// x[c + 2i + 1] for each chunk c; RowOrder undoes it.
HWY_INLINE void PairOrder(size_t L, const float* x, size_t n, float* out) {
  for (size_t c = 0; c < n; c += 2 * L)
    for (size_t i = 0; i < L; ++i) {
      out[c + i] = x[c + 2 * i];
      out[c + L + i] = x[c + 2 * i + 1];
    }
}
HWY_INLINE void RowOrder(size_t L, const float* x, size_t n, float* out) {
  for (size_t c = 0; c < n; c += 2 * L)
    for (size_t i = 0; i < L; ++i) {
      out[c + 2 * i] = x[c + i];
      out[c + 2 * i + 1] = x[c + L + i];
    }
}

// Rows that all lie the same o words (4 bytes) past a 64-byte line: a contiguous cache whose base
// is not line-aligned (numpy and malloc align large blocks to 16 bytes). Read where they lie, every
// 64-byte load spans two lines; read line by line (AVX-512), a row costs one load more, its first
// line keeping lanes o.. and its last lanes ..o (masked loads: nothing read outside the row).
// - K (each): vector v of the row's words is lanes o.. of line v joined with line v + 1, one
//   two-source permute, so that a score sums the same products in the same lanes as in place.
// - V (lines): the output row is kept shifted by o lanes, line by line (one accumulator more), and
//   each line goes in as loaded: every element still sums its own products in key order.
// Both give the bits of rows read in place. Time 16 bytes off a line over time aligned, one thread,
// calls alternated (docs/performance.md), in place -> from lines: float32 d = 128 1.13 -> 1.09 in
// L3, 1.08 -> 1.03 from DRAM; bfloat16 d = 128 1.26 -> 1.16 and 1.26 -> 1.03, d = 256 1.31 -> 1.12
// and 1.54 -> 0.94. Taken by StreamKeysFor.
struct NoLines {};
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
class WordsFromLines {
 public:
  // Rows at `base` + j·stride: one offset for all when the stride is whole lines.
  static bool fits(const void* base, std::ptrdiff_t stride) {
    return reinterpret_cast<std::uintptr_t>(base) % 4 == 0 && stride % 64 == 0;
  }
  static bool off_line(const void* base) { return reinterpret_cast<std::uintptr_t>(base) % 64 != 0; }
  explicit WordsFromLines(const void* base)
      : o_(static_cast<int>(reinterpret_cast<std::uintptr_t>(base) % 64 / 4)),
        idx_(_mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                              _mm512_set1_epi32(o_))),
        first_(static_cast<__mmask16>(0xFFFFu << o_)), last_(static_cast<__mmask16>((1u << o_) - 1)) {}
  // The output row into and out of the lines' frame, N vectors of words `stride` floats apart
  // (lines likewise, N + 1 of them): line u holds words [16u − o, 16u + 16 − o), zero outside the
  // row, one permute a vector each way.
  template <size_t N>
  HWY_INLINE void to_lines(const float* words, float* lines, size_t stride) const {
    const __m512i back = _mm512_add_epi32(idx_, _mm512_set1_epi32(16 - 2 * o_));  // lanes 16 − o..
    for (size_t u = 0; u <= N; ++u) {
      const __m512 prev = u > 0 ? _mm512_loadu_ps(words + (u - 1) * stride) : _mm512_setzero_ps();
      const __m512 next = u < N ? _mm512_loadu_ps(words + u * stride) : _mm512_setzero_ps();
      _mm512_storeu_ps(lines + u * stride, _mm512_permutex2var_ps(prev, back, next));
    }
  }
  template <size_t N>
  HWY_INLINE void from_lines(const float* lines, float* words, size_t stride) const {
    for (size_t v = 0; v < N; ++v)
      _mm512_storeu_ps(words + v * stride, _mm512_permutex2var_ps(_mm512_loadu_ps(lines + v * stride), idx_,
                                                                  _mm512_loadu_ps(lines + (v + 1) * stride)));
  }
  // f(u, line u) for the N + 1 lines of a row of N vectors of words.
  template <size_t N, class F>
  HWY_INLINE void lines(const void* row, F&& f) const {
    const float* line = reinterpret_cast<const float*>(static_cast<const char*>(row) - 4 * o_);
    f(0, VF{_mm512_maskz_load_ps(first_, line)});
#pragma GCC unroll 16
    for (size_t u = 1; u < N; ++u) f(u, VF{_mm512_load_ps(line + 16 * u)});
    f(N, VF{_mm512_maskz_load_ps(last_, line + 16 * N)});
  }
  // f(v, words [16v, 16v + 16) of the row) for v < N.
  template <size_t N, class F>
  HWY_INLINE void each(const void* row, F&& f) const {
    const float* line = reinterpret_cast<const float*>(static_cast<const char*>(row) - 4 * o_);
    __m512 prev = _mm512_maskz_load_ps(first_, line);
#pragma GCC unroll 16
    for (size_t v = 0; v < N; ++v) {
      const __m512 next = v + 1 < N ? _mm512_load_ps(line + 16 * (v + 1)) : _mm512_maskz_load_ps(last_, line + 16 * N);
      f(v, VF{_mm512_permutex2var_ps(prev, idx_, next)});
      prev = next;
    }
  }

 private:
  int o_;
  __m512i idx_;
  __mmask16 first_, last_;
};
#endif

// A key's score in the one-row stream of rows of kDk values (StreamKeys, StreamHeads; kDk = 0:
// dk given): KeyScore's, but bfloat16 rows of kDk = an even number of vectors in pair order (q in
// pair order, PairOrder), and int8 rows one product sum per block of 32 values times its scale,
// even and odd blocks in two sums.
template <int kType, size_t kDk>
constexpr bool PairScores() {
  return kType == kBF16 && kDk > 0 && (kDk / hn::MaxLanes(DF())) % 2 == 0;
}
// An int8 key's score before its lane sum (StreamScore is LaneSum of it).
template <size_t kDk>
HWY_INLINE VF Int8ScoreLanes(DF d, size_t dk, const void* row, const float* sc, const float* q) {
  constexpr size_t L = hn::MaxLanes(DF());
  constexpr size_t kPer = 32 / L;  // vectors of one block
  const size_t blocks = (kDk ? kDk : dk) / 32;
  VF a0 = hn::Zero(d), a1 = hn::Zero(d);
#pragma GCC unroll 16
  for (size_t b = 0; b < blocks; ++b) {
    VF t = hn::Mul(LoadRaw<kI8>(d, row, b * 32), hn::LoadU(d, q + b * 32));
#pragma GCC unroll 4
    for (size_t e = 1; e < kPer; ++e)
      t = hn::MulAdd(LoadRaw<kI8>(d, row, b * 32 + e * L), hn::LoadU(d, q + b * 32 + e * L), t);
    if (b % 2 == 0) a0 = hn::MulAdd(hn::Set(d, sc[b]), t, a0);
    else a1 = hn::MulAdd(hn::Set(d, sc[b]), t, a1);
  }
  return hn::Add(a0, a1);
}
template <int kType, size_t kDk>
HWY_INLINE float StreamScore(DF d, size_t dk, const void* row, const float* sc, const float* q) {
  constexpr size_t L = hn::MaxLanes(DF());
  if constexpr (PairScores<kType, kDk>()) {
    (void)sc, (void)dk;
    VF a0 = hn::Zero(d), a1 = hn::Zero(d);
#pragma GCC unroll 16
    for (size_t c = 0; c < kDk; c += 2 * L) {
      const auto w = LoadPairs(row, c);
      a0 = hn::MulAdd(PairLow(d, w), hn::Load(d, q + c), a0);
      a1 = hn::MulAdd(PairHigh(d, w), hn::Load(d, q + c + L), a1);
    }
    return LaneSum(d, hn::Add(a0, a1));
  } else if constexpr (kType != kI8) {
    (void)sc;
    return KeyScore<kType>(d, kDk ? kDk : dk, row, nullptr, q);
  } else {
    return LaneSum(d, Int8ScoreLanes<kDk>(d, dk, row, sc, q));
  }
}

// stream_row_strided with dv = CB vectors (the output row in registers): tiles of kStreamKeys keys
// as StreamTiles, but key by key: tile t's scores are in, then for each x the score of tile
// t + 1's key x (one K row) and the update by tile t's key x (one V row), so that K and V are read
// a row each in turn, kStreamKeys keys apart. StreamTiles' four keys a step (four K rows, then
// four V rows) read at 0.73-0.76 of a copy's rate where a loop of this shape read at 0.93-1.0,
// alternated call by call (float32, H = 8, d = 128, Nkv = 65536; docs/performance.md).
// A key's score is KeyScore's arithmetic (even and odd vectors, then their lane sum); an int8
// key's is Σ_b scale_b·(Q·K)_b over its blocks b of 32 values, even and odd blocks in two sums,
// and its V row goes in through TileUpdate, one coefficient p·scale_b a block. bfloat16 rows with
// dk = dv go in pair order (kPairs, PairLow above), Q and the output row reordered around the keys.
// dk is kDk (= dv, CB vectors, a constant for the compiler), or with kDk = 0 the dk given.
// W: NoLines, or (float32 and bfloat16 rows with dk = kDk) WordsFromLines, K's (wk) and V's (wv).
template <int kType, size_t CB, size_t kDk, class R, class S, class W = NoLines>
HWY_INLINE void StreamKeys(size_t nk, size_t dk_given, R krow, S ksc, R vrow, S vsc, const float* Q, float* m,
                           float* l, float* O, size_t ahead, const RowTransform* tf,
                           const W& wk = W(), const W& wv = W()) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  constexpr size_t L = hn::MaxLanes(DF());
  constexpr size_t esize = kType == kF32 ? 4 : kType == kI8 ? 1 : 2, v_bytes = CB * L * esize;
  constexpr size_t kPer = kType == kI8 ? 32 / L : 1;  // vectors of one int8 block
  constexpr bool kPairs = PairScores<kType, kDk>();
  static_assert(CB % kPer == 0 && (kDk == 0 || kDk == CB * L));
  const size_t dk = kDk ? kDk : dk_given, k_bytes = dk * esize;
  constexpr bool kLines = !std::is_same_v<W, NoLines>;
  static_assert(!kLines || (kDk > 0 && (kType == kF32 || kPairs)));
  // Raw vectors: as Highway's vector structs GCC kept them on the stack (see StreamTiles).
  // From lines, the output row shifted by V's offset: a line more (one more for each of a
  // bfloat16 row's even and odd elements).
  constexpr size_t kAcc = CB + (kLines ? (kPairs ? 2 : 1) : 0);
  RawF acc[kAcc];
  HWY_ALIGN float qp[kPairs ? kDk : 1], op[kPairs ? CB * L : 1];  // Q and O in pair order
  if constexpr (kPairs) {
    PairOrder(L, Q, kDk, qp);
    PairOrder(L, O, CB * L, op);
  }
  float* const row_out = kPairs ? op : O;
  // From lines: the output row's words (float32 elements; bfloat16 in pair order, its even elements
  // and its odd ones, two halves a vector apart) in the lines' frame, for each half.
  HWY_ALIGN float ol[kLines ? kAcc * L : 1];
  constexpr size_t kHalves = kPairs ? 2 : 1, kWordVectors = CB / kHalves;
  if constexpr (kLines)
    for (size_t h = 0; h < kHalves; ++h) wv.template to_lines<kWordVectors>(row_out + h * L, ol + h * L, kHalves * L);
#pragma GCC unroll 16
  for (size_t c = 0; c < kAcc; ++c) acc[c] = ToRaw(hn::LoadU(d, (kLines ? ol : row_out) + c * L));
  // A key's score (StreamScore), its rows from lines as their words in place.
  const auto score = [&](const void* row, const float* sc) HWY_ATTR {
    if constexpr (kLines && kPairs) {
      (void)sc;
      VF a0 = hn::Zero(d), a1 = hn::Zero(d);
      wk.template each<kDk / (2 * L)>(row, [&](size_t v, VF x) HWY_ATTR {  // elements [2Lv, 2Lv + 2L)
        const VU w = hn::BitCast(du, x);
        a0 = hn::MulAdd(PairLow(d, w), hn::Load(d, qp + 2 * L * v), a0);
        a1 = hn::MulAdd(PairHigh(d, w), hn::Load(d, qp + 2 * L * v + L), a1);
      });
      return LaneSum(d, hn::Add(a0, a1));
    } else if constexpr (kLines) {  // float32: KeyScore's sums, even vectors and odd vectors
      (void)sc;
      VF a0 = hn::Zero(d), a1 = hn::Zero(d);
      wk.template each<CB>(row, [&](size_t v, VF x) HWY_ATTR {
        if (v % 2 == 0) a0 = hn::MulAdd(x, hn::LoadU(d, Q + v * L), a0);
        else a1 = hn::MulAdd(x, hn::LoadU(d, Q + v * L), a1);
      });
      return LaneSum(d, hn::Add(a0, a1));
    } else {
      return StreamScore<kType, kDk>(d, dk, row, sc, kPairs ? qp : Q);
    }
  };
  // int8 rows `ahead` keys past those read, a line at a time: K rows are read a
  // tile before their V rows, so one prefetch serves both when ahead >= kStreamKeys; short of
  // that, K's own rows `ahead` past them (as StreamTiles). Walked by cursors as the rows read. The
  // other types go without: read a row at a time they were faster left to the hardware prefetcher
  // (calls alternated in one process, H = 8, Nkv = 65536, 8 KiB ahead against none: without, bf16
  // d = 128 took 0.83-0.89 of the time, float32 d = 64 0.89-0.90, bf16 d = 64 0.96-0.97; int8
  // d = 128 took 0.94-0.97 of the time with it, d = 64 1.05). The scales of a contiguous int8
  // cache are left to the hardware too: a line of them serves 4 keys (d = 128) or 8 (d = 64), and
  // a prefetch of it on every key cost more than it saved (H = 8, Nkv = 65536, two threads,
  // alternated, four runs: d = 128 0.92-0.94 of a copy without against 0.85-0.88 with; d = 64
  // 0.76-0.78 against 0.72; one thread, K and V in L2: 8.4 ns a key against 8.8;
  // docs/performance.md).
  if constexpr (kType != kI8) ahead = 0;
  const size_t k_ahead = ahead >= kStreamKeys ? ahead : kStreamKeys + ahead;
  RowCursor<R> kp{krow + k_ahead}, kc{krow}, vc{vrow};
  const std::ptrdiff_t v_ahead = static_cast<std::ptrdiff_t>(ahead) * vrow.stride;  // from a V row to `ahead` on
  RowCursor<S> ksr{ksc}, vsr{vsc};  // int8 scales as their rows (other types: null, never read or stepped)
  const auto next_k = [&] {  // the next K row (and its scales) to score
    ++kc;
    if constexpr (kType == kI8) ++ksr;
  };
  float mm = *m, ll = *l;
  HWY_ALIGN float s[2][kStreamKeys] = {};  // defined lanes past a short first tile (transforms read them)
  // int8 keys on AVX-512: each key's score vector kept before its lane sum, and the tile's 16 sums
  // taken together (LaneSums16, the same bits as LaneSum).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  constexpr bool kSums16 = kType == kI8 && L == 16 && kStreamKeys == 16;
#else
  constexpr bool kSums16 = false;
#endif
  HWY_ALIGN float lanes[kSums16 ? 2 : 1][kSums16 ? 256 : 1] = {};
  const auto score_into = [&](size_t t, size_t x) HWY_ATTR {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (kSums16) {
      hn::Store(Int8ScoreLanes<kDk>(d, dk, *kc, *ksr, Q), d, lanes[t] + 16 * Lane16Row(x));
      return;
    }
#endif
    s[t][x] = score(*kc, kType == kI8 ? *ksr : nullptr);
  };
  const size_t first = nk < kStreamKeys ? nk : kStreamKeys;
  for (size_t x = 0; x < first; ++x, next_k()) score_into(0, x);
  for (size_t j = 0, t = 0; j < nk; j += kStreamKeys, t ^= 1) {
    const size_t n = nk - j < kStreamKeys ? nk - j : kStreamKeys;
    const size_t rest = nk - j - n, next = rest < kStreamKeys ? rest : kStreamKeys;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (kSums16) hn::Store(LaneSums16(lanes[t]), d, s[t]);
#endif
    if (tf) TransformScores(d, s[t], j, kStreamKeys, *tf);
    const float alpha = TileSoftmax(d, n, s[t], mm, ll);
    if (alpha != 1.0f)
#pragma GCC unroll 16
      for (size_t c = 0; c < kAcc; ++c) acc[c] = ToRaw(hn::Mul(FromRaw(acc[c]), hn::Set(d, alpha)));
    for (size_t x = 0; x < n; ++x, ++vc) {
      if (ahead) {
        // V's rows at a fixed distance from the row read, no cursor of their own, and no bound:
        // past the cache's end a prefetch asks for a line no one reads (it never faults). One
        // cursor and two tests a key fewer: 7.81 against 8.04 ns a key in L2 (one thread, int8,
        // d = 128), from DRAM 1.00-1.06x the rate (docs/performance.md).
        prefetch_bytes(*kp, k_bytes, CacheLevel::near);
        prefetch_bytes(static_cast<const char*>(*vc) + v_ahead, v_bytes, CacheLevel::near);
        ++kp;
      }
      if (x < next) {
        score_into(t ^ 1, x);
        next_k();
      }
      const void* row = *vc;
      const float* sc = kType == kI8 ? *vsr : nullptr;
      if constexpr (kLines) {  // this key's V row, line by line (in pair order for bfloat16)
        const VF p = hn::Set(d, s[t][x]);
        wv.template lines<kPairs ? CB / 2 : CB>(row, [&](size_t u, VF x) HWY_ATTR {
          if constexpr (kPairs) {
            const VU w = hn::BitCast(du, x);
            acc[2 * u] = ToRaw(hn::MulAdd(p, PairLow(d, w), FromRaw(acc[2 * u])));
            acc[2 * u + 1] = ToRaw(hn::MulAdd(p, PairHigh(d, w), FromRaw(acc[2 * u + 1])));
          } else {
            acc[u] = ToRaw(hn::MulAdd(p, x, FromRaw(acc[u])));
          }
        });
      } else if constexpr (kPairs) {  // this key's V row, in pair order
        const VF p = hn::Set(d, s[t][x]);
#pragma GCC unroll 16
        for (size_t c = 0; c < CB; c += 2) {
          const auto w = LoadPairs(row, c * L);
          acc[c] = ToRaw(hn::MulAdd(p, PairLow(d, w), FromRaw(acc[c])));
          acc[c + 1] = ToRaw(hn::MulAdd(p, PairHigh(d, w), FromRaw(acc[c + 1])));
        }
      } else {
        TileUpdate<kType, CB>(d, 0, 1, &row, &sc, s[t] + x, acc);  // this key's V row
      }
      if constexpr (kType == kI8) ++vsr;
    }
  }
#pragma GCC unroll 16
  for (size_t c = 0; c < kAcc; ++c) hn::StoreU(FromRaw(acc[c]), d, (kLines ? ol : row_out) + c * L);
  if constexpr (kLines)
    for (size_t h = 0; h < kHalves; ++h) wv.template from_lines<kWordVectors>(ol + h * L, row_out + h * L, kHalves * L);
  if constexpr (kPairs) RowOrder(L, op, CB * L, O);
  *m = mm;
  *l = ll;
}

// stream_row_strided on vector targets: the keys in tiles of kStreamKeys (the last one partial), for rows
// StreamKeys does not take (int8 with dk != dv; dv not 4, 8 or 16 vectors). With the output row
// in registers (CB > 0) the tiles are pipelined: while tile t's V rows update the row,
// kStep keys at a time, tile t + 1's scores are computed kStep keys at a time between them, so that
// its K rows are read beside tile t's V rows (from DRAM both streams then move together, as key
// by key) and the softmax's chain of dependent steps overlaps the next tile's arithmetic.
template <int kType, size_t CB, size_t kStep, class R, class S>
HWY_INLINE void StreamTiles(size_t nk, size_t dk, size_t dv, R krow, S ksc, R vrow, S vsc, const float* Q, float* m,
                            float* l, float* O, size_t ahead, const RowTransform* tf) {
  const DF d;
  const size_t L = hn::Lanes(d);
  float mm = *m, ll = *l;
  const size_t esize = kType == kF32 ? 4 : kType == kI8 ? 1 : 2;
  // The K rows (with k) and V rows (with v), and their int8 scales, of the n keys `ahead` keys past
  // key j within the call, a line at a time.
  auto prefetch = [&](size_t j, size_t n, bool k = true, bool v = true) {
    if (!ahead || j + ahead >= nk) return;
    const size_t x0 = j + ahead, x1 = j + ahead + n < nk ? j + ahead + n : nk;
    if constexpr (kType == kI8 && std::is_same_v<R, StridedRows>) {
      // int8 rows that follow each other (a contiguous cache): the keys' K rows as one run, then
      // their V rows, then each stream's scales. Against key by key (each key's K row, V row and
      // scale lines), alternated in one process, H = 8, d = 128, two threads, time: Nkv = 65536
      // 0.94-1.00 (median 0.96 over seven runs), 262144 0.94-0.98; bf16 rows lost that way
      // (1.02-1.05), and so did int8 rows key by key without the repeated scale lines (1.03-1.04).
      if (krow.stride == static_cast<std::ptrdiff_t>(dk) && vrow.stride == static_cast<std::ptrdiff_t>(dv)) {
        const auto run = [](const void* first, const void* end) {  // the lines of [first, end)
          const auto* p = reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(first) & ~std::uintptr_t{63});
          for (; p < static_cast<const char*>(end); p += 64) prefetch_line(p, CacheLevel::near);
        };
        if (k) run(krow[x0], krow[x1]);
        if (v) run(vrow[x0], vrow[x1]);
        if (k) run(ksc[x0], ksc[x1]);
        if (v) run(vsc[x0], vsc[x1]);
        return;
      }
    }
    for (size_t x = x0; x < x1; ++x) {
      if (k) prefetch_bytes(krow[x], dk * esize, CacheLevel::near);
      if (v) prefetch_bytes(vrow[x], dv * esize, CacheLevel::near);
      if (kType == kI8 && k) prefetch_line(ksc[x], CacheLevel::near);
      if (kType == kI8 && v) prefetch_line(vsc[x], CacheLevel::near);
    }
  };
  // The prefetches of a pipelined step of `step` keys from key j + x, whose V rows it reads beside
  // the K rows of the next tile. K rows are read a tile ahead of the V rows, so rows `ahead` keys
  // past the V rows lie ahead - kStreamKeys keys past the K rows read. Short of a tile (rows of more
  // than 512 bytes of K and V a key) that is behind them, and K rows are prefetched `ahead` keys past
  // their own reads instead (bf16, d = 256: 6.3 -> 4.8 ms; docs/performance.md). Longer, the one
  // prefetch serves both (moving K's further ahead was faster in some memory states and slower in
  // others).
  auto prefetch_step = [&](size_t j, size_t x, size_t step) {
    if (ahead >= kStreamKeys) {
      prefetch(j + x, step);
    } else {
      prefetch(j + kStreamKeys + x, step, true, false);
      prefetch(j + x, step, false, true);
    }
  };
  HWY_ALIGN float s[2][kStreamKeys] = {};  // defined lanes past a short first tile (transforms read them)
  auto keys = [&](size_t j) { return j < nk ? (nk - j < kStreamKeys ? nk - j : kStreamKeys) : 0; };
  // The end of the step of `step` keys from key x < n of a tile of n keys.
  auto step_end = [](size_t x, size_t step, size_t n) { return n - x < step ? n : x + step; };
  auto kr = [&](size_t j) { return krow + j; };
  auto ks = [&](size_t j) { return ksc ? ksc + j : S(); };
  if constexpr (CB > 0) {
    // Raw vectors: as Highway's vector structs GCC kept them on the stack, loaded and stored
    // around every four keys (one thread, rows in L3: int8 0.93, bf16 0.96-0.99 of the time).
    RawF acc[CB];
#pragma GCC unroll 16
    for (size_t b = 0; b < CB; ++b) acc[b] = ToRaw(hn::LoadU(d, O + b * L));
    if (nk) TileScores<kType>(d, 0, keys(0), dk, kr(0), ks(0), Q, s[0]);
    for (size_t j = 0, t = 0; j < nk; j += kStreamKeys, t ^= 1) {
      const size_t n = keys(j), next = keys(j + kStreamKeys);
      if (tf) TransformScores(d, s[t], j, kStreamKeys, *tf);
      const float alpha = TileSoftmax(d, n, s[t], mm, ll);
      if (alpha != 1.0f)
#pragma GCC unroll 16
        for (size_t b = 0; b < CB; ++b) acc[b] = ToRaw(hn::Mul(FromRaw(acc[b]), hn::Set(d, alpha)));
      const R vr = vrow + j;
      const S vs = vsc ? vsc + j : S();
      for (size_t x = 0; x < kStreamKeys; x += kStep) {
        prefetch_step(j, x, kStep);
        if (x < next) {
          TileScores<kType>(d, x, step_end(x, kStep, next), dk, kr(j + kStreamKeys), ks(j + kStreamKeys), Q, s[t ^ 1]);
        }
        if (x < n) TileUpdate<kType, CB>(d, x, step_end(x, kStep, n), vr, vs, s[t], acc);
      }
    }
#pragma GCC unroll 16
    for (size_t b = 0; b < CB; ++b) hn::StoreU(FromRaw(acc[b]), d, O + b * L);
  } else if constexpr (hn::MaxLanes(DF()) == 8) {
    // The output row in memory (AVX2 at dv = 16 vectors: its 16 registers cannot hold the row),
    // pipelined as above: tile t + 1's scores between tile t's V rows, row_step keys at a time,
    // float32 one key at a time (KeyScore), the others four (Scores4, the bits of the tile at
    // once). H = 8, d = 128, Nkv = 65536, two threads, alternated, time against the tile at once:
    // float32 0.76 (four keys 1.10), bf16 0.75 (one key 1.10), int8 0.86 (docs/performance.md).
    // int8 rows of up to 16 vectors go eight keys a step (each output vector loaded and stored
    // once per eight keys; the same bits). Against four, alternated in one process, H = 8,
    // d = 128, time: two threads, Nkv = 65536, 0.93-0.97 in six runs of seven (1.10 in one slow
    // phase), 262144 0.96-0.97; one thread in cache (Nkv = 2048) 0.93. bf16 and float16 rows
    // lost that way (1.09-1.11), and int8 rows of 32 vectors (d = 256: 1.5; docs/performance.md).
    const size_t row_step = kType == kF32 ? 1 : kType == kI8 && dv <= 16 * L ? 8 : 4;
    const size_t n0 = keys(0);
    for (size_t x = 0; x < n0; x += row_step) TileScores<kType>(d, x, step_end(x, row_step, n0), dk, kr(0), ks(0), Q, s[0]);
    for (size_t j = 0, t = 0; j < nk; j += kStreamKeys, t ^= 1) {
      const size_t n = keys(j), next = keys(j + kStreamKeys);
      if (tf) TransformScores(d, s[t], j, kStreamKeys, *tf);
      const float alpha = TileSoftmax(d, n, s[t], mm, ll);
      const R vr = vrow + j;
      const S vs = vsc ? vsc + j : S();
      for (size_t x = 0; x < kStreamKeys; x += row_step) {
        prefetch_step(j, x, row_step);
        if (x < next)
          TileScores<kType>(d, x, step_end(x, row_step, next), dk, kr(j + kStreamKeys), ks(j + kStreamKeys), Q,
                            s[t ^ 1]);
        // alpha with the first keys, then 1 (an exact multiply): the sums of the tile at once.
        if (x < n)
          TileUpdateRow<kType>(d, step_end(x, row_step, n) - x, dv, vr + x, vs ? vs + x : S(), s[t] + x,
                               x == 0 ? alpha : 1.0f, O);
      }
    }
  } else {
    for (size_t j = 0; j < nk; j += kStreamKeys) {
      const size_t n = keys(j);
      prefetch(j, kStreamKeys);
      TileScores<kType>(d, 0, n, dk, kr(j), ks(j), Q, s[0]);
      if (tf) TransformScores(d, s[0], j, kStreamKeys, *tf);
      const float alpha = TileSoftmax(d, n, s[0], mm, ll);
      TileUpdateRow<kType>(d, n, dv, vrow + j, vsc ? vsc + j : S(), s[0], alpha, O);
    }
  }
  *m = mm;
  *l = ll;
}
#endif

#if HWY_TARGET != HWY_SCALAR
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// StreamKeys from lines, a function of its own: inlined beside the other paths, it made GCC
// compile them slower (rows in place, one thread, in L2: 1.06-1.09x the time).
template <int kType, size_t CB, class R, class S>
HWY_NOINLINE void StreamKeysFromLines(size_t nk, R krow, S ksc, R vrow, S vsc, const float* Q, float* m, float* l,
                                      float* O, size_t ahead, const RowTransform* tf) {
  constexpr size_t kDv = CB * hn::MaxLanes(DF());
  StreamKeys<kType, CB, kDv>(nk, kDv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf, WordsFromLines(krow[0]),
                             WordsFromLines(vrow[0]));
}
#endif
// StreamKeys with dv = CB vectors, dk = dv a constant for the compiler (int8 rows: the only dk).
template <int kType, size_t CB, class R, class S>
HWY_INLINE void StreamKeysFor(size_t nk, size_t dk, R krow, S ksc, R vrow, S vsc, const float* Q, float* m,
                              float* l, float* O, size_t ahead, const RowTransform* tf) {
  constexpr size_t kDv = CB * hn::MaxLanes(DF());
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  // Float32 and bfloat16 rows of a contiguous cache off a line (rows a whole number of lines
  // apart) go in from whole lines (WordsFromLines), but rows of under four lines (bfloat16,
  // d = 64), where the line more is a quarter more loads and sums: against aligned rows, in L3
  // 1.15-1.18 of the time (in place 1.03-1.13), from DRAM 0.90-1.10 (in place 0.98-1.55;
  // docs/performance.md).
  if constexpr ((kType == kF32 || kType == kBF16) && kDv * (kType == kF32 ? 4 : 2) >= 256) {
    using WL = WordsFromLines;
    if (dk == kDv && (WL::off_line(krow.base) || WL::off_line(vrow.base)) && WL::fits(krow.base, krow.stride) &&
        WL::fits(vrow.base, vrow.stride))
      return StreamKeysFromLines<kType, CB>(nk, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
  }
#endif
  if (kType == kI8 || dk == kDv) return StreamKeys<kType, CB, kDv>(nk, dk, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
  if constexpr (kType != kI8) StreamKeys<kType, CB, 0>(nk, dk, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
}

// The output row in registers when it is 4, 8 or (16-lane targets) 16 whole vectors.
template <int kType, size_t kStep, class R, class S>
HWY_INLINE void StreamRowSteps(size_t nk, size_t dk, size_t dv, R krow, S ksc, R vrow, S vsc, const float* Q, float* m,
                               float* l, float* O, size_t ahead, size_t L,
                               const RowTransform* tf) {
  // Key by key (StreamKeys), but int8 rows with dk != dv, which stay on StreamTiles: dk = 192,
  // dv = 128, H = 8, two threads, alternated in one process against StreamTiles (fractions of a
  // copy beside them; docs/performance.md): float32 from DRAM (Nkv = 32768) 1.042 against 0.767,
  // cache-resident (H = 4, Nkv = 1024) 3.21 against 2.53 of the DRAM copy; bf16 1.130 against
  // 0.712, cached 1.755 against 1.458; float16 1.148 / 1.232 against 0.955 / 1.021, cached
  // 1.653 / 1.723 against 1.458 / 1.626; int8 0.809 / 0.736 / 0.826 against 0.792 / 0.824 /
  // 0.832, cached (Nkv = 2048) 0.866 / 0.950 / 0.886 against 0.954 / 0.964 / 1.085.
  if (dk == dv || kType != kI8) {
    if constexpr (kAccumulators >= 16)
      if (dv == 16 * L) return StreamKeysFor<kType, 16>(nk, dk, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
    if (dv == 8 * L) return StreamKeysFor<kType, 8>(nk, dk, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
    if (dv == 4 * L) return StreamKeysFor<kType, 4>(nk, dk, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
  }
  if constexpr (kType == kI8) {
    if constexpr (kAccumulators >= 16)
      if (dv == 16 * L) return StreamTiles<kType, 16, kStep>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
    if (dv == 8 * L) return StreamTiles<kType, 8, kStep>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
    if (dv == 4 * L) return StreamTiles<kType, 4, kStep>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
  }
  return StreamTiles<kType, 0, 4>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);  // kStep unused
}
#endif

template <int kType, class R, class S>
void StreamRowDispatch(size_t nk, size_t dk, size_t dv, R krow, S ksc, R vrow, S vsc, const float* Q, float* m,
                       float* l, float* O, size_t ahead, const RowTransform* tf) {
#if HWY_TARGET != HWY_SCALAR
  const size_t L = hn::Lanes(DF());
  // StreamTiles' step with the output row in registers, which only int8 rows with dk != dv take
  // (StreamRowSteps): rows of up to 128 values go 16 keys a step (a tile), longer ones 4. Against 4,
  // alternated in one process when every int8 row went this way (dk = dv, H = 8, Nkv = 65536,
  // 2 threads, 9 rounds, two runs): d = 64 0.81-0.84 of the time, d = 128 0.91-0.92, d = 256 1.11.
  if constexpr (kType == kI8)
    if (dk <= 128) return StreamRowSteps<kType, 16>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, L, tf);
  return StreamRowSteps<kType, 4>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, L, tf);
#else
  (void)ahead;
  StreamRowT<kType>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, tf);
#endif
}

#if HWY_TARGET != HWY_SCALAR
// stream_heads (kv_kernels.h): one query row for each of several KV heads whose rows of a key lie
// together, each head with stream_row_strided's arithmetic, but the keys read in address order:
// key x's K rows of all heads (one run of memory where the heads' rows touch), then its V rows. A
// head's own rows lie a run's length apart (4 KiB for 8 heads of 128 float32 values), a stride
// the hardware prefetcher does not follow: head by head, a paged or FlashAttention-layout cache
// read at about half of a contiguous cache's rate (docs/performance.md).
// Same bits as stream_row_strided on the same keys, on every target: its tiles of kStreamKeys keys from
// the call's first, the same scores (kQuads: StreamTiles', Scores4's sums for keys of whole groups
// of four, KeyScore's for the rest; else StreamKeys', StreamScore with dk = kDk), the same softmax
// step per tile (TileSoftmax), and each output element's sum in the same order (alpha·O, then
// p_x·V_x key by key, as TileUpdate and TileUpdateRow: a multiply-add per vector element with an
// int8 row's coefficient p_x·scale_b, a multiply and an add past the last whole vector).
// The output rows stay in memory (heads·dv floats, in L1), loaded and stored around each key:
// several keys a step per head read V rows out of address order again, and lost (bf16 d = 128
// 1.45 -> 1.19 of a contiguous cache's time with one key, int8 1.77 -> 1.34; docs/performance.md).
template <int kType, size_t kDk, bool kQuads>
HWY_INLINE void StreamHeadsT(size_t nk, size_t heads, size_t dk, size_t dv, const HeadRows& K, const HeadRows& V,
                             const HeadRow* hr, size_t ahead, size_t known, float* work) {
  const DF d;
  constexpr size_t L = hn::MaxLanes(DF()), kT = kStreamKeys;
  constexpr bool kPairs = !kQuads && PairScores<kType, kDk>();
  constexpr size_t kPer = kType == kI8 ? 32 / L : 1;  // vectors of one coefficient of V
  const size_t fullv = dv / L * L;
  // [2][heads][kT]: the scores of tile t, then t + 1's, from the first 64-byte boundary of work
  // (whole vectors, as TileSoftmax and StreamScore load them).
  float* const s = reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(work) + 63) / 64 * 64);
  float* const qp = s + 2 * heads * kT;  // kPairs: each head's q in pair order
  std::fill_n(s, 2 * heads * kT, 0.0f);  // defined lanes past a short tile (transforms read them)
  if constexpr (kPairs)
    for (size_t h = 0; h < heads; ++h) PairOrder(L, hr[h].q, kDk, qp + h * kDk);
  const auto q_of = [&](size_t h) { return kPairs ? qp + h * kDk : hr[h].q; };
  const auto row = [](const HeadRows& R, size_t j, size_t h) {
    return static_cast<const void*>(static_cast<const char*>(R.row[j]) + static_cast<std::ptrdiff_t>(h) * R.head);
  };
  const auto scales = [](const HeadRows& R, size_t j, size_t h) -> const float* {
    return kType == kI8 ? R.scales[j] + static_cast<std::ptrdiff_t>(h) * R.scales_head : nullptr;
  };
  // The scores of key x of the tile of n keys from key j, each head's (into st + x, a row of kT
  // per head).
  const auto score = [&](size_t j, size_t x, size_t n, float* st) HWY_ATTR {
    for (size_t h = 0; h < heads; ++h) {
      const void* const kr = row(K, j + x, h);
      const float* const ks = scales(K, j + x, h);
      if constexpr (kQuads) {
        const float* const* kss = kType == kI8 ? &ks : nullptr;
        st[h * kT + x] = x < n / 4 * 4 ? hn::GetLane(Scores4<kType, 1>(d, dk, &kr, kss, q_of(h)))
                                       : KeyScore<kType>(d, dk, kr, ks, q_of(h));
      } else {
        st[h * kT + x] = StreamScore<kType, kDk>(d, dk, kr, ks, q_of(h));
      }
    }
  };
  // O_h += p_h·V_h of key j for each head (p_h at p[h·kT]).
  const auto update = [&](size_t j, const float* p) HWY_ATTR {
    for (size_t h = 0; h < heads; ++h) {
      const void* const vr = row(V, j, h);
      const float* const vs = scales(V, j, h);
      const float ph = p[h * kT];
      float* const o = hr[h].o;
      for (size_t e0 = 0; e0 < fullv; e0 += kPer * L) {
        const VF cf = hn::Set(d, kType == kI8 ? ph * vs[e0 / 32] : ph);
#pragma GCC unroll 4
        for (size_t e = e0; e < e0 + kPer * L; e += L)
          hn::StoreU(hn::MulAdd(cf, LoadRaw<kType>(d, vr, e), hn::LoadU(d, o + e)), d, o + e);
      }
      for (size_t e = fullv; e < dv; ++e) o[e] += ph * Element<kType>(vr, nullptr, e);  // not int8 (dv % 32 == 0)
    }
  };
  // The K and V rows of all heads of key j (and int8 scales), when given (j < known).
  const size_t esize = kType == kF32 ? 4 : kType == kI8 ? 1 : 2;
  const std::int64_t k_run = static_cast<std::int64_t>((heads - 1) * static_cast<size_t>(K.head) + dk * esize);
  const std::int64_t v_run = static_cast<std::int64_t>((heads - 1) * static_cast<size_t>(V.head) + dv * esize);
  const CacheLevel level = feed_level();  // L2 on Intel's cores (prefetch.cc)
  const auto prefetch = [&](size_t j) {
    if (j >= known) return;
    prefetch_bytes(K.row[j], k_run, level);
    prefetch_bytes(V.row[j], v_run, level);
    if constexpr (kType == kI8) {
      prefetch_line(K.scales[j], CacheLevel::near);
      prefetch_line(V.scales[j], CacheLevel::near);
    }
  };
  const size_t first = nk < kT ? nk : kT;
  for (size_t x = 0; x < first; ++x) score(0, x, first, s);
  for (size_t j = 0, t = 0; j < nk; j += kT, t ^= 1) {
    const size_t n = nk - j < kT ? nk - j : kT;
    const size_t rest = nk - j - n, next = rest < kT ? rest : kT;
    float* const st = s + t * heads * kT;
    float* const sn = s + (t ^ 1) * heads * kT;
    for (size_t h = 0; h < heads; ++h) {
      float* const sh = st + h * kT;
      if (hr[h].tf) TransformScores(d, sh, j, kT, *hr[h].tf);
      const float alpha = TileSoftmax(d, n, sh, *hr[h].m, *hr[h].l);
      float* const o = hr[h].o;
      if (alpha != 1.0f)
        for (size_t e = 0; e < fullv; e += L) hn::StoreU(hn::Mul(hn::LoadU(d, o + e), hn::Set(d, alpha)), d, o + e);
      for (size_t e = fullv; e < dv; ++e) o[e] *= alpha;
    }
    // Key x of the next tile scored beside key x of this one updating, so that K and V stream
    // side by side (as StreamKeys and StreamTiles do).
    for (size_t x = 0; x < n; ++x) {
      if (ahead) prefetch(j + x + ahead);
      if (x < next) score(j + kT, x, next, sn);
      update(j + x, st + x);
    }
  }
}

template <int kType>
HWY_INLINE void StreamHeadsDispatch(size_t nk, size_t heads, size_t dk, size_t dv, const HeadRows& K,
                                    const HeadRows& V, const HeadRow* hr, size_t ahead, size_t known, float* work) {
  const size_t L = hn::Lanes(DF());
  // As StreamRowSteps chooses: StreamKeys' scores where it takes the rows, with dk a constant
  // (StreamKeysFor) for int8 and dk = dv; else StreamTiles'.
  if (dk == dv || kType != kI8) {
    const auto keys = [&](auto cb) HWY_ATTR {
      constexpr size_t kDv = decltype(cb)::value * hn::MaxLanes(DF());
      if (kType == kI8 || dk == kDv)
        return StreamHeadsT<kType, kDv, false>(nk, heads, dk, dv, K, V, hr, ahead, known, work);
      if constexpr (kType != kI8) StreamHeadsT<kType, 0, false>(nk, heads, dk, dv, K, V, hr, ahead, known, work);
    };
    if constexpr (kAccumulators >= 16)
      if (dv == 16 * L) return keys(std::integral_constant<size_t, 16>());
    if (dv == 8 * L) return keys(std::integral_constant<size_t, 8>());
    if (dv == 4 * L) return keys(std::integral_constant<size_t, 4>());
  }
  // StreamTiles: float32 rows on 8 lanes (the output row in memory) score key by key, others in
  // groups of four.
  if (hn::MaxLanes(DF()) == 8 && kType == kF32)
    return StreamHeadsT<kType, 0, false>(nk, heads, dk, dv, K, V, hr, ahead, known, work);
  StreamHeadsT<kType, 0, true>(nk, heads, dk, dv, K, V, hr, ahead, known, work);
}
#endif

#if HWY_TARGET != HWY_SCALAR
// Element c of a key row as float32: float32 rows, and bf16 rows read as their 16-bit
// patterns, float16 rows.
HWY_INLINE float RowValue(const float* row, size_t c) { return row[c]; }
HWY_INLINE float RowValue(const std::uint16_t* row, size_t c) { return Element<kBF16>(row, nullptr, c); }
HWY_INLINE float RowValue(const f16* row, size_t c) { return from_f16(row[c]); }

// scores_quads (kv_kernels.h): kQuadKeys keys (rows by pointer) against one block of 8 packed rows,
// S[r][x] for rows r < nr and keys x < kQuadKeys. Key x has two accumulators, rows 0-3 and rows
// 4-7 (kHalves = 2; rows 0-3 alone for blocks of up to 4 rows): lane 4h + i sums
// Q[h][4u + i]·K_x[4u + i] over the column quads u, one 128-bit broadcast of
// (K_x[4u], .., K_x[4u + 3]) feeding both (16 chains, one load per two multiply-adds). The end
// adds each 128-bit block's four lanes as (i0 + i2) + (i1 + i3), four keys at a time (QuadSums).
constexpr size_t kQuadKeys = 8;

// Four keys' accumulators A, B, C, E (the same rows): block h of the result holds the sums of
// block h's four lanes of A, B, C and E, as (i0 + i2) + (i1 + i3), by two interleaves of 32-bit and
// two of 64-bit lanes.
template <class D>
HWY_INLINE hn::Vec<D> QuadSums(D d, hn::Vec<D> A, hn::Vec<D> B, hn::Vec<D> C, hn::Vec<D> E) {
  const hn::Repartition<double, D> dd;
  const auto s0 = hn::BitCast(dd, hn::Add(hn::InterleaveLower(d, A, B), hn::InterleaveUpper(d, A, B)));
  const auto s1 = hn::BitCast(dd, hn::Add(hn::InterleaveLower(d, C, E), hn::InterleaveUpper(d, C, E)));
  return hn::Add(hn::BitCast(d, hn::InterleaveLower(dd, s0, s1)), hn::BitCast(d, hn::InterleaveUpper(dd, s0, s1)));
}

// Block h of r (16 lanes: four blocks of four scores, QuadSums) to out + h·lds, for h < rows.
template <class D>
HWY_INLINE void StoreBlocks(D, hn::Vec<D> r, float* out, size_t lds, size_t rows) {
  const hn::Half<D> dh;
  const hn::Half<decltype(dh)> dq;
  const auto lo = hn::LowerHalf(dh, r), hi = hn::UpperHalf(dh, r);
  if (0 < rows) hn::StoreU(hn::LowerHalf(dq, lo), dq, out);
  if (1 < rows) hn::StoreU(hn::UpperHalf(dq, lo), dq, out + lds);
  if (2 < rows) hn::StoreU(hn::LowerHalf(dq, hi), dq, out + 2 * lds);
  if (3 < rows) hn::StoreU(hn::UpperHalf(dq, hi), dq, out + 3 * lds);
}

// The end of QuadKeys (and of PairKeys by 8 columns): block h of a key's accumulator `half` holds
// row 4·half + h's four partial sums; QuadSums adds them for four keys, to S + (4·half + h)·lds.
template <size_t kHalves, class D>
HWY_INLINE void QuadEnd(D d, hn::Vec<D> (&a)[kQuadKeys][2], float* S, size_t lds, size_t nr) {
#pragma GCC unroll 2
  for (size_t half = 0; half < kHalves; ++half)
#pragma GCC unroll 2
    for (size_t x = 0; x < kQuadKeys; x += 4) {
      const auto r = QuadSums(d, a[x][half], a[x + 1][half], a[x + 2][half], a[x + 3][half]);
      const size_t h0 = 4 * half;
      StoreBlocks(d, r, S + h0 * lds + x, lds, nr > h0 ? nr - h0 : 0);
    }
}

// A key's quad u as float32 in every 128-bit block: float32 rows by one broadcast load; float16
// rows (read in place, AVX-512) by a 64-bit broadcast load, then one conversion of its 16 halves.
template <class D>
HWY_INLINE hn::Vec<D> Quad(D d, const float* row, size_t u) { return hn::LoadDup128(d, row + 4 * u); }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
HWY_INLINE VF Quad(DF, const f16* row, size_t u) {
  std::int64_t bits;
  std::memcpy(&bits, row + 4 * u, 8);
  return VF{_mm512_cvtph_ps(_mm256_set1_epi64x(bits))};
}
#endif

template <size_t kHalves, class D, class T>
HWY_INLINE void QuadKeys(D d, size_t dk, const T* const* krow, const float* packed, float* S, size_t lds,
                         size_t nr, LineFeed& feed) {
  const size_t quads = dk / 4, tail = dk % 4;
  hn::Vec<D> a[kQuadKeys][2];
#pragma GCC unroll 8
  for (size_t x = 0; x < kQuadKeys; ++x) a[x][0] = a[x][1] = hn::Zero(d);
  auto madd = [&](size_t x, hn::Vec<D> q0, hn::Vec<D> q1, hn::Vec<D> k) {
    a[x][0] = hn::MulAdd(q0, k, a[x][0]);
    if constexpr (kHalves == 2) a[x][1] = hn::MulAdd(q1, k, a[x][1]);
  };
  for (size_t u = 0; u < quads; ++u) {
    feed.next();
    const auto q0 = hn::LoadU(d, packed + u * 32), q1 = hn::LoadU(d, packed + u * 32 + 16);
    // The eight row pointers read from memory each step: left to itself GCC kept them in vector
    // registers (its general ones taken) and moved each to a general register before its load,
    // eight vmovq a step. Hq = 32, Hkv = 4, d = 128, calls alternated in one process: K and V in
    // cache 36.1 / 38.5 ns a key against 37.4 / 39.0 (one thread), 36.9 against 38.9 (two); from
    // DRAM 0.760 / 0.768 of a copy against 0.746 / 0.743 (docs/performance.md).
    const T* const* rows = krow;
#if defined(__GNUC__)
    asm("" : "+r"(rows));
#endif
#pragma GCC unroll 8
    for (size_t x = 0; x < kQuadKeys; ++x) {
      madd(x, q0, q1, Quad(d, rows[x], u));
    }
  }
  for (size_t t = 0; t < tail; ++t) {  // the last columns one at a time, each with its own Q lanes
    const float* qt = packed + (quads + t) * 32;
    const auto q0 = hn::LoadU(d, qt), q1 = hn::LoadU(d, qt + 16);
#pragma GCC unroll 8
    for (size_t x = 0; x < kQuadKeys; ++x) madd(x, q0, q1, hn::Set(d, RowValue(krow[x], 4 * quads + t)));
  }
  QuadEnd<kHalves>(d, a, S, lds, nr);
}

// The last `tail` columns col + t one at a time (QuadKeys8, TripleKeys8, OctKeys, PairKeys): slot t
// of the packed rows (32 floats from qt, its NH vectors `second` floats apart) against K_x[col + t]
// broadcast, into the NH accumulators of every key.
template <size_t NK, size_t NH, class D, class T>
HWY_INLINE void TailColumns(D d, size_t tail, const float* qt, size_t second, const T* const* krow, size_t col,
                            hn::Vec<D> (&a)[NK][NH]) {
  for (size_t t = 0; t < tail; ++t, qt += 32) {
    hn::Vec<D> q[NH];
#pragma GCC unroll 4
    for (size_t h = 0; h < NH; ++h) q[h] = hn::LoadU(d, qt + h * second);
#pragma GCC unroll 8
    for (size_t x = 0; x < NK; ++x) {
      const auto k = hn::Set(d, RowValue(krow[x], col + t));
#pragma GCC unroll 4
      for (size_t h = 0; h < NH; ++h) a[x][h] = hn::MulAdd(q[h], k, a[x][h]);
    }
  }
}

// The same for 8-lane targets (AVX2) and blocks of up to 4 rows: four keys against the rows, one
// 128-bit broadcast of K_x's quad u feeding two accumulators (rows 0-1 and 2-3, one row per
// 128-bit block), 8 chains, one load per two multiply-adds. More rows take TripleKeys8 (below).
constexpr size_t kQuadKeys8 = 4, kQuadSteps8 = 4;
// quad(u) for the column quads u < quads, kQuadSteps8 quads a step of the feed (QuadKeys8 and
// TripleKeys8; see QuadKeys8 for why four).
template <class F>
HWY_INLINE void FeedQuads(size_t quads, LineFeed& feed, const F& quad) {
  size_t u = 0;
  for (; u + kQuadSteps8 <= quads; u += kQuadSteps8) {
    feed.next();
#pragma GCC unroll 4
    for (size_t i = 0; i < kQuadSteps8; ++i) quad(u + i);
  }
  for (; u < quads; ++u) {
    feed.next();
    quad(u);
  }
}
template <class D>
HWY_INLINE void QuadKeys8(D d, size_t dk, const float* const* krow, const float* packed, float* S, size_t lds,
                          size_t nr, LineFeed& feed) {
  const hn::Half<D> dh;
  const size_t quads = dk / 4, tail = dk % 4;
  hn::Vec<D> a[kQuadKeys8][2];
#pragma GCC unroll 4
  for (size_t x = 0; x < kQuadKeys8; ++x) a[x][0] = a[x][1] = hn::Zero(d);
  const auto quad = [&](size_t u) HWY_ATTR {
    const auto q0 = hn::LoadU(d, packed + u * 32), q1 = hn::LoadU(d, packed + u * 32 + 8);
#pragma GCC unroll 4
    for (size_t x = 0; x < kQuadKeys8; ++x) {
      const auto k = hn::LoadDup128(d, krow[x] + 4 * u);
      a[x][0] = hn::MulAdd(q0, k, a[x][0]);
      a[x][1] = hn::MulAdd(q1, k, a[x][1]);
    }
  };
  // Four quads a step of the feed (kQuadSteps8): a step of one quad is 8 multiply-adds among some
  // 30 instructions (the feed's tests and prefetch, the loop's), and a Zen 3 core ran them at less
  // than half its FMA rate. The same sums in the same order (Hq = 32, Hkv = 4, d = 128,
  // Nkv = 65536, two threads, calls alternated: 0.83-0.87 of the time for every cache type;
  // docs/performance.md).
  FeedQuads(quads, feed, quad);
  TailColumns(d, tail, packed + quads * 32, 8, krow, 4 * quads, a);  // as in QuadKeys
#pragma GCC unroll 2
  for (size_t v = 0; v < 2; ++v) {  // block h of r: row 2v + h's four scores
    const auto r = QuadSums(d, a[0][v], a[1][v], a[2][v], a[3][v]);
    if (2 * v < nr) hn::StoreU(hn::LowerHalf(dh, r), dh, S + 2 * v * lds);
    if (2 * v + 1 < nr) hn::StoreU(hn::UpperHalf(dh, r), dh, S + (2 * v + 1) * lds);
  }
}

// Blocks of 5-8 rows on 8 lanes, one pass: three keys against the four pairs of rows, 12
// accumulators, where QuadKeys8 keeps 8 (four keys against two pairs) and makes two passes over
// the keys. A step of a quad loads the three keys' quads first, then each pair's packed rows and
// does its three multiply-adds: 3 + 4 loads for 12 (QuadKeys8: 6 for 8), and 3 keys, 12 sums and
// one vector of rows fill the 16 registers. Key x's sums, and their QuadSums, are QuadKeys8's (the
// same chains in the same order: the same bits). A group stores four scores a row, the fourth of
// no use (S's rows need room for it).
// (Zen 3, d = 128, one 64-key tile in L1, calls alternated: 0.82 of QuadKeys8's time for 8 rows,
// 0.83 for 7 rows and d = 37; six keys against two pairs for 4 rows took 1.03-1.06. GQA decode,
// calls alternated, two threads: Hq = 32, Hkv = 4, Nkv = 65536, float32 0.92, bf16 0.95, int8
// 0.96, float16 0.92 of the time; docs/performance.md.)
constexpr size_t kTripleKeys8 = 3;
template <class D>
HWY_INLINE void TripleKeys8(D d, size_t dk, const float* const* krow, const float* packed, float* S, size_t lds,
                            size_t nr, LineFeed& feed) {
  constexpr size_t NK = kTripleKeys8;
  const hn::Half<D> dh;
  const size_t quads = dk / 4, tail = dk % 4;
  hn::Vec<D> a[NK][4];  // key x, rows 2h and 2h + 1 (one a 128-bit block)
#pragma GCC unroll 3
  for (size_t x = 0; x < NK; ++x) a[x][0] = a[x][1] = a[x][2] = a[x][3] = hn::Zero(d);
  const auto quad = [&](size_t u) HWY_ATTR {
    const float* pq = packed + u * 32;
    hn::Vec<D> k[NK];
#pragma GCC unroll 3
    for (size_t x = 0; x < NK; ++x) k[x] = hn::LoadDup128(d, krow[x] + 4 * u);
#pragma GCC unroll 4
    for (size_t h = 0; h < 4; ++h) {
      const auto q = hn::LoadU(d, pq + 8 * h);
#pragma GCC unroll 3
      for (size_t x = 0; x < NK; ++x) a[x][h] = hn::MulAdd(q, k[x], a[x][h]);
    }
  };
  FeedQuads(quads, feed, quad);  // as QuadKeys8
  TailColumns(d, tail, packed + quads * 32, 8, krow, 4 * quads, a);  // the last columns one at a time
  for (size_t h = 0; h < 4; ++h) {  // block i of r: row 2h + i's scores of the three keys
    const auto r = QuadSums(d, a[0][h], a[1][h], a[2][h], hn::Zero(d));
    if (2 * h < nr) hn::StoreU(hn::LowerHalf(dh, r), dh, S + 2 * h * lds);
    if (2 * h + 1 < nr) hn::StoreU(hn::UpperHalf(dh, r), dh, S + (2 * h + 1) * lds);
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr bool kOcts = true;
// The end of OctKeys and PairKeys: in each key's two accumulators, the 8 lanes of a 256-bit half
// belong to one row (rows 0-1, then 2-3). One block shuffle of the two and an add leave row h's
// four partial sums in block h; QuadSums adds them for four keys; row h's scores to S + h·lds.
HWY_INLINE void OctSums(DF d, VF (&a)[kQuadKeys][2], float* S, size_t lds, size_t nr) {
#pragma GCC unroll 2
  for (size_t x = 0; x < kQuadKeys; x += 4) {
    VF s[4];
#pragma GCC unroll 4
    for (size_t i = 0; i < 4; ++i) {  // blocks 0-1 of a half are row 2v + h's; to blocks h
      const __m512 P = a[x + i][0].raw, R = a[x + i][1].raw;
      s[i] = VF{_mm512_add_ps(_mm512_shuffle_f32x4(P, R, 0x88), _mm512_shuffle_f32x4(P, R, 0xDD))};
    }
    StoreBlocks(d, QuadSums(d, s[0], s[1], s[2], s[3]), S + x, lds, nr);  // block h: row h's scores
  }
}
// Groups of up to 4 rows on AVX-512, in the oct layout (kv_kernels.h). QuadKeys with rows 0-3
// alone does one multiply-add per 128-bit broadcast of K, and those issue about once a cycle: in
// L1 (one thread, d = 128, a tile called again and again) it took 8.9 ns a key for 32
// multiply-adds, 4.9 at the FMA peak, the same 8.7-8.9 for 2 or 3 rows. Here a key's 8 columns,
// broadcast to both 256-bit halves, feed two: lane 8h + i of accumulator v sums
// Q[2v + h][8w + i]·K[8w + i] over w. At the end one block shuffle of a key's two accumulators
// and an add leave row h's four lanes in block h, and QuadSums adds them for four keys.
// A key's 8 columns from 8w on as float32 in both 256-bit halves: float32 rows by one broadcast
// load; float16 rows (read in place) by a 128-bit load broadcast to both 128-bit halves of a 256-bit
// vector, then one conversion of its 16 halves.
HWY_INLINE VF Oct(const float* row, size_t w) { return VF{_mm512_broadcast_f32x8(_mm256_loadu_ps(row + 8 * w))}; }
HWY_INLINE VF Oct(const f16* row, size_t w) {
  return VF{_mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 8 * w))))};
}
template <class T>
HWY_INLINE void OctKeys(DF d, size_t dk, const T* const* krow, const float* packed, float* S, size_t lds,
                        size_t nr, LineFeed& feed) {
  const size_t octs = dk / 8, tail = dk % 8;
  VF a[kQuadKeys][2];
#pragma GCC unroll 8
  for (size_t x = 0; x < kQuadKeys; ++x) a[x][0] = a[x][1] = hn::Zero(d);
  for (size_t w = 0; w < octs; ++w) {
    feed.next();
    const VF q0 = hn::LoadU(d, packed + w * 32), q1 = hn::LoadU(d, packed + w * 32 + 16);
    const T* const* rows = krow;  // row pointers read from memory each step (as QuadKeys)
#if defined(__GNUC__)
    asm("" : "+r"(rows));
#endif
#pragma GCC unroll 8
    for (size_t x = 0; x < kQuadKeys; ++x) {
      const VF k = Oct(rows[x], w);
      a[x][0] = hn::MulAdd(q0, k, a[x][0]);
      a[x][1] = hn::MulAdd(q1, k, a[x][1]);
    }
  }
  TailColumns(d, tail, packed + octs * 32, 16, krow, 8 * octs, a);  // the last columns one at a time
  OctSums(d, a, S, lds, nr);
}

// bf16 rows read in place on AVX-512 (no widened copy of the tile), in the pair layouts
// (kv_kernels.h). A key's kCols columns (16: groups of up to 4 rows, 2 rows a vector; 8: blocks of
// up to 8 rows, 4 rows a vector) are broadcast to every block of kCols / 2 words, and 32-bit lane i
// of a block then holds column 2i in its low 16 bits and column 2i + 1 in its high 16 bits, which
// PairLow and PairHigh give as float32 (the even columns, the odd ones): one load and two integer
// operations for four multiply-adds (kHalves = 2), where the widened tile cost a load, a widening
// and a store per 16 values before the scores read them again. Lane i of a row's block sums
//   Q[h][kCols·c + 2i]·K[kCols·c + 2i] + Q[h][kCols·c + 2i + 1]·K[kCols·c + 2i + 1]
// over the chunks c, the even column first; the end is OctKeys' (kCols = 16) or QuadKeys'.
template <size_t kCols>
HWY_INLINE VU PairColumns(const std::uint16_t* from) {
  if constexpr (kCols == 16) return VU{_mm512_broadcast_i32x8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(from)))};
  else return VU{_mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(from)))};
}
template <size_t kCols, size_t kHalves>
HWY_INLINE void PairKeys(DF d, size_t dk, const std::uint16_t* const* krow, const float* packed, float* S,
                         size_t lds, size_t nr, LineFeed& feed) {
  const size_t chunks = dk / kCols, tail = dk % kCols;
  VF a[kQuadKeys][2];
#pragma GCC unroll 8
  for (size_t x = 0; x < kQuadKeys; ++x) a[x][0] = a[x][1] = hn::Zero(d);
  for (size_t c = 0; c < chunks; ++c) {
    feed.next();
    const float* qc = packed + c * 64;
    const VF q0e = hn::LoadU(d, qc), q1e = hn::LoadU(d, qc + 16), q0o = hn::LoadU(d, qc + 32),
             q1o = hn::LoadU(d, qc + 48);
    const std::uint16_t* const* rows = krow;  // row pointers read from memory each step (as QuadKeys)
#if defined(__GNUC__)
    asm("" : "+r"(rows));
#endif
#pragma GCC unroll 8
    for (size_t x = 0; x < kQuadKeys; ++x) {
      const VU raw = PairColumns<kCols>(rows[x] + kCols * c);
      const VF even = PairLow(d, raw), odd = PairHigh(d, raw);
      a[x][0] = hn::MulAdd(q0e, even, a[x][0]);
      if constexpr (kHalves == 2) a[x][1] = hn::MulAdd(q1e, even, a[x][1]);
      a[x][0] = hn::MulAdd(q0o, odd, a[x][0]);
      if constexpr (kHalves == 2) a[x][1] = hn::MulAdd(q1o, odd, a[x][1]);
    }
  }
  TailColumns(d, tail, packed + chunks * 64, 16, krow, kCols * chunks, a);  // the last columns one at a time
  if constexpr (kCols == 16) OctSums(d, a, S, lds, nr);
  else QuadEnd<kHalves>(d, a, S, lds, nr);
}
#else
constexpr bool kOcts = false;
#endif

// One block of packed rows against kQuadCallKeys keys (QuadKeys on 16 lanes, OctKeys for up to
// 4 rows on AVX-512; QuadKeys8 for up to 4 rows on 8), scores into S[r][x]. The calls written out:
// a lambda around them made the GQA decode 8-10% slower (Hq = 32, Hkv = 4, one thread).
template <class D>
constexpr size_t kQuadCallKeys = hn::MaxLanes(D()) == 16 ? kQuadKeys : kQuadKeys8;
template <class D>
HWY_INLINE void QuadCall(D d, size_t dk, const float* const* rows, const float* pk, float* S, size_t lds, size_t nr,
                         bool octs, LineFeed& feed) {
  if constexpr (hn::MaxLanes(D()) == 16) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if (octs) return OctKeys(d, dk, rows, pk, S, lds, nr, feed);
#else
    (void)octs;
#endif
    if (nr > 4) QuadKeys<2>(d, dk, rows, pk, S, lds, nr, feed);
    else QuadKeys<1>(d, dk, rows, pk, S, lds, nr, feed);
  } else {  // up to 4 rows (more take TripleKeys8)
    QuadKeys8(d, dk, rows, pk, S, lds, nr, feed);
  }
}
// float16 rows in place (AVX-512 only, rows_in_place()): OctKeys for groups of up to 4 rows, else
// QuadKeys, each converting a key's columns as it reads them.
template <class D>
HWY_INLINE void QuadCall(D d, size_t dk, const f16* const* rows, const float* pk, float* S, size_t lds, size_t nr,
                         bool octs, LineFeed& feed) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(D()) == 16) {
    if (octs) return OctKeys(d, dk, rows, pk, S, lds, nr, feed);
    if (nr > 4) QuadKeys<2>(d, dk, rows, pk, S, lds, nr, feed);
    else QuadKeys<1>(d, dk, rows, pk, S, lds, nr, feed);
  }
#else
  (void)d, (void)dk, (void)rows, (void)pk, (void)S, (void)lds, (void)nr, (void)octs, (void)feed;
#endif
}
// bf16 rows in place (AVX-512 only, rows_in_place()): PairKeys by 16 columns for groups of up to 4
// rows, else by 8.
template <class D>
HWY_INLINE void QuadCall(D d, size_t dk, const std::uint16_t* const* rows, const float* pk, float* S, size_t lds,
                         size_t nr, bool octs, LineFeed& feed) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(D()) == 16) {
    if (octs) return PairKeys<16, 2>(d, dk, rows, pk, S, lds, nr, feed);
    if (nr > 4) PairKeys<8, 2>(d, dk, rows, pk, S, lds, nr, feed);
    else PairKeys<8, 1>(d, dk, rows, pk, S, lds, nr, feed);
  }
#else
  (void)d, (void)dk, (void)rows, (void)pk, (void)S, (void)lds, (void)nr, (void)octs, (void)feed;
#endif
}

// Keys j < nk of one block of nr rows (at most 8) in groups of NK: call(rows, S + j, lds) scores a
// group's keys, rows[x] the row of key j + x as a T*, W >= NK columns a row stored (a kernel that
// stores whole vectors: TripleKeys8's 4 for 3 keys), while S's rows have room for them; the last
// keys, the group filled up with the last key, into a scratch tile. The call is inlined: as an
// outlined lambda it took the kernels out of ScoresQuads with it (GQA decode 8-10% slower).
template <class T, size_t NK, size_t W, class Call>
HWY_INLINE void KeyGroups(size_t nk, size_t nr, const void* const* krow, float* S, size_t lds, Call&& call) {
  const T* rows_x[NK];
  size_t j = 0;
  for (; j + NK <= nk && j + W <= lds; j += NK) {
    for (size_t x = 0; x < NK; ++x) rows_x[x] = static_cast<const T*>(krow[j + x]);
    call(rows_x, S + j, lds);
  }
  if (j < nk) {  // at most NK keys left (lds >= nk)
    HWY_ALIGN float part[8 * W];
    for (size_t x = 0; x < NK; ++x) rows_x[x] = static_cast<const T*>(krow[j + x < nk ? j + x : nk - 1]);
    call(rows_x, part, W);
    for (size_t r = 0; r < nr; ++r)
      for (size_t x = 0; x < nk - j; ++x) S[r * lds + j + x] = part[r * W + x];
  }
}

// Keys j < nk of one block of nr packed rows (from pk), rows of element type T, kQuadCallKeys at a
// time (QuadCall).
template <class T, class D>
HWY_INLINE void QuadKeyGroups(D d, size_t nk, size_t nr, size_t dk, const void* const* krow, const float* pk,
                              float* S, size_t lds, bool octs, LineFeed& feed) {
  constexpr size_t kKeys = kQuadCallKeys<D>;
  KeyGroups<T, kKeys, kKeys>(nk, nr, krow, S, lds,
                             [&](const T* const* rows, float* s, size_t ld) HWY_ATTR __attribute__((always_inline)) {
                               QuadCall(d, dk, rows, pk, s, ld, nr, octs, feed);
                             });
}

// Keys j < nk of one block of 5-8 packed rows against float32 rows (as they are, or widened),
// three at a time (TripleKeys8).
template <class D>
HWY_INLINE void TripleKeyGroups(D d, size_t nk, size_t nr, size_t dk, const void* const* krow, const float* pk,
                                float* S, size_t lds, LineFeed& feed) {
  KeyGroups<float, kTripleKeys8, 4>(nk, nr, krow, S, lds,
                                    [&](const float* const* rows, float* s, size_t ld)
                                        HWY_ATTR __attribute__((always_inline)) {
                                          TripleKeys8(d, dk, rows, pk, s, ld, nr, feed);
                                        });
}

// The scores of 8-lane targets (AVX2) over keys j < nk: each block of 8 rows takes the keys by
// groups of its kernel's (TripleKeys8's 3 for 5-8 rows, QuadKeys8's 4 for up to 4), a chunk of
// keys at a time: one group where the rows make one block, else 12 keys (groups of 3 and of 4
// alike), which every block takes before the next chunk, so that a chunk's rows (6 KiB at
// d = 128) are read from L1 by all blocks (MQA's 32 rows: four blocks, each of which widened the
// tile's K again). Float32 rows read where they lie keep a pass over the tile a block
// (ScoresQuadsT): chunked, MQA 32/1 took 1.03-1.06 of the time in cache (docs/performance.md).
// rows_of(j0, nx) gives the float32 rows of keys j0 + x, x < nx (the last key again past nk; nx
// covers the chunk's groups). The feed is paced over every call's steps. Each key's sums are its
// kernel's, whatever the chunk: the same bits.
template <class RowsOf>
HWY_INLINE void KeyChunks8(size_t nk, size_t rows, size_t dk, const float* packed, float* S, size_t lds,
                           LineFeed& feed, RowsOf&& rows_of) {
  const DF d;
  constexpr size_t W = 4;  // scores a kernel stores a row (TripleKeys8's fourth of no use)
  const size_t block = quads_block(dk);
  const size_t chunk = rows > 8 ? kWideningKeys : rows > 4 ? kTripleKeys8 : kQuadKeys8;
  const size_t steps8 = dk / 4 / kQuadSteps8 + dk / 4 % kQuadSteps8;  // of the kernels' inner loop
  size_t calls = 0;
  for (size_t r0 = 0; r0 < rows; r0 += 8) {
    const size_t nkb = rows - r0 > 4 ? kTripleKeys8 : kQuadKeys8;
    calls += (nk + nkb - 1) / nkb;
  }
  feed.pace(static_cast<std::int64_t>(calls * steps8));
  LineFeed local = feed;  // in registers while the keys stream
  for (size_t j0 = 0; j0 < nk; j0 += chunk) {
    // Past the chunk's last key, the 3 rows at most that its last group of 3 or 4 reads.
    const float* const* rows_x = rows_of(j0, nk - j0 + 3 < chunk ? nk - j0 + 3 : chunk);
    for (size_t r0 = 0; r0 < rows; r0 += 8) {
      const size_t nr = rows - r0 < 8 ? rows - r0 : 8;
      const size_t nkb = nr > 4 ? kTripleKeys8 : kQuadKeys8;
      const float* pk = packed + r0 / 8 * block;
      float* Sr = S + r0 * lds;
      const auto call = [&](const float* const* rws, float* sp, size_t ld) HWY_ATTR __attribute__((always_inline)) {
        if (nr > 4) TripleKeys8(d, dk, rws, pk, sp, ld, nr, local);
        else QuadKeys8(d, dk, rws, pk, sp, ld, nr, local);
      };
      for (size_t g = 0; g < chunk && j0 + g < nk; g += nkb) {
        const size_t j = j0 + g;
        if (j + nkb <= nk && j + W <= lds) {
          call(rows_x + g, Sr + j, lds);
        } else {  // the last keys (lds >= nk)
          HWY_ALIGN float part[8 * W];
          call(rows_x + g, part, W);
          const size_t n = nk - j < nkb ? nk - j : nkb;
          for (size_t r = 0; r < nr; ++r)
            for (size_t x = 0; x < n; ++x) Sr[r * lds + j + x] = part[r * W + x];
        }
      }
    }
  }
  feed = local;
}

// bf16, float16 and int8 K rows on 8-lane targets (AVX2), which do not read them in place
// (scores_quads_widening, kv_kernels.h): KeyChunks8 on the chunk's keys widened (LoadRow's values)
// into buf, rows of dk floats from a line's start, just before the products read them. A chunk's
// rows (6 KiB at d = 128, 24 KiB at d = 512) stay in L1 from their stores to their loads; a whole
// tile widened first (32 KiB of float32 at d = 128, all of Zen 3's L1) missed L1 with its stores
// and was read back from L2. The products and their order are those of the widened tile.
template <int kType>
HWY_INLINE void WidenedKeyChunks(size_t nk, size_t rows, size_t dk, const void* const* krow, const float* const* ksc,
                                 const float* packed, float* buf, float* S, size_t lds, LineFeed& feed) {
  const DF d;
  const size_t L = hn::Lanes(d), full = dk / L * L, ldb = widening_row(dk);
  buf += (16 - reinterpret_cast<std::uintptr_t>(buf) / sizeof(float) % 16) % 16;  // to a line's start
  const float* rows_x[kWideningKeys];
  for (size_t x = 0; x < kWideningKeys; ++x) rows_x[x] = buf + x * ldb;
  KeyChunks8(nk, rows, dk, packed, S, lds, feed, [&](size_t j0, size_t nx) HWY_ATTR __attribute__((always_inline)) {
    for (size_t x = 0; x < nx; ++x) {
      const size_t j = j0 + x < nk ? j0 + x : nk - 1;
      const void* row = krow[j];
      const float* sc = ksc ? ksc[j] : nullptr;
      float* out = buf + x * ldb;
      if constexpr (kType == kI8) {  // dk % 32 == 0: a block's scale broadcast once (LoadRow's product)
        for (size_t c = 0; c < dk; c += 32) {
          const VF s = hn::Set(d, sc[c / 32]);
#pragma GCC unroll 4
          for (size_t e = c; e < c + 32; e += L) hn::Store(hn::Mul(LoadRaw<kI8>(d, row, e), s), d, out + e);
        }
      } else {
        size_t c = 0;
        for (; c + 4 * L <= full; c += 4 * L) {
#pragma GCC unroll 4
          for (size_t e = c; e < c + 4 * L; e += L) hn::Store(LoadRow<kType>(d, row, sc, e), d, out + e);
        }
        for (; c < full; c += L) hn::Store(LoadRow<kType>(d, row, sc, c), d, out + c);
        for (c = full; c < dk; ++c) out[c] = Element<kType>(row, sc, c);
      }
    }
    return static_cast<const float* const*>(rows_x);
  });
}
template <class D>  // D = DF; a template so that only 16- and 8-lane targets compile the body
HWY_INLINE void ScoresQuadsT(D d, size_t nk, size_t rows, size_t dk, const void* const* krow, const float* packed,
                             float* S, size_t lds, LineFeed& shared, QuadRows form) {
  if constexpr (hn::MaxLanes(D()) == 16 || hn::MaxLanes(D()) == 8) {
    constexpr size_t kKeys = kQuadCallKeys<D>;
    const size_t block = quads_block(dk);
    LineFeed feed = shared;  // in registers while the keys stream
    // Up to 4 rows on AVX-512, widened rows (in L1) and float32 rows in cache (f32_near):
    // OctKeys, its layout after the quad block (QuadCall). Float32 rows read from DRAM were 3-4%
    // slower that way (Hq = 32, Hkv = 8 and Hq = 8, Hkv = 2, d = 128, two threads, calls
    // alternated in one process; docs/performance.md), so they keep the quads (QuadRows::f32).
    // bf16 rows in place (the caller checked rows_in_place()): PairKeys, by 16 columns on the pair
    // layout there, or by 8 on the pair layout of blocks of 8 rows;
    // float16 rows in place: OctKeys, converting each key's 8 columns as it reads them.
    const bool pairs = form == QuadRows::bf16, halves = form == QuadRows::f16;
    const bool octs = kOcts && hn::MaxLanes(D()) == 16 && rows <= 4 && form != QuadRows::f32;
    for (size_t r0 = 0; r0 < rows; r0 += 8) {
      const size_t nr = rows - r0 < 8 ? rows - r0 : 8;
      const size_t steps8 = dk / 4 / kQuadSteps8 + dk / 4 % kQuadSteps8;  // of QuadKeys8's inner loop
      if constexpr (hn::MaxLanes(D()) == 8) {
        if (nr > 4) {  // float32 rows on 8 lanes (no bf16 or float16 rows in place there)
          feed.pace(static_cast<std::int64_t>((nk + kTripleKeys8 - 1) / kTripleKeys8 * steps8));
          TripleKeyGroups(d, nk, nr, dk, krow, packed + r0 / 8 * block, S + r0 * lds, lds, feed);
          continue;
        }
      }
      const size_t steps = hn::MaxLanes(D()) == 8 ? steps8                                       // of the kernel's
                           : pairs ? (octs ? dk / 16 + dk % 16 : dk / 8 + dk % 8)                  // inner loop
                           : octs  ? (dk + 7) / 8
                                   : (dk + 3) / 4;
      feed.pace(static_cast<std::int64_t>((nk + kKeys - 1) / kKeys * steps));
      const float* pk = octs ? packed + block : packed + r0 / 8 * block;
      if (pairs) QuadKeyGroups<std::uint16_t>(d, nk, nr, dk, krow, pk, S + r0 * lds, lds, octs, feed);
      else if (halves) QuadKeyGroups<f16>(d, nk, nr, dk, krow, pk, S + r0 * lds, lds, octs, feed);
      else QuadKeyGroups<float>(d, nk, nr, dk, krow, pk, S + r0 * lds, lds, octs, feed);
    }
    shared = feed;
  } else {
    (void)d, (void)nk, (void)rows, (void)dk, (void)krow, (void)packed, (void)S, (void)lds, (void)shared, (void)form;
  }
}

// ScoresQuadsT's 8-lane paths (TripleKeys8 for 5-8 rows, QuadKeys8 for up to 4), the feed paced
// alike, on rows widened a chunk of keys at a time.
template <int kType>
HWY_NOINLINE void ScoresWidening8(size_t nk, size_t rows, size_t dk, const void* const* krow, const float* const* ksc,
                                  const float* packed, float* S, size_t lds, LineFeed& feed, float* buf) {
  if constexpr (hn::MaxLanes(DF()) == 8) {
    WidenedKeyChunks<kType>(nk, rows, dk, krow, ksc, packed, buf, S, lds, feed);
  } else {
    (void)nk, (void)rows, (void)dk, (void)krow, (void)ksc, (void)packed, (void)S, (void)lds, (void)feed, (void)buf;
  }
}
#endif

void ScoresQuads(size_t nk, size_t rows, size_t dk, const void* const* krow, const float* packed, float* S,
                 size_t lds, LineFeed& feed, QuadRows form) {
#if HWY_TARGET != HWY_SCALAR
  ScoresQuadsT(DF(), nk, rows, dk, krow, packed, S, lds, feed, form);
#else
  (void)nk, (void)rows, (void)dk, (void)krow, (void)packed, (void)S, (void)lds, (void)feed, (void)form;  // never called: 1 lane
#endif
}
bool QuadsAvailable() {
  return (hn::MaxLanes(DF()) == 16 || hn::MaxLanes(DF()) == 8) && hn::Lanes(DF()) == hn::MaxLanes(DF());
}
size_t AccumulateRowBlock() { return kAccumulateRows; }
bool ValuesInPanels() { return HWY_TARGET == HWY_AVX2; }  // AccumulatePanels
bool RowsInPlace() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return hn::MaxLanes(DF()) == 16 && hn::Lanes(DF()) == 16;
#else
  return false;
#endif
}

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

void StreamRowStrided(int type, size_t nk, size_t dk, size_t dv, const void* k, std::ptrdiff_t k_stride,
                      const float* ksc, std::ptrdiff_t ksc_stride, const void* v, std::ptrdiff_t v_stride,
                      const float* vsc, std::ptrdiff_t vsc_stride, const float* Q, float* m, float* l, float* O,
                      size_t ahead, const RowTransform* tf) {
  const StridedRows kr{static_cast<const char*>(k), k_stride}, vr{static_cast<const char*>(v), v_stride};
  const StridedScales ks(ksc, ksc_stride), vs(vsc, vsc_stride);
  WithType(type, [&](auto t) {
    StreamRowDispatch<decltype(t)::value>(nk, dk, dv, kr, ks, vr, vs, Q, m, l, O, ahead, tf);
  });
}

void StreamHeads(int type, size_t nk, size_t heads, size_t dk, size_t dv, const HeadRows& k, const HeadRows& v,
                 const HeadRow* rows, size_t ahead, size_t known, float* work) {
#if HWY_TARGET != HWY_SCALAR
  WithType(type, [&](auto t) {
    StreamHeadsDispatch<decltype(t)::value>(nk, heads, dk, dv, k, v, rows, ahead, known, work);
  });
#else
  // The scalar target's stream is key by key (StreamRowT): head by head, the same sums.
  (void)work, (void)ahead, (void)known;
  struct Of {  // head h's rows (or int8 scales) of each key
    const HeadRows* R;
    size_t h;
    const void* operator[](size_t j) const {
      return static_cast<const char*>(R->row[j]) + static_cast<std::ptrdiff_t>(h) * R->head;
    }
  };
  struct ScalesOf {
    const HeadRows* R;
    size_t h;
    const float* operator[](size_t j) const { return R->scales[j] + static_cast<std::ptrdiff_t>(h) * R->scales_head; }
    explicit operator bool() const { return R != nullptr; }
  };
  for (size_t h = 0; h < heads; ++h) {
    const ScalesOf ks{type == kI8 ? &k : nullptr, h}, vs{type == kI8 ? &v : nullptr, h};
    WithType(type, [&](auto t) {
      StreamRowT<decltype(t)::value>(nk, dk, dv, Of{&k, h}, ks, Of{&v, h}, vs, rows[h].q, rows[h].m, rows[h].l,
                                     rows[h].o, rows[h].tf);
    });
  }
#endif
}

void Scores(int type, size_t nk, size_t rows, size_t dk, const void* const* krow, const float* const* ksc,
            const float* Q, size_t ldq, float* S, size_t lds) {
  WithType(type, [&](auto t) { ScoresT<decltype(t)::value>(nk, rows, dk, krow, ksc, Q, ldq, S, lds); });
}

// widen (kv_kernels.h): each row as float32, L lanes at a time (LoadRow), the tail element by element.
template <int kType>
void WidenT(size_t nk, size_t d, const void* const* row, const float* const* sc, float* out, size_t ldo) {
  const DF df;
  const size_t L = hn::Lanes(df), full = d / L * L;
  for (size_t j = 0; j < nk; ++j) {
    const float* s = sc ? sc[j] : nullptr;
    for (size_t c = 0; c < full; c += L) hn::StoreU(LoadRow<kType>(df, row[j], s, c), df, out + j * ldo + c);
    for (size_t c = full; c < d; ++c) out[j * ldo + c] = Element<kType>(row[j], s, c);
  }
}
void Widen(int type, size_t nk, size_t d, const void* const* row, const float* const* sc, float* out, size_t ldo) {
  WithType(type, [&](auto t) { WidenT<decltype(t)::value>(nk, d, row, sc, out, ldo); });
}
void ScoresWidening(int type, size_t nk, size_t rows, size_t dk, const void* const* krow, const float* const* ksc,
                    const float* packed, float* S, size_t lds, LineFeed& feed, float* buf) {
#if HWY_TARGET != HWY_SCALAR
  WithType(type, [&](auto t) { ScoresWidening8<decltype(t)::value>(nk, rows, dk, krow, ksc, packed, S, lds, feed, buf); });
#else
  (void)type, (void)nk, (void)rows, (void)dk, (void)krow, (void)ksc, (void)packed, (void)S, (void)lds, (void)feed, (void)buf;
#endif
}

void Accumulate(int type, size_t nk, size_t rows, size_t dv, const void* const* vrow, const float* const* vsc,
                const float* P, const float* alpha, float* O, size_t ldo, LineFeed& feed) {
  WithType(type, [&](auto t) { AccumulateT<decltype(t)::value>(nk, rows, dv, vrow, vsc, P, alpha, O, ldo, feed); });
}

}  // namespace attnscale::detail::kv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnscale::detail::kv {
HWY_EXPORT(Scores);
HWY_EXPORT(Accumulate);
HWY_EXPORT(StreamRowStrided);
HWY_EXPORT(StreamHeads);
HWY_EXPORT(ScoresQuads);
HWY_EXPORT(Widen);
HWY_EXPORT(ScoresWidening);
HWY_EXPORT(ValuesInPanels);
HWY_EXPORT(QuadsAvailable);
HWY_EXPORT(RowsInPlace);
HWY_EXPORT(AccumulateRowBlock);

void widen(int type, std::size_t nk, std::size_t d, const void* const* row, const float* const* sc, float* out,
           std::size_t ldo) {
  HWY_DYNAMIC_DISPATCH(Widen)(type, nk, d, row, sc, out, ldo);
}
void scores_quads_widening(int type, std::size_t nk, std::size_t rows, std::size_t dk, const void* const* krow,
                           const float* const* ksc, const float* packed, float* S, std::size_t lds, LineFeed& feed,
                           float* buf) {
  HWY_DYNAMIC_DISPATCH(ScoresWidening)(type, nk, rows, dk, krow, ksc, packed, S, lds, feed, buf);
}
bool values_in_panels() { return HWY_DYNAMIC_DISPATCH(ValuesInPanels)(); }
bool quads_available() { return HWY_DYNAMIC_DISPATCH(QuadsAvailable)(); }
bool rows_in_place() { return HWY_DYNAMIC_DISPATCH(RowsInPlace)(); }
std::size_t widened_keys() { return rows_in_place() ? 16 : kTileKeys; }
std::size_t accumulate_row_block() { return HWY_DYNAMIC_DISPATCH(AccumulateRowBlock)(); }
namespace {
// One row's values qr[0, dk) into slots of 32 floats from dst, kLanes lanes of each: runs of
// kLanes columns a slot (kSplit: runs of 2·kLanes columns, their even ones a slot and their odd
// ones the next), then each last column alone in a slot of its own, at lane c % kLanes. The four
// layouts of pack_quads: quads (4 lanes), octs (8), pairs by 8 columns (4 lanes, split), by 16 (8,
// split). The lane counts are constants: a loop over a run-time count made short bf16 decode
// (its pairs) 5-10% slower.
template <std::size_t kLanes, bool kSplit>
void place_row(const float* qr, std::size_t dk, float* dst) {
  constexpr std::size_t run = kSplit ? 2 * kLanes : kLanes;
  const std::size_t full = dk / run * run;
  for (std::size_t w = 0; w < full / run; ++w, dst += kSplit ? 64 : 32, qr += run) {
    if constexpr (kSplit) {
      for (std::size_t i = 0; i < kLanes; ++i) {
        dst[i] = qr[2 * i];
        dst[32 + i] = qr[2 * i + 1];
      }
    } else {
      std::memcpy(dst, qr, kLanes * sizeof(float));
    }
  }
  for (std::size_t c = full; c < dk; ++c, dst += 32) dst[c % kLanes] = qr[c - full];
}
template <std::size_t kLanes>
void place_row(const float* qr, std::size_t dk, bool split, float* dst) {
  if (split) place_row<kLanes, true>(qr, dk, dst);
  else place_row<kLanes, false>(qr, dk, dst);
}
}  // namespace

void pack_quads(std::size_t rows, std::size_t dk, const float* Q, std::size_t ldq, float* packed, bool pairs) {
  const std::size_t block = quads_block(dk);
  std::memset(packed, 0, quads_size(rows, dk) * sizeof(float));
  for (std::size_t r = 0; r < rows; ++r) {
    const float* const qr = Q + r * ldq;
    // Row r's four lanes of its block of 8 rows: quads, or pairs by 8 columns.
    place_row<4>(qr, dk, pairs, packed + r / 8 * block + (r % 8) / 4 * 16 + 4 * (r % 4));
    // Up to 4 rows: also eight lanes of each slot after the block, octs or pairs by 16 columns.
    if (rows <= 4) place_row<8>(qr, dk, pairs, packed + block + 8 * r);
  }
}
void scores_quads(std::size_t nk, std::size_t rows, std::size_t dk, const void* const* krow, const float* packed,
                  float* S, std::size_t lds, LineFeed& feed, QuadRows form) {
  HWY_DYNAMIC_DISPATCH(ScoresQuads)(nk, rows, dk, krow, packed, S, lds, feed, form);
}

void scores(int type, std::size_t nk, std::size_t rows, std::size_t dk, const void* const* krow,
            const float* const* ksc, const float* Q, std::size_t ldq, float* S, std::size_t lds) {
  HWY_DYNAMIC_DISPATCH(Scores)(type, nk, rows, dk, krow, ksc, Q, ldq, S, lds);
}
void accumulate(int type, std::size_t nk, std::size_t rows, std::size_t dv, const void* const* vrow,
                const float* const* vsc, const float* P, const float* alpha, float* O, std::size_t ldo,
                LineFeed& feed) {
  HWY_DYNAMIC_DISPATCH(Accumulate)(type, nk, rows, dv, vrow, vsc, P, alpha, O, ldo, feed);
}
void stream_row_strided(int type, std::size_t nk, std::size_t dk, std::size_t dv, const void* k,
                        std::ptrdiff_t k_stride, const float* ksc, std::ptrdiff_t ksc_stride, const void* v,
                        std::ptrdiff_t v_stride, const float* vsc, std::ptrdiff_t vsc_stride, const float* Q, float* m,
                        float* l, float* O, std::size_t ahead, const RowTransform* tf) {
  HWY_DYNAMIC_DISPATCH(StreamRowStrided)
  (type, nk, dk, dv, k, k_stride, ksc, ksc_stride, v, v_stride, vsc, vsc_stride, Q, m, l, O, ahead, tf);
}
void stream_heads(int type, std::size_t nk, std::size_t heads, std::size_t dk, std::size_t dv, const HeadRows& k,
                  const HeadRows& v, const HeadRow* rows, std::size_t ahead, std::size_t known, float* work) {
  HWY_DYNAMIC_DISPATCH(StreamHeads)(type, nk, heads, dk, dv, k, v, rows, ahead, known, work);
}
}  // namespace attnscale::detail::kv
#endif  // HWY_ONCE
