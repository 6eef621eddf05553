// Standard normals in bulk: Philox4x32-10 (the same generator and counter layout as lab::Stream,
// bit for bit) evaluated for many counters at once in SIMD lanes (Highway), then Box-Muller.
//
// Element layout (a pure function of the element's index, so any split of the work, any thread
// count and any SIMD width give the same numbers): elements come in groups of 64; group g of a
// stream uses the 16 Philox blocks with counters index = 16g .. 16g+15 (counter words: index low,
// index high, trial, stream; key: seed). Block 16g + l gives four 32-bit words w0..w3 and four
// normals, written to elements 64g + 16·m + l for m = 0..3:
//   u(w) = (⌊w/2⌋ + 1/2) / 2^31 in (0, 1];  r = √(−2 ln u(w0)),  θ = π (2 u(w1) − 1);
//   m = 0: r cos θ,  m = 1: r sin θ,  and the same from (w2, w3) for m = 2, 3.
// All in float32 (Highway's Log, Sin, Cos: a few ulp), so a normal carries a relative error of
// ~1e-6 — far below what any Monte Carlo mean here can see; the float64 fill is the float32 one
// widened. 31-bit uniforms bound |z| by √(2 ln 2^32) ≈ 6.7: the normal tail beyond that has
// probability 2e-11.
//
// Why not Random123's own SIMD types: they cover SSE only and need the scalar Box-Muller per
// number; the scalar path (Stream::normal, 2 transcendental calls per number) is what this replaces
// where an experiment draws millions of Gaussian entries.
#pragma once
#include <cstdint>

#include "lab/rng.h"

namespace attnscale::lab {

inline constexpr std::uint64_t kNormalGroup = 64;  // offsets of fill_normals are multiples of this

// out[0..n) = the standard normals with element indices offset .. offset + n − 1 of stream s.
// offset must be a multiple of kNormalGroup (Error otherwise).
void fill_normals(const Stream& s, std::uint64_t offset, std::int64_t n, double* out);
void fill_normals(const Stream& s, std::uint64_t offset, std::int64_t n, float* out);

// The first multiple of kNormalGroup at or after x: where the next block of elements may start.
inline std::uint64_t normal_offset_after(std::uint64_t x) { return (x + kNormalGroup - 1) / kNormalGroup * kNormalGroup; }

}  // namespace attnscale::lab
