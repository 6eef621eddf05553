// Per-target GQA score kernels over a group's packed query rows (pack_quads, kv_kernels.h): a few
// keys against a block of 8 rows (or of up to 4) from one read of each key row, in the quad, oct and
// pair layouts (QuadKeys, OctKeys, PairKeys on 16 lanes; QuadKeys8, TripleKeys8 on 8), and the
// 8-lane key chunks (KeyChunks8). Used by kv_gqa_scores.cc (rows read where they lie) and
// kv_key_widening.cc (rows widened a chunk at a time); 16- and 8-lane targets only.
#if defined(ATTNSCALE_ATTENTION_KV_QUAD_KEYS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNSCALE_ATTENTION_KV_QUAD_KEYS_INL_H_
#undef ATTNSCALE_ATTENTION_KV_QUAD_KEYS_INL_H_
#else
#define ATTNSCALE_ATTENTION_KV_QUAD_KEYS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention/kv_kernels.h"
#include "attention/kv_rows-inl.h"
#include "attnscale/tensor.h"
#include "common/prefetch.h"

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::kv::HWY_NAMESPACE {
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
#endif

}  // namespace attnscale::detail::kv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
