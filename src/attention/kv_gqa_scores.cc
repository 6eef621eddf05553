// scores_quads and pack_quads (kv_kernels.h): a GQA group's scores against key rows read where
// they lie (float32; bfloat16 and float16 in place on AVX-512), the group's query rows packed once
// a chunk in the quad, oct or pair layout, a few keys at a time against a block of rows
// (kv_quad_keys-inl.h). Compiled once per Highway target like kernels.cc.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kv_gqa_scores.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention/kv_kernels.h"
#include "attention/kv_quad_keys-inl.h"
#include "attention/kv_rows-inl.h"
#include "attnscale/tensor.h"
#include "common/prefetch.h"

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::kv::HWY_NAMESPACE {

#if HWY_TARGET != HWY_SCALAR
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
bool RowsInPlace() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return hn::MaxLanes(DF()) == 16 && hn::Lanes(DF()) == 16;
#else
  return false;
#endif
}

}  // namespace attnscale::detail::kv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnscale::detail::kv {
HWY_EXPORT(ScoresQuads);
HWY_EXPORT(QuadsAvailable);
HWY_EXPORT(RowsInPlace);

bool quads_available() { return HWY_DYNAMIC_DISPATCH(QuadsAvailable)(); }
bool rows_in_place() { return HWY_DYNAMIC_DISPATCH(RowsInPlace)(); }
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
}  // namespace attnscale::detail::kv
#endif  // HWY_ONCE
