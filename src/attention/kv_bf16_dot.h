// Cache decode's bfloat16 products (DecodeOptions::compute = Compute::bf16): GQA's scores and P·V
// over bf16 K and V rows by vdpbf16ps, which multiplies pairs of bf16 values exactly and adds them
// into float32 lanes, two products an instruction per lane where the float32 path's multiply-add
// does one. A group's query rows (s folded in) and its probabilities P are rounded to bf16 (round to
// nearest even) for the products; the running sums stay float32, and the softmax's normaliser sums
// the float32 P (kv_decode.cc). vdpbf16ps flushes subnormal inputs and results to zero.
// Run only where available() (AVX-512 BF16 usable and the bf16 product path not forced off by
// $ATTNSCALE_BF16); kv_decode.cc takes them for groups of 2 or more query rows with dk % 8 == 0 and
// dv % 32 == 0, else the float32 kernels (kv_kernels.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/prefetch.h"

namespace attnscale::detail::kv::bf16dot {

bool available();

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

}  // namespace attnscale::detail::kv::bf16dot
