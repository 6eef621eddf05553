// Cache decode's bfloat16 products (DecodeOptions::compute = Compute::bf16): GQA's scores and P·V
// over bf16 K and V rows by vdpbf16ps, which multiplies pairs of bf16 values exactly and adds them
// into float32 lanes, two products an instruction per lane where the float32 path's multiply-add
// does one. A group's query rows (s folded in) and its probabilities P are rounded to bf16 (round to
// nearest even) for the products; the running sums stay float32, and the softmax's normaliser sums
// the float32 P (kv_decode.cc). vdpbf16ps flushes subnormal inputs and results to zero. Where the
// bf16 product path is AMX (amx()), the same products run on AMX tiles instead (AmxOperands, below;
// tdpbf16ps flushes as vdpbf16ps does).
// Run only where available() (AVX-512 BF16 usable and the bf16 product path not forced off by
// $ATTNSCALE_BF16); kv_decode.cc takes them for groups of 2 or more query rows with dk % 8 == 0 and
// dv % 32 == 0, else the float32 kernels (kv_kernels.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "attention/tiles.h"
#include "common/prefetch.h"

namespace attnscale::detail::kv::bf16dot {

bool available();
// Whether the products run on AMX tiles (AmxOperands) rather than by vdpbf16ps: the bf16 product
// path is Path::amx (bf16_kernels.h: AMX usable and not forced off by $ATTNSCALE_BF16).
bool amx();

// The scores' Q layout, per block of 8 rows and 8 columns c: 128 bf16, row h's Q[h][8c .. 8c + 7]
// at 8h (rows 0-3) and 64 + 8(h − 4) (rows 4-7), so that a 512-bit load holds four rows' column
// pairs, one row per 128-bit block; rows past `rows` are zeros.
inline std::size_t packed_size(std::size_t rows, std::size_t dk) { return (rows + 7) / 8 * (dk / 8) * 128; }
void pack(std::size_t rows, std::size_t dk, const float* Q, std::size_t ldq, std::uint16_t* packed);

// S[r][j] = Σ_c bf16(Q[r][c])·K_j[c] for rows r < rows, keys j < nk (bf16 rows), dk % 8 == 0.
// A key's 8 columns are broadcast to the four 128-bit blocks and multiplied into each row's four
// pair lanes (lane i: columns 2i and 2i + 1 of each group of 8); the four lanes are added at the end.
void scores(std::size_t nk, std::size_t rows, std::size_t dk, const void* const* krow, const std::uint16_t* packed,
            float* S, std::size_t lds, LineFeed& feed);

// O[r] = alpha[r]·O[r] + Σ_j bf16(P[r][j])·V_j for rows r < rows (P's rows kTileKeys apart, O's
// ldo), nk <= kTileKeys, dv % 32 == 0. Keys go in pairs: the two V rows' values interleaved
// (vpunpck{l,h}wd) against a 32-bit broadcast of the two keys' P, the output columns in the
// interleave's order until the end, where they are put back in place.
void accumulate(std::size_t nk, std::size_t rows, std::size_t dv, const void* const* vrow, const float* P,
                const float* alpha, float* O, std::size_t ldo, LineFeed& feed);

// The same products on AMX tiles (tdpbf16ps), with the same roundings (Q·s and P to bf16 by
// vcvtneps2bf16, float32 sums): per tile of keys, Sᵀ = K·Qᵀ against Qᵀ packed once a chunk, four
// blocks of 16 keys in four accumulator tiles, each block's K rows read where they lie when they
// are one stride apart (a contiguous cache, a paged block) and else copied by pointer into a
// contiguous block (the same values: any layout gives the same bits); P·V is P rounded to bf16
// against the tile's V rows repacked in key pairs (two rows' values interleaved by
// vpunpck{l,h}wd, as accumulate() does), 64 columns of O in four tiles a pass, merged as
// O = alpha·O + P·V by a multiply-add. The interleave leaves O's columns permuted within each
// group of 32 (column c + i, i < 16, holds column 8⌊i/4⌋ + i % 4 and c + 16 + i column
// 8⌊i/4⌋ + 4 + i % 4), for the whole of a chunk, until unpermute() puts them in place. Calls
// only while a bfdot::TileScope on Path::amx is open on the thread (bf16_kernels.h). One per group of `rows` query rows (kv_decode.cc's
// Scratch).
class AmxOperands {
 public:
  AmxOperands() = default;
  AmxOperands(std::size_t rows, std::size_t dk, std::size_t dv);
  bool fits(std::size_t rows, std::size_t dk, std::size_t dv) const {
    return rows == rows_ && dk == dk_ && dv == dv_;
  }
  // Q's rows (scaled by s) rounded to bf16, as Qᵀ in bf16_kernels.h's VNNI B layout.
  void pack(const float* Q, std::size_t ldq);
  // S[r][j] = Σ_c bf16(Q[r][c])·K_j[c] for rows r < rows, keys j < nk <= kTileKeys; the feed steps
  // through the whole call (rows copied, product steps, scores gathered).
  void scores(std::size_t nk, const void* const* krow, float* S, std::size_t lds, LineFeed& feed);
  // O[r] = alpha[r]·O[r] + Σ_j bf16(P[r][j])·V_j for r < rows (<= the group's; P's rows kTileKeys
  // apart), nk <= kTileKeys, O's columns permuted as above; the feed steps
  // through the whole call (P rounded, key pairs repacked, product steps, rows merged).
  void accumulate(std::size_t nk, std::size_t rows, const void* const* vrow, const float* P, const float* alpha,
                  float* O, std::size_t ldo, LineFeed& feed);
  // O's rows (dv columns, ldo apart) from the permuted order into place.
  void unpermute(std::size_t rows, float* O, std::size_t ldo) const;

 private:
  // Every buffer on 64-byte lines (Buffer, tiles.h): tile rows and vectors whole lines.
  std::size_t rows_ = 0, dk_ = 0, dv_ = 0, dkp_ = 0, ldq_ = 0;  // dkp_: dk rounded up to 32
  Buffer<std::uint16_t> qt_;  // Qᵀ [dkp_/2][ldq_][2]
  Buffer<std::uint16_t> k_;   // the tile's K rows [kTileKeys][dkp_], zero past dk
  Buffer<float> st_;          // Sᵀ's tiles [kTileKeys][16]
  Buffer<std::uint16_t> p_;   // P [rows_ rounded up to 16][kTileKeys]
  Buffer<std::uint16_t> v_;   // V in key pairs [kTileKeys/2][dv_][2]
};

}  // namespace attnscale::detail::kv::bf16dot
