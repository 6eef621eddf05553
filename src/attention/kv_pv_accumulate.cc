// accumulate (kv_kernels.h): a tile's P·V update O = alpha·O + P·V for a group's query rows, the V
// rows by pointer (float32, bfloat16, float16 or int8), each V vector read and widened once for a
// block of rows; on AVX2 a column block of the tile widened once into a panel in L1 for groups of
// more rows. Compiled once per Highway target like kernels.cc.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kv_pv_accumulate.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

#include "attention/kv_kernels.h"
#include "attention/kv_rows-inl.h"
#include "common/prefetch.h"

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::kv::HWY_NAMESPACE {

#if HWY_TARGET == HWY_AVX2
// AVX2 with four rows also takes blocks of 3 vectors: 12 accumulators, the key's 3 V vectors and
// one broadcast of P fill its 16 registers. A key's 4 broadcasts of P and its step of the feed
// then serve 12 multiply-adds instead of 8. (Zen 3, GQA 32/4, d = 128, calls alternated, load
// 0.8-1.0: time 0.93-0.97 of 4 x 2's with K/V in cache, Nkv = 2048; 0.95-1.02 from DRAM,
// Nkv = 65536, where the reads dominate. Eight chains alone do reach the FMA rate there.)
constexpr size_t kThreeVectorRows = 4;
#else
constexpr size_t kThreeVectorRows = 0;  // no blocks of 3 vectors
#endif

// Whether nr rows take a block of 3 vectors with `vectors` full vectors left: while 3 or more are
// left, but 4 go as 2 + 2 (3 + 1 would leave a pass of one vector, half the sums of the others).
constexpr bool TakeThree(size_t nr, size_t vectors) {
  return nr == kThreeVectorRows && vectors >= 3 && vectors != 4;
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

// O[r] = alpha[r]·O[r] + Σ_j P[r][j]·V_j for NR rows (row stride ldo). The output columns go in
// blocks of CB vectors whose NR x CB accumulators stay in registers while all nk keys stream
// through (one load and widening of each V vector for all rows).
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

size_t AccumulateRowBlock() { return kAccumulateRows; }
bool ValuesInPanels() { return HWY_TARGET == HWY_AVX2; }  // AccumulatePanels

void Accumulate(int type, size_t nk, size_t rows, size_t dv, const void* const* vrow, const float* const* vsc,
                const float* P, const float* alpha, float* O, size_t ldo, LineFeed& feed) {
  WithType(type, [&](auto t) { AccumulateT<decltype(t)::value>(nk, rows, dv, vrow, vsc, P, alpha, O, ldo, feed); });
}

}  // namespace attnscale::detail::kv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnscale::detail::kv {
HWY_EXPORT(Accumulate);
HWY_EXPORT(ValuesInPanels);
HWY_EXPORT(AccumulateRowBlock);

bool values_in_panels() { return HWY_DYNAMIC_DISPATCH(ValuesInPanels)(); }
std::size_t accumulate_row_block() { return HWY_DYNAMIC_DISPATCH(AccumulateRowBlock)(); }
void accumulate(int type, std::size_t nk, std::size_t rows, std::size_t dv, const void* const* vrow,
                const float* const* vsc, const float* P, const float* alpha, float* O, std::size_t ldo,
                LineFeed& feed) {
  HWY_DYNAMIC_DISPATCH(Accumulate)(type, nk, rows, dv, vrow, vsc, P, alpha, O, ldo, feed);
}
}  // namespace attnscale::detail::kv
#endif  // HWY_ONCE
