// Cache-decode tile kernels (kv_tile_scores.cc, kv_pv_accumulate.cc, kv_stream_row.cc,
// kv_stream_heads.cc, kv_gqa_scores.cc, kv_key_widening.cc; shared per-target pieces in kv_rows-inl.h,
// kv_row_stream-inl.h, kv_quad_keys-inl.h), dispatched at run time to the best SIMD target
// (see kernels.h for the target control they share). Key and value rows are given by pointer,
// one per key; an int8 row has one float32 scale per 32 values (ksc[j], vsc[j]; null otherwise).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/prefetch.h"

namespace attnscale::detail::kv {

enum ElementType : int { kF32 = 0, kBF16 = 1, kI8 = 2, kF16 = 3 };

// S[r][j] = Σ_c Q[r][c] · K_j[c] for rows r < rows (Q row stride ldq) and keys j < nk.
void scores(int type, std::size_t nk, std::size_t rows, std::size_t dk, const void* const* krow,
            const float* const* ksc, const float* Q, std::size_t ldq, float* S, std::size_t lds);

// GQA scores over float32 keys without lane sums, for 16- and 8-lane targets (quads_available()):
// the group's query rows packed once per chunk (pack_quads), per block of 8 rows and quad of
// columns u 32 floats, lane 4h + i = Q[h][4u + i] (rows 0-3, then 4-7: two vectors of 16 lanes or
// four of 8); a key's quad (K[4u], .., K[4u + 3]) is broadcast to every 128-bit block, one
// multiply-add per vector; the dk % 4 last columns c go one at a time, K[c] broadcast against
// vectors holding Q[h][c] in lanes 4h + c % 4 only. The four lanes of each row are added at the end:
//   S[r][j] = Σ_u (Q[r][4u]·K_j[4u] + Q[r][4u+2]·K_j[4u+2]) + (Q[r][4u+1]·K_j[4u+1] + Q[r][4u+3]·K_j[4u+3]),
// each of the four sums over u one chain in column order.
bool quads_available();
// Groups of up to 4 rows are also packed in the "oct" layout, after their quad block, which
// AVX-512 targets use for widened rows and float32 rows in cache (QuadRows::widened, f32_near):
// per 8 columns w 32 floats, lane 8h + i = Q[h][8w + i] (rows 0-3); the dk % 8 last columns c
// one at a time, Q[h][c] in lanes 8h + c % 8. There a key's 8 columns, broadcast to both halves
// of a vector, feed two multiply-adds (rows 0-1 and 2-3) where a quad feeds one, and each row's 8
// lanes (8 chains in column order) are added at the end: lane i with lane 4 + i, then the four as
// the quad layout adds its lanes.
// For bf16 rows read in place (QuadRows::bf16, where rows_in_place()) they take the "pair" layout
// there instead: per 16 columns w two slots of 32 floats, lane 8h + i = Q[h][16w + 2i] in the first
// and Q[h][16w + 2i + 1] in the second (a bf16 row's 32-bit lane i holds its columns 2i and 2i + 1);
// the dk % 16 last columns one at a time, Q[h][c] in lanes 8h + c % 8. Each row's 8 lanes sum as
// the oct layout's, each lane over the chunks, the even column before the odd one.
// Blocks of 8 rows of bf16 rows read in place take the pair layout of blocks of 8 rows: per 8
// columns c two slots of 32 floats, lane 4h + i = Q[h][8c + 2i] in the first and Q[h][8c + 2i + 1]
// in the second (rows 0-3, then 4-7); the dk % 8 last columns one at a time, Q[h][c] in lanes
// 4h + c % 4.
// Floats of one block of 8 packed rows: dk / 4 quads and dk % 4 last columns, 32 floats each (or the
// pair layout's 2·(dk / 8) + dk % 8 slots, where that is more).
inline std::size_t quads_block(std::size_t dk) {
  const std::size_t quads = dk / 4 + dk % 4, pairs = dk / 8 * 2 + dk % 8;
  return (quads > pairs ? quads : pairs) * 32;
}
// Floats of the oct layout: dk / 8 octs and dk % 8 last columns, 32 floats each.
inline std::size_t octs_block(std::size_t dk) { return (dk / 8 + dk % 8) * 32; }
// Floats of the pair layout: two slots per 16 columns and dk % 16 last columns, 32 floats each.
inline std::size_t pairs_block(std::size_t dk) { return (dk / 16 * 2 + dk % 16) * 32; }
// Floats of the packed rows: ceil(rows / 8) blocks, and the oct or pair layout for up to 4 rows.
inline std::size_t quads_size(std::size_t rows, std::size_t dk) {
  const std::size_t small = octs_block(dk) > pairs_block(dk) ? octs_block(dk) : pairs_block(dk);
  return (rows + 7) / 8 * quads_block(dk) + (rows <= 4 ? small : 0);
}
// pairs: the pair layouts (bf16 rows in place) rather than the quad and oct layouts.
void pack_quads(std::size_t rows, std::size_t dk, const float* Q, std::size_t ldq, float* packed, bool pairs = false);
// Whether the target reads bf16 and float16 rows in place (AVX-512).
bool rows_in_place();
// How scores_quads reads its key rows: float32 rows as they are, streamed from memory (the quad
// layout); float32 rows as they are, in cache (the oct layout for up to 4 rows on AVX-512); a
// float32 tile the caller widened from bf16, float16 or int8 rows (in L1; as f32_near); bf16 rows
// in place (rows_in_place(), the pair layouts); float16 rows in place (the quad and oct layouts).
enum class QuadRows : int { f32, f32_near, widened, bf16, f16 };
// S[r][j] for rows r < rows and keys j < nk, as scores() with float32 rows (other rows widened
// first, widen(), as kv_decode.cc does, but bf16 and float16 rows where rows_in_place()).
// feed (here and in accumulate): rows of a later tile to prefetch a few lines per step of the
// inner loop (LineFeed, common/prefetch.h); the kernel advances it.
void scores_quads(std::size_t nk, std::size_t rows, std::size_t dk, const void* const* krow, const float* packed,
                  float* S, std::size_t lds, LineFeed& feed, QuadRows form = QuadRows::f32);

// Rows j < nk as float32 (bf16 widened, int8 times its block scales) into out[j·ldo + c], c < d.
void widen(int type, std::size_t nk, std::size_t d, const void* const* row, const float* const* sc, float* out,
           std::size_t ldo);
// scores_quads over bf16, float16 or int8 K rows (ksc: int8 scales, else null) on 8-lane targets
// (quads_available() && !rows_in_place(): AVX2), where widen() and the widened form would take a
// tile: each group of 3 or 4 keys (of kWideningKeys for more than 8 rows, widened once for all
// their blocks of 8) is widened into buf (widening_buffer(dk) floats) just before its products,
// the same values in the same order (the same bits). The widened 64-key tile (32 KiB at
// d = 128) filled Zen 3's 32 KiB L1: its stores missed, the scores read it back from L2.
void scores_quads_widening(int type, std::size_t nk, std::size_t rows, std::size_t dk, const void* const* krow,
                           const float* const* ksc, const float* packed, float* S, std::size_t lds, LineFeed& feed,
                           float* buf);
// Floats of a widened row in scores_quads_widening's buffer (from a line's start), and of the buffer
// (kWideningKeys rows, from the first line's start in it).
inline std::size_t widening_row(std::size_t dk) { return (dk + 15) / 16 * 16; }
// Keys widened at a time for groups of more than 8 rows (12: whole groups of 3 and of 4 keys).
constexpr std::size_t kWideningKeys = 12;
inline std::size_t widening_buffer(std::size_t dk) { return kWideningKeys * widening_row(dk) + 15; }
// Keys a call of widen() and scores_quads() over the widened rows takes in GQA decode (kv_decode.cc):
// 16 where rows_in_place() (AVX-512: int8 rows only), else kTileKeys. A widened tile of 64 keys is
// 32 KiB of float32 at d = 128; written whole before the scores read it, its lines left L1 between
// tiles and every store waited on its line (an Intel Xeon, int8 rows, Hq/Hkv = 32/4, d = 128:
// the widening 25% of the time, 68% of its samples on the instruction after the store). 16 keys,
// 8 KiB, stay in L1 (docs/performance.md, "2026-12-05, 13:32"). The AVX2 target (forced on that
// Xeon; bf16 and float16 rows are widened there too, groups of 5-8 rows 3 keys a call) ran 3-9%
// slower with 16 (40.1 / 40.2 against 38.8 / 36.8 ns a key-head). Each key's score is its own
// sums: the same bits either way.
std::size_t widened_keys();

// Keys per tile of GQA decode: the rows of P (accumulate) lie kTileKeys apart, a stride the
// kernel knows at compile time (a run-time stride cost it 5-7%: eight row pointers, some spilled).
// Each tile pays one row softmax (a chain of dependent lane reductions and exps over the group's
// rows) and the setup of its kernel calls: 64 keys rather than 32 took 0.94-0.97 of the time for
// GQA groups of 8 in cache and 0.95 for bf16 from DRAM, 128 was mixed (docs/performance.md).
inline constexpr std::size_t kTileKeys = 64;

// O[r] = alpha[r]·O[r] + Σ_j P[r][j]·V_j for rows r < rows (O row stride ldo), nk <= kTileKeys.
void accumulate(int type, std::size_t nk, std::size_t rows, std::size_t dv, const void* const* vrow,
                const float* const* vsc, const float* P, const float* alpha, float* O, std::size_t ldo,
                LineFeed& feed);

// Whether accumulate() over int8 rows widens each V vector once for any number of rows (AVX2: a
// column block of the tile at a time into a panel in L1, kv_pv_accumulate.cc's AccumulatePanels); where
// not, groups of more than accumulate_row_block() rows widen it once a row block.
bool values_in_panels();

// Rows accumulate() takes in one pass over a V row (4 on AVX2, whose 16 registers hold 4 rows' sums;
// 8 elsewhere): more rows read and widen each V row once per block of that many.
std::size_t accumulate_row_block();

// The score transforms of one query row (DecodeOptions), on the score s_j of the call's key j:
//   s_j → cap·tanh(s_j / cap) − slope·|diag − j|   (cap 0: no capping; slope 0: no ALiBi)
// with the vector tanh of simd::softcap, so the one-row stream and the tile path cap alike.
struct RowTransform {
  float cap = 0.0f, slope = 0.0f;
  std::int64_t diag = 0;  // the query's key (the sequence's last), counted from the call's key 0
};

// One query row against keys j < nk in tiles of 16 keys counted from key 0 (one key at a time on
// the scalar target): the tile's scores s_j = Q·K_j, one online-softmax step, and the output
// update by the tile's V rows; for a tile J:
//   m' = max(m, max_J s_j);  O = e^(m − m')·O + Σ_J e^(s_j − m')·V_j;  l = e^(m − m')·l + Σ_J e^(s_j − m').
// (m, l, O) in natural units, as the tile path leaves them; m = -inf while no key was seen. The
// next tile's K rows are read between the tile's V rows, so that K and V stream together. Rows at
// fixed strides (a contiguous cache): row j of K at k + j·k_stride bytes, its int8 scales at
// ksc + j·ksc_stride floats (null for other types), likewise V; no array of row pointers to build
// (for int8, 5-9% of a call). ahead > 0 prefetches the rows of the keys that far ahead within the
// call (0: none, the hardware prefetches). tf (null: none) transforms each score before its
// softmax step.
void stream_row_strided(int type, std::size_t nk, std::size_t dk, std::size_t dv, const void* k,
                        std::ptrdiff_t k_stride, const float* ksc, std::ptrdiff_t ksc_stride, const void* v,
                        std::ptrdiff_t v_stride, const float* vsc, std::ptrdiff_t vsc_stride, const float* Q, float* m,
                        float* l, float* O, std::size_t ahead, const RowTransform* tf = nullptr);


// Where the rows of several KV heads lie when a key's rows of all of them lie together (a paged
// cache's blocks [block, Hkv, d]; FlashAttention's [B, Nkv, Hkv, d]): head 0's row of key j at
// row[j], head h's `head` bytes on from it per head; an int8 row's scales likewise (scales[j],
// `scales_head` floats per head; null for other types).
struct HeadRows {
  const void* const* row = nullptr;
  std::ptrdiff_t head = 0;
  const float* const* scales = nullptr;
  std::ptrdiff_t scales_head = 0;
};
// One head's query row (s folded in), its running (m, l), output row and transforms (null: none).
struct HeadRow {
  const float* q = nullptr;
  float* m = nullptr;
  float* l = nullptr;
  float* o = nullptr;
  const RowTransform* tf = nullptr;
};
// stream_row_strided's arithmetic for each of `heads` heads (rows[h]) over keys j < nk, with the
// same bits as a call per head over the same keys, but the keys read in address order: key j's K rows of
// all heads, then its V rows. ahead > 0 prefetches the rows of all heads of the key that far ahead,
// up to key `known` (>= nk): the row pointers [nk, known) are given for that prefetch only.
// work: stream_heads_work(heads, dk) floats.
void stream_heads(int type, std::size_t nk, std::size_t heads, std::size_t dk, std::size_t dv, const HeadRows& k,
                  const HeadRows& v, const HeadRow* rows, std::size_t ahead, std::size_t known, float* work);
inline std::size_t stream_heads_work(std::size_t heads, std::size_t dk) { return heads * (32 + dk) + 16; }

}  // namespace attnscale::detail::kv
