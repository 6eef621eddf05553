// Per-target SIMD kernels of the fast path (compiled once per Highway target by kernels.cc).
//
// Everything here works on contiguous float32 tiles; masks, dtypes, strides and threads live in the
// scalar orchestration (forward.cc, backward.cc, decode.cc). Tile layout (FlashAttention with the
// score tile transposed so that the softmax runs down columns, one SIMD lane per query):
//   Qt [dk][ldq]  query block, transposed, pre-multiplied by s, zero in padding columns
//   St [Bc][ldq]  scores x = s·q·k of Bc keys (rows) against the query block (columns)
//   O  [ldq][ldo] output accumulator, one row per query
// so the running max m and sum l of a query are one lane of a vector: no horizontal reductions.
#if defined(ATTNSCALE_ATTENTION_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNSCALE_ATTENTION_KERNELS_INL_H_
#undef ATTNSCALE_ATTENTION_KERNELS_INL_H_
#else
#define ATTNSCALE_ATTENTION_KERNELS_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <hwy/highway.h>

#include "attnscale/tensor.h"

#include "attention/bf16_kernels.h"
#include "attention/exp2-inl.h"
#include "attention/lane_reduce-inl.h"
#include "attention/raw_vectors-inl.h"
#include "attention/softcap-inl.h"
#include "attention/transpose16.h"

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register blocking of the GEMM micro-kernel: MR rows of C by NR vectors of columns, all kept in
// registers while the whole inner dimension streams through (AVX-512: 4 x 4 zmm = 16
// accumulators + 4 B vectors of 32 registers; AVX2: 6 x 2 ymm = 12 + 2 of 16). Where the caller
// asks for wide tiles (Gemm's `wide`: Intel's cores, kernels.cc) AVX-512 takes 6 x 4 (24
// accumulators + 4 + 1 broadcast): on an Intel Xeon the forward ran 2-4% faster and the backward
// 5-7% (2026-12-05), on Zen 5, which shares this target, 7-8% slower (2026-12-04).
#if HWY_TARGET == HWY_AVX2
constexpr size_t kMR = 6, kNR = 2, kWideMR = 6;
#elif HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kMR = 4, kNR = 4, kWideMR = 6;
#else
constexpr size_t kMR = 4, kNR = 2, kWideMR = 4;
#endif

// The 16 (8, 4) probabilities p rounded to bfloat16 into dst. On AVX-512 by vcvtneps2bf16 (to
// nearest even; its callers run only where AVX-512 BF16 is usable, bf16_kernels.h, so the
// instruction is written as asm rather than asked of the whole target): the bits of to_bf16
// (tensor.h) for every p the softmax makes, 0 and the normal numbers up to 1 (e^x flushes what
// falls below 2^-126 to 0, ScaleByPow2OrZero) and NaN. Elsewhere to_bf16 lane by lane.
#if HWY_TARGET == HWY_AVX3
HWY_INLINE __m256i RoundToBf16(VF p) {
  __m256i h;
  asm("vcvtneps2bf16 %1, %0" : "=v"(h) : "v"(p.raw));
  return h;
}
#endif
HWY_INLINE void StoreBf16(VF p, std::uint16_t* dst) {
#if HWY_TARGET == HWY_AVX3
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), RoundToBf16(p));
#else
  const DF d;
  HWY_ALIGN float x[hn::MaxLanes(d)];
  hn::Store(p, d, x);
  for (size_t i = 0; i < hn::Lanes(d); ++i) dst[i] = to_bf16(x[i]).bits;
#endif
}

// An empty asm that takes the vector in a register and may change it: the compiler must keep it
// in a register rather than re-read its memory at every use.
template <class Raw>
HWY_INLINE void Pin(Raw& v) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

// One inner-dimension block [k0, k1) of a tile: acc[i][r] += A(i, k)·B(k, r-th vector), one
// chain per element (NR <= 4). The tile's vectors are held as raw registers (RawF, raw_vectors-inl.h; arrays of Highway's
// vector structs GCC keeps on the stack here), and B's vectors are loaded once per k and pinned
// to registers (Pin): left to itself GCC (generic tuning) folds the loads into the FMAs as memory
// operands, MR loads of each vector, and the loads then bound the loop (Zen 4 loads one zmm a
// cycle, the rate of its FMAs): 0.74 of the peak instead of 0.95 on the tile products.
template <size_t MR, size_t NR, bool kTail>
HWY_INLINE void BlockChain(DF d, size_t k0, size_t k1, const float* HWY_RESTRICT A, size_t ars, size_t acs,
                           const float* HWY_RESTRICT B, size_t ldb, size_t tail, RawF (&acc)[MR][NR]) {
  const size_t L = hn::Lanes(d);
  const auto last = hn::FirstN(d, kTail ? tail : L);
  for (size_t k = k0; k < k1; ++k) {
    const auto load = [&](size_t r) {
      return ToRaw((kTail && r + 1 == NR) ? hn::MaskedLoad(last, d, B + k * ldb + r * L) : hn::LoadU(d, B + k * ldb + r * L));
    };
    // Named, not an array: with an asm operand on an array element GCC keeps the array in memory
    // and stores every B vector to the stack each step.
    RawF b0 = load(0), b1 = b0, b2 = b0, b3 = b0;
    if constexpr (NR > 1) b1 = load(1);
    if constexpr (NR > 2) b2 = load(2);
    if constexpr (NR > 3) b3 = load(3);
    Pin(b0);
    if constexpr (NR > 1) Pin(b1);
    if constexpr (NR > 2) Pin(b2);
    if constexpr (NR > 3) Pin(b3);
#pragma GCC unroll 8
    for (size_t i = 0; i < MR; ++i) {
      const VF a = hn::Set(d, A[i * ars + k * acs]);
      acc[i][0] = ToRaw(FusedMulAdd(a, FromRaw(b0), FromRaw(acc[i][0])));
      if constexpr (NR > 1) acc[i][1] = ToRaw(FusedMulAdd(a, FromRaw(b1), FromRaw(acc[i][1])));
      if constexpr (NR > 2) acc[i][2] = ToRaw(FusedMulAdd(a, FromRaw(b2), FromRaw(acc[i][2])));
      if constexpr (NR > 3) acc[i][3] = ToRaw(FusedMulAdd(a, FromRaw(b3), FromRaw(acc[i][3])));
    }
  }
}

// C tile of MR rows x NR*L columns (the last vector holding `tail` valid lanes when kTail):
//   C = init + Σ_k A[m·ars + k·acs] · B[k·ldb + n]
// with init = 0 (mode 0), C (mode 1) or row_scale[m]·C (mode 2). The chains run in BlockChain,
// B's vectors pinned to registers: with them folded into the FMAs as memory operands (MR loads of
// each vector a step) an Intel Xeon's two 512-bit loads a cycle bounded the loop, the tile products
// at 0.69-0.75 of the FMA peak against 0.73-0.79 pinned (tile_products_bench, 2026-12-05).
template <size_t MR, size_t NR, bool kTail>
HWY_INLINE void MicroTile(DF d, size_t K, const float* HWY_RESTRICT A, size_t ars, size_t acs,
                          const float* HWY_RESTRICT B, size_t ldb, float* HWY_RESTRICT C, size_t ldc,
                          int mode, const float* HWY_RESTRICT row_scale, size_t tail) {
  const size_t L = hn::Lanes(d);
  const auto last = hn::FirstN(d, kTail ? tail : L);
  RawF acc[MR][NR];
#pragma GCC unroll 8
  for (size_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; ++r) acc[i][r] = ToRaw(hn::Zero(d));
  BlockChain<MR, NR, kTail>(d, 0, K, A, ars, acs, B, ldb, tail, acc);
#pragma GCC unroll 8
  for (size_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; ++r) {
      float* c = C + i * ldc + r * L;
      const bool partial = kTail && r + 1 == NR;
      VF v = FromRaw(acc[i][r]);
      if (mode != 0) {
        VF old = partial ? hn::MaskedLoad(last, d, c) : hn::LoadU(d, c);
        if (mode == 2) old = hn::Mul(old, hn::Set(d, row_scale[i]));
        v = hn::Add(old, v);
      }
      if (partial) hn::BlendedStore(v, last, d, c);
      else hn::StoreU(v, d, c);
    }
}

// Inner-dimension blocks of Gemm: each C element sums at most kc products in one register chain,
// then adds that partial sum to C. Derivation: in a chain the rounding error of step k is about
// u·|partial sum so far| (u = 2^-24), so a chain of K products of unit size errs by about
// u·sqrt(Σ_k k) ~ u·K/√2, while kc-long chains added in order err by about u·(kc + K/kc)/√2 times
// the same factor, least at kc ≈ √K. Each block costs a load, add and store of the C tile, so
// kc is √K rounded up to a power of two, at least 32: K = 64..1024 → 32, 4096 → 64. Measured
// against float64 (the scores of d_k = 64..4096, unscaled), one chain had 2-4x the error of
// OpenBLAS's sgemm, these blocks 0.8-1.3x. Blocks of 16 (the floor before) were a little more
// accurate at d_k <= 256 and 2-4% slower in the whole forward (docs/performance.md, "Inner blocks
// of 32"); either way the forward and backward stay under plain float32 PyTorch's error.
inline size_t InnerBlock(size_t K) {
  size_t kc = 32;
  while (kc * kc < K) kc *= 2;
  return kc;
}

// One C tile over the inner dimension [0, K): its inner blocks one after the other, the first
// with the caller's mode, the later ones adding to what it left. The tile's C (MR x NR vectors)
// is stored and read back at once, from L1, where a loop over the blocks outside the tiles would
// sweep all of C once per block (P·V at d = 128: the 32 KiB output accumulator, twice a tile).
template <size_t MR, size_t NR, bool kTail>
HWY_INLINE void BlockedTile(DF d, size_t K, size_t kb, const float* A, size_t ars, size_t acs, const float* B,
                            size_t ldb, float* C, size_t ldc, int mode, const float* row_scale, size_t tail) {
  for (size_t k0 = 0; k0 < K || k0 == 0; k0 += kb)
    MicroTile<MR, NR, kTail>(d, std::min(kb, K - k0), A + k0 * acs, ars, acs, B + k0 * ldb, ldb, C, ldc,
                             k0 == 0 ? mode : 1, row_scale, tail);
}

// Rows [0, M) in blocks of MR (the remainder with a smaller instantiation) for one column block.
template <size_t MR, size_t NR, bool kTail>
HWY_INLINE void ColumnBlock(DF d, size_t M, size_t K, size_t kb, const float* A, size_t ars, size_t acs,
                            const float* B, size_t ldb, float* C, size_t ldc, int mode,
                            const float* row_scale, size_t tail) {
  size_t m = 0;
  for (; m + MR <= M; m += MR)
    BlockedTile<MR, NR, kTail>(d, K, kb, A + m * ars, ars, acs, B, ldb, C + m * ldc, ldc, mode,
                               row_scale ? row_scale + m : nullptr, tail);
  const size_t rest = M - m;
  const float* a = A + m * ars;
  float* c = C + m * ldc;
  const float* rs = row_scale ? row_scale + m : nullptr;
  switch (rest) {  // MR <= 6
    case 1: BlockedTile<1, NR, kTail>(d, K, kb, a, ars, acs, B, ldb, c, ldc, mode, rs, tail); break;
    case 2: BlockedTile<2, NR, kTail>(d, K, kb, a, ars, acs, B, ldb, c, ldc, mode, rs, tail); break;
    case 3: BlockedTile<3, NR, kTail>(d, K, kb, a, ars, acs, B, ldb, c, ldc, mode, rs, tail); break;
    case 4: BlockedTile<4, NR, kTail>(d, K, kb, a, ars, acs, B, ldb, c, ldc, mode, rs, tail); break;
    case 5: BlockedTile<5, NR, kTail>(d, K, kb, a, ars, acs, B, ldb, c, ldc, mode, rs, tail); break;
    default: break;
  }
}

// C[M x N] (ldc) = init + A·B, A read element-wise through (ars, acs) so that transposed and
// strided operands need no copy, B row-major with unit column stride (ldb). See MicroTile.
// Each element's operations and their order depend only on K and the inner block kb (0 for
// InnerBlock(K)), not on the loop order over tiles nor on `wide` (kWideMR rows a tile).
void Gemm(size_t M, size_t N, size_t K, const float* A, size_t ars, size_t acs, const float* B,
          size_t ldb, float* C, size_t ldc, int mode, const float* row_scale, size_t kb, bool wide) {
  const DF d;
  const size_t L = hn::Lanes(d);
  if (kb == 0) kb = InnerBlock(K);
  size_t n = 0;
  for (; n + kNR * L <= N; n += kNR * L) {
    if (wide) ColumnBlock<kWideMR, kNR, false>(d, M, K, kb, A, ars, acs, B + n, ldb, C + n, ldc, mode, row_scale, L);
    else ColumnBlock<kMR, kNR, false>(d, M, K, kb, A, ars, acs, B + n, ldb, C + n, ldc, mode, row_scale, L);
  }
  // Two or three whole vectors left (AVX-512's kNR = 4: d = 96, a partial tile's 48 columns): one
  // block that wide (two vectors by kWideMR = 6 rows on every core: 12 chains). Passes of one
  // vector would run kMR = 4 chains, too few to keep two FMA ports busy (each FMA waits 4 cycles
  // for its chain's last).
  if constexpr (kNR == 4) {
    if (N - n >= 3 * L) {
      if (wide) ColumnBlock<kWideMR, 3, false>(d, M, K, kb, A, ars, acs, B + n, ldb, C + n, ldc, mode, row_scale, L);
      else ColumnBlock<kMR, 3, false>(d, M, K, kb, A, ars, acs, B + n, ldb, C + n, ldc, mode, row_scale, L);
      n += 3 * L;
    } else if (N - n >= 2 * L) {
      ColumnBlock<kWideMR, 2, false>(d, M, K, kb, A, ars, acs, B + n, ldb, C + n, ldc, mode, row_scale, L);
      n += 2 * L;
    }
  }
  for (; n + L <= N; n += L)
    ColumnBlock<kMR, 1, false>(d, M, K, kb, A, ars, acs, B + n, ldb, C + n, ldc, mode, row_scale, L);
  if (n < N) ColumnBlock<kMR, 1, true>(d, M, K, kb, A, ars, acs, B + n, ldb, C + n, ldc, mode, row_scale, N - n);
}

// The forward's products (TileGemm): Gemm's result, bit for bit in modes 0 and 1 (see SumTile),
// with the running sum over the inner-dimension blocks (InnerBlock) kept in registers. Each
// block's chain runs in its own accumulators and is added to a second register set that started
// as init, so C is read once before the first block and written once after the last, where Gemm
// loads, adds and stores the C tile once per block. The same operations in the same order keep
// the forward's scores equal to the ones the backward recomputes with Gemm: scores a rounding
// apart (the blocks grouped differently) raised the backward's error at d_k = 256, unscaled, from
// 1.5x to 2.0x that of plain float32, since P = e^(t − lse) then no longer sums to 1 over t.
// The two register sets halve the tile: AVX-512 2 rows x 4 vectors (16 accumulators and sums,
// 4 B vectors, 1 broadcast). Measured by bench/tile_products_bench.cc (one 64-key tile, one
// thread): the scores run at 0.94-0.97 of the FMA peak against Gemm's 0.93-0.94; P·V alone, at
// d = 128, at 0.76-0.82 against Gemm's 0.82-0.87 (equal at d = 64), yet the whole forward ran
// faster with TileGemm for both products than with it for the scores alone (an A/B of the
// forward at d = 128 on one thread, by CPU time: 0.86 against 0.82-0.84 of the peak). 3 x 4 (29 of 32 registers) was as fast in a stand-alone test
// compiled for Skylake-AVX512, but in this code GCC spilled part of it to the stack. AVX2's 16
// registers leave 3 x 2, which ran at 0.70 where Gemm's 6 x 2 runs at 0.83: there (and on the
// scalar target) TileGemm is Gemm.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr bool kTileSums = true;
constexpr size_t kSumMR = 2, kSumNR = 4;  // kSumNR <= 4 (BlockChain)
#else
constexpr bool kTileSums = false;  // TileGemm runs Gemm
constexpr size_t kSumMR = 2, kSumNR = 2;
#endif

// A tile of MR rows x NR vectors over the whole K (mode a template argument, so that each
// instantiation is straight-line code and its 2·MR·NR vectors stay in registers).
// sum starts as init (mode 1: C; mode 2: row_scale·C) and takes each block's chain in order; in
// mode 0 the first block's chain runs in sum itself (0 + x would turn -0 into +0). Gemm's
// operations in Gemm's order, so the same bits in every mode (this file is compiled without
// contraction of a multiply and an add into an FMA, src/CMakeLists.txt: mode 2's row_scale·C +
// chain is two roundings in both).
template <size_t MR, size_t NR, bool kTail, int kMode>
HWY_INLINE void SumTile(DF d, size_t K, size_t kb, const float* HWY_RESTRICT A, size_t ars, size_t acs,
                        const float* HWY_RESTRICT B, size_t ldb, float* HWY_RESTRICT C, size_t ldc,
                        const float* HWY_RESTRICT row_scale, size_t tail) {
  const size_t L = hn::Lanes(d);
  const auto last = hn::FirstN(d, kTail ? tail : L);
  RawF sum[MR][NR];
#pragma GCC unroll 8
  for (size_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; ++r) {
      const float* c = C + i * ldc + r * L;
      VF v = hn::Zero(d);
      if constexpr (kMode != 0) v = (kTail && r + 1 == NR) ? hn::MaskedLoad(last, d, c) : hn::LoadU(d, c);
      if constexpr (kMode == 2) v = hn::Mul(v, hn::Set(d, row_scale[i]));
      sum[i][r] = ToRaw(v);
    }
  size_t k0 = 0;
  if constexpr (kMode == 0) {
    BlockChain<MR, NR, kTail>(d, 0, std::min(K, kb), A, ars, acs, B, ldb, tail, sum);
    k0 = kb;
  }
  for (; k0 < K; k0 += kb) {
    RawF acc[MR][NR];
#pragma GCC unroll 8
    for (size_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (size_t r = 0; r < NR; ++r) acc[i][r] = ToRaw(hn::Zero(d));
    BlockChain<MR, NR, kTail>(d, k0, std::min(K, k0 + kb), A, ars, acs, B, ldb, tail, acc);
#pragma GCC unroll 8
    for (size_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (size_t r = 0; r < NR; ++r) sum[i][r] = ToRaw(hn::Add(FromRaw(sum[i][r]), FromRaw(acc[i][r])));
  }
#pragma GCC unroll 8
  for (size_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; ++r) {
      float* c = C + i * ldc + r * L;
      if (kTail && r + 1 == NR) hn::BlendedStore(FromRaw(sum[i][r]), last, d, c);
      else hn::StoreU(FromRaw(sum[i][r]), d, c);
    }
}

// Rows [0, M) of one column block: whole tiles, then the rest in tiles of 2 rows and 1 (with
// 3-row tiles, 64 rows go as 20 x 3 + 2 x 2 rather than 21 x 3 + 1: a 1-row tile loads a B vector
// per FMA).
template <size_t NR, bool kTail, int kMode>
HWY_INLINE void SumColumnBlock(DF d, size_t M, size_t K, size_t kb, const float* A, size_t ars, size_t acs,
                               const float* B, size_t ldb, float* C, size_t ldc, const float* row_scale,
                               size_t tail) {
  size_t tiles = M / kSumMR;
  if (kSumMR == 3 && M % 3 == 1 && tiles > 0) --tiles;
  size_t m = 0;
  for (; m < tiles * kSumMR; m += kSumMR)
    SumTile<kSumMR, NR, kTail, kMode>(d, K, kb, A + m * ars, ars, acs, B, ldb, C + m * ldc, ldc,
                                      row_scale ? row_scale + m : nullptr, tail);
  for (; m < M; m += m + 2 <= M ? 2 : 1) {
    const float* a = A + m * ars;
    float* c = C + m * ldc;
    const float* rs = row_scale ? row_scale + m : nullptr;
    if (m + 2 <= M) SumTile<2, NR, kTail, kMode>(d, K, kb, a, ars, acs, B, ldb, c, ldc, rs, tail);
    else SumTile<1, NR, kTail, kMode>(d, K, kb, a, ars, acs, B, ldb, c, ldc, rs, tail);
  }
}

template <int kMode>
void TileGemmMode(size_t M, size_t N, size_t K, size_t kb, const float* A, size_t ars, size_t acs, const float* B,
                  size_t ldb, float* C, size_t ldc, const float* row_scale) {
  const DF d;
  const size_t L = hn::Lanes(d);
  size_t n = 0;
  for (; n + kSumNR * L <= N; n += kSumNR * L)
    SumColumnBlock<kSumNR, false, kMode>(d, M, K, kb, A, ars, acs, B + n, ldb, C + n, ldc, row_scale, L);
  for (; n + L <= N; n += L)
    SumColumnBlock<1, false, kMode>(d, M, K, kb, A, ars, acs, B + n, ldb, C + n, ldc, row_scale, L);
  if (n < N) SumColumnBlock<1, true, kMode>(d, M, K, kb, A, ars, acs, B + n, ldb, C + n, ldc, row_scale, N - n);
}

void TileGemm(size_t M, size_t N, size_t K, const float* A, size_t ars, size_t acs, const float* B, size_t ldb,
              float* C, size_t ldc, int mode, const float* row_scale, size_t kb) {
  if constexpr (!kTileSums) return Gemm(M, N, K, A, ars, acs, B, ldb, C, ldc, mode, row_scale, kb, false);
  const size_t L = hn::Lanes(DF());
  if (kb == 0) kb = InnerBlock(K);
  // Every row tile of a column block reads the block's B panel (K x kSumNR·L); panels over
  // 16 KiB (d = 128 at 3 x 4: 32 KiB) would leave L1 between row tiles. Such K is cut into
  // spans whose panel fits (whole inner blocks), each span's sums added to C through memory
  // (as Gemm adds each block's), so the bits stay Gemm's.
  const size_t span = std::max(kb, (size_t{16384} / (kSumNR * L * sizeof(float))) / kb * kb);
  for (size_t k0 = 0; k0 < K || k0 == 0; k0 += span) {
    const size_t ks = std::min(span, K - k0);
    const float* a = A + k0 * acs;
    const float* b = B + k0 * ldb;
    switch (k0 == 0 ? mode : 1) {  // later spans add to what the first one left
      case 0: TileGemmMode<0>(M, N, ks, kb, a, ars, acs, b, ldb, C, ldc, row_scale); break;
      case 1: TileGemmMode<1>(M, N, ks, kb, a, ars, acs, b, ldb, C, ldc, row_scale); break;
      default: TileGemmMode<2>(M, N, ks, kb, a, ars, acs, b, ldb, C, ldc, row_scale); break;
    }
  }
}

// Sums whose bits do not depend on the vector width, so that blocks of few rows (DotTile,
// SoftmaxUpdateRows) give the same bits on every target. A sum runs as C chains, value c in chain
// c mod C in order (C / L vectors of L lanes, or C scalars on the scalar target), then the chains
// meet by a fixed tree:
//   DotSum (C = 32): chain k + chain k + 16, then halving: + 8, + 4, + 2, + 1 (the order of
//     _mm512_reduce_add_ps on the 16 sums);
//   Sums4 (C = 16, four rows at once): each block of four chains as (c0 + c2) + (c1 + c3), then the
//     blocks as (B0 + B2) + (B1 + B3) (the order of Reduce4).
// The halving sum of one vector's lanes: lane i + lane i + L/2, and so on down to lane 0 + lane 1.
template <class D>
HWY_INLINE float HalvingLaneSum(D d, hn::Vec<D> v) {
  constexpr size_t N = hn::MaxLanes(D());
  if constexpr (N == 1) {
    return hn::GetLane(v);
  }
#if HWY_TARGET != HWY_SCALAR
  else if constexpr (N == 4) {
    const auto w = hn::Add(v, hn::Shuffle1032(v));
    return hn::GetLane(w) + hn::ExtractLane(w, 1);
  } else {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (N == 16) return _mm512_reduce_add_ps(v.raw);  // the same order
#endif
    const hn::Half<D> dh;
    return HalvingLaneSum(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
#endif
}

// The halving sum of N vectors, lane by lane, in place: x[v] + x[v + N/2], and so on down to x[0].
template <size_t N>
HWY_INLINE VF HalvingVectorSum(VF (&x)[N]) {
  for (size_t n = N; n > 1; n /= 2)
    for (size_t v = 0; v < n / 2; ++v) x[v] = hn::Add(x[v], x[v + n / 2]);
  return x[0];
}

static_assert(HWY_LANES(float) <= 16, "the chains below take whole vectors");
constexpr size_t kDotChains = 32;
constexpr size_t kDotVectors = kDotChains / HWY_LANES(float);
// acc[v] lane i holds chain v·L + i: halving over the vectors (chain k + chain k + 16, then
// + 8 while more than one vector is left), then over the last one's lanes.
HWY_INLINE float DotSum(DF d, VF (&acc)[kDotVectors]) { return HalvingLaneSum(d, HalvingVectorSum(acc)); }

// Scores of few query rows, GEMV-style: S[r][j] = Σ_c K[j·ldk + c] · Q[r·ldq + c] for keys
// j < nk and rows r < rows (Q row-major). Each key row is read once with whole-vector loads and
// reduced across lanes (DotSum: the same bits on every target), where the GEMM kernel would fill
// a 16-lane column for one useful query; decode (one or a few queries over a long KV cache) is
// bound by reading K and V.
void DotTile(size_t nk, size_t rows, size_t dk, const float* HWY_RESTRICT K, size_t ldk, const float* HWY_RESTRICT Q,
             size_t ldq, float* HWY_RESTRICT St, size_t lds) {
  const DF d;
  constexpr size_t L = HWY_LANES(float);
  const size_t whole = dk / kDotChains * kDotChains;
  for (size_t j = 0; j < nk; ++j) {
    const float* k = K + j * ldk;
    for (size_t r = 0; r < rows; ++r) {
      const float* q = Q + r * ldq;
      VF acc[kDotVectors];
      for (size_t v = 0; v < kDotVectors; ++v) acc[v] = hn::Zero(d);
      for (size_t c = 0; c < whole; c += kDotChains)
        for (size_t v = 0; v < kDotVectors; ++v)
          acc[v] = FusedMulAdd(hn::LoadU(d, k + c + v * L), hn::LoadU(d, q + c + v * L), acc[v]);
      for (size_t v = 0, c = whole; c < dk; ++v, c += L) {  // the last dk mod 32 values, chain by chain
        if (c + L <= dk) {
          acc[v] = FusedMulAdd(hn::LoadU(d, k + c), hn::LoadU(d, q + c), acc[v]);
        } else {
          const auto part = hn::FirstN(d, dk - c);
          acc[v] = FusedMulAdd(hn::MaskedLoad(part, d, k + c), hn::MaskedLoad(part, d, q + c), acc[v]);
        }
      }
      St[r * lds + j] = DotSum(d, acc);
    }
  }
}

// The one-column case of Gemm with unit row stride in A (ars = 1) and in C (ldc = 1), e.g. P·V
// for dv = 1 with the transposed score tile as A: C[m] = init + Σ_k A[m + k·acs] · B[k·ldb] runs
// with the rows m in the lanes, one FMA per k per vector, instead of MR-row tiles with one useful
// lane. The products are summed in the same order with the same FMAs as MicroTile (acc from 0,
// then init + acc), so the result is bit for bit Gemm's.
void GemvColumns(size_t M, size_t K, const float* HWY_RESTRICT A, size_t acs, const float* HWY_RESTRICT B,
                 size_t ldb, float* HWY_RESTRICT C, int mode, const float* HWY_RESTRICT row_scale) {
  const DF d;
  const size_t L = hn::Lanes(d);
  for (size_t m = 0; m < M; m += L) {
    const auto valid = hn::FirstN(d, M - m);
    for (size_t k0 = 0; k0 < K || k0 == 0; k0 += InnerBlock(K)) {  // Gemm's inner-dimension blocks
      VF acc = hn::Zero(d);
      for (size_t k = k0; k < std::min(K, k0 + InnerBlock(K)); ++k)
        acc = FusedMulAdd(hn::Set(d, B[k * ldb]), hn::MaskedLoad(valid, d, A + k * acs + m), acc);
      const int md = k0 == 0 ? mode : 1;
      if (md != 0) {
        VF old = hn::MaskedLoad(valid, d, C + m);
        if (md == 2) old = hn::Mul(old, hn::MaskedLoad(valid, d, row_scale + m));
        acc = hn::Add(old, acc);
      }
      hn::BlendedStore(acc, valid, d, C + m);
    }
  }
}

// Online softmax over a transposed score tile St[rows][lds] (keys x queries; cols a multiple of
// the lane count). Per query column c, with m the running max and l the running sum:
//   m' = max(m, max_j St[j][c]);  alpha = e^(m − m');  P[j][c] = e^(St[j][c] − m');
//   l' = alpha·l + Σ_j P[j][c].
// The caller rescales its accumulator rows by alpha (O' = alpha·O + P·V). Each e^(x − m) is
// ExpDiff: the difference in natural units, then exp2 of it times log2(e).
// Fully-masked guard: while every key a query has seen is masked, m' = -inf and St − m' would be
// (-inf) − (-inf) = NaN; subtracting 0 instead gives P = e^(-inf) = 0 and alpha = 0, so l stays 0
// and the row finishes as out = 0, lse = -inf.
// C column vectors of SoftmaxUpdate side by side: each column's max, exp and sum run in the
// same order as alone (the same bits), but C independent chains (the sum's adds, the max's) keep
// the units busy where one column waits on each step's latency.
template <size_t C>
HWY_INLINE void SoftmaxColumnsTogether(DF d, float* St, size_t lds, size_t rows, float* m, float* l, float* alpha) {
  const size_t L = hn::Lanes(d);
  const VF neg_inf = hn::Set(d, -INFINITY);
  VF m_old[C], m_use[C], mx[C], sum[C];
  for (size_t c = 0; c < C; ++c) {
    m_old[c] = hn::LoadU(d, m + c * L);
    mx[c] = neg_inf;
    sum[c] = hn::Zero(d);
  }
  for (size_t j = 0; j < rows; ++j)
    for (size_t c = 0; c < C; ++c) mx[c] = hn::Max(mx[c], hn::LoadU(d, St + j * lds + c * L));
  for (size_t c = 0; c < C; ++c) {
    mx[c] = hn::Max(m_old[c], mx[c]);                                 // m'
    m_use[c] = hn::IfThenZeroElse(hn::Eq(mx[c], neg_inf), mx[c]);    // the guard above
  }
  for (size_t j = 0; j < rows; ++j)
    for (size_t c = 0; c < C; ++c) {
      float* at = St + j * lds + c * L;
      const VF p = ExpBelowMax(d, hn::LoadU(d, at), m_use[c]);
      hn::StoreU(p, d, at);
      sum[c] = hn::Add(sum[c], p);
    }
  for (size_t c = 0; c < C; ++c) {
    const VF a = ExpBelowMax(d, m_old[c], m_use[c]);
    hn::StoreU(a, d, alpha + c * L);
    hn::StoreU(FusedMulAdd(a, hn::LoadU(d, l + c * L), sum[c]), d, l + c * L);
    hn::StoreU(mx[c], d, m + c * L);
  }
}

void SoftmaxUpdate(float* St, size_t lds, size_t rows, size_t cols, float* m, float* l, float* alpha) {
  const DF d;
  const size_t L = hn::Lanes(d);
  size_t c = 0;
  for (; c + 4 * L <= cols; c += 4 * L) SoftmaxColumnsTogether<4>(d, St + c, lds, rows, m + c, l + c, alpha + c);
  for (; c < cols; c += L) SoftmaxColumnsTogether<1>(d, St + c, lds, rows, m + c, l + c, alpha + c);
}

// St[j][c] = e^(St[j][c] − sub[c]) · mul[c]: probabilities from final statistics (sub = m and
// mul = 1/l for the probs output; sub = lse, mul = 1/σ for the backward). A caller passes
// sub = +inf for a fully masked query, so every entry becomes e^(-inf) = 0.
// kScaled: St holds unscaled scores x, each read as t = x·scale (one rounded multiply: the same t
// as a product that wrote x·scale).
template <bool kForBf16, bool kScaled = false, bool kToBf16 = false>
HWY_INLINE void Exp2ColumnsFor(float* St, size_t lds, size_t rows, size_t cols, const float* sub, const float* mul,
                               float scale = 1.0f, std::uint16_t* Pb = nullptr, size_t ldp = 0) {
  const auto put = [&](VF p, size_t j, size_t c) HWY_ATTR {
    hn::StoreU(p, DF(), St + j * lds + c);
    if constexpr (kToBf16) StoreBf16(p, Pb + j * ldp + c);
  };
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF sv = hn::Set(d, scale), c1 = hn::Set(d, scale * kLog2E);
  for (size_t c = 0; c < cols; c += L) {
    const VF s = hn::LoadU(d, sub + c), f = hn::LoadU(d, mul + c);
    // bf16, scaled: ExpFolded where every |sub| of the columns is at most kFoldLimit (the
    // padding's sub = +inf is not).
    if (kForBf16 && kScaled && hn::AllTrue(d, hn::Le(hn::Abs(s), hn::Set(d, kFoldLimit)))) {
      const VF c0 = hn::Mul(hn::Neg(s), hn::Set(d, kLog2E));
      for (size_t j = 0; j < rows; ++j)
        put(hn::Mul(ExpFolded<DF, false>(d, hn::LoadU(d, St + j * lds + c), c1, c0), f), j, c);
      continue;
    }
    for (size_t j = 0; j < rows; ++j) {
      const VF x = hn::LoadU(d, St + j * lds + c);
      put(hn::Mul(ExpDiff<DF, kForBf16>(d, kScaled ? hn::Mul(x, sv) : x, s), f), j, c);
    }
  }
}
void Exp2Columns(float* St, size_t lds, size_t rows, size_t cols, const float* sub, const float* mul) {
  Exp2ColumnsFor<false>(St, lds, rows, cols, sub, mul);
}
// The bf16 backward's P, rounded to bfloat16 next (as is dS = P∘(dP − D)): the bf16 forward's e^x.
void Exp2ColumnsBf16(float* St, size_t lds, size_t rows, size_t cols, const float* sub, const float* mul) {
  Exp2ColumnsFor<true>(St, lds, rows, cols, sub, mul);
}
// The same over unscaled scores x, read as x·scale (the bf16 backward's score products then store
// their tiles in place: bf16_backward.cc).
void Exp2ColumnsBf16Scaled(float* St, size_t lds, size_t rows, size_t cols, const float* sub, const float* mul,
                           float scale) {
  Exp2ColumnsFor<true, true>(St, lds, rows, cols, sub, mul, scale);
}

// Exp2ColumnsBf16Scaled, each P also rounded to bfloat16 into Pb (ldp).
void Exp2ColumnsBf16ScaledTo(float* St, size_t lds, size_t rows, size_t cols, const float* sub, const float* mul,
                             float scale, std::uint16_t* Pb, size_t ldp) {
  Exp2ColumnsFor<true, true, true>(St, lds, rows, cols, sub, mul, scale, Pb, ldp);
}

// dS = P ∘ (dP − D) · s, in place over dPt (transposed tiles like St; D per query column).
HWY_INLINE VF GradOfScores(VF p, VF dp, VF dd, VF s) { return hn::Mul(hn::Mul(p, hn::Sub(dp, dd)), s); }

// The same dS, not stored: rounded to bfloat16 into its rows dSb (ldp) and into pairs of rows dSv
// (element [j/2][c][0] row j's, [1] row j + 1's; ldv pairs a pair of rows). rows even.
void SoftmaxGradToBf16(const float* Pt, const float* dPt, size_t ld, size_t rows, size_t cols, const float* D,
                       float scale, std::uint16_t* dSb, size_t ldp, std::uint16_t* dSv, size_t ldv) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF s = hn::Set(d, scale);
  for (size_t c = 0; c < cols; c += L) {
    const VF dd = hn::LoadU(d, D + c);
    for (size_t j = 0; j < rows; j += 2) {
#if HWY_TARGET == HWY_AVX3
      __m512i word = _mm512_setzero_si512();
      for (size_t k = 0; k < 2; ++k) {
        const __m256i ds =
            RoundToBf16(GradOfScores(hn::LoadU(d, Pt + (j + k) * ld + c), hn::LoadU(d, dPt + (j + k) * ld + c), dd, s));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dSb + (j + k) * ldp + c), ds);
        word = _mm512_or_si512(word, _mm512_slli_epi32(_mm512_cvtepu16_epi32(ds), static_cast<unsigned>(16 * k)));
      }
      _mm512_storeu_si512(dSv + ((j / 2) * ldv + c) * 2, word);
#else  // (not reached: AVX-512 BF16 implies that target)
      for (size_t k = 0; k < 2; ++k)
        StoreBf16(GradOfScores(hn::LoadU(d, Pt + (j + k) * ld + c), hn::LoadU(d, dPt + (j + k) * ld + c), dd, s),
                  dSb + (j + k) * ldp + c);
      bfdot::interleave_rows(dSb + j * ldp + c, dSb + (j + 1) * ldp + c, static_cast<std::int64_t>(L),
                             dSv + ((j / 2) * ldv + c) * 2);
#endif
    }
  }
}

void SoftmaxGrad(const float* Pt, float* dPt, size_t ld, size_t rows, size_t cols, const float* D,
                 float scale) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF s = hn::Set(d, scale);
  for (size_t c = 0; c < cols; c += L) {
    const VF dd = hn::LoadU(d, D + c);
    for (size_t j = 0; j < rows; ++j) {
      const VF p = hn::LoadU(d, Pt + j * ld + c);
      const VF dp = hn::LoadU(d, dPt + j * ld + c);
      hn::StoreU(GradOfScores(p, dp, dd, s), d, dPt + j * ld + c);
    }
  }
}

// Row-layout variants for tiles S[rows][lds] with one query per row (the backward's key-block
// pass, whose K and V tiles are packed once and whose Q and dO are read in place):
// S[r][c] = e^(S[r][c] − sub[r]) · mul[r] over cols (a multiple of the lane count; mul may be
// null for 1; a caller passes sub = +inf for a fully masked row, so the row becomes 0).
template <bool kForBf16>
HWY_INLINE void Exp2RowsFor(float* S, size_t lds, size_t rows, size_t cols, const float* sub, const float* mul) {
  const DF d;
  const size_t L = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    const VF s = hn::Set(d, sub[r]);
    float* row = S + r * lds;
    if (mul) {
      const VF f = hn::Set(d, mul[r]);
      for (size_t c = 0; c < cols; c += L)
        hn::StoreU(hn::Mul(ExpDiff<DF, kForBf16>(d, hn::LoadU(d, row + c), s), f), d, row + c);
    } else {
      for (size_t c = 0; c < cols; c += L) hn::StoreU(ExpDiff<DF, kForBf16>(d, hn::LoadU(d, row + c), s), d, row + c);
    }
  }
}
void Exp2Rows(float* S, size_t lds, size_t rows, size_t cols, const float* sub, const float* mul) {
  Exp2RowsFor<false>(S, lds, rows, cols, sub, mul);
}
// The bf16 forward's probs output, with its softmax's e^x (SoftmaxUpdateRowsBf16).
void Exp2RowsBf16(float* S, size_t lds, size_t rows, size_t cols, const float* sub, const float* mul) {
  Exp2RowsFor<true>(S, lds, rows, cols, sub, mul);
}

// dS[r][c] = P[r][c] · (dP[r][c] − D[r]) · scale, in place over dP (row layout, see Exp2Rows).
void SoftmaxGradRows(const float* P, float* dP, size_t ld, size_t rows, size_t cols, const float* D,
                     float scale) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF s = hn::Set(d, scale);
  for (size_t r = 0; r < rows; ++r) {
    const VF dd = hn::Set(d, D[r]);
    for (size_t c = 0; c < cols; c += L) {
      const VF p = hn::LoadU(d, P + r * ld + c);
      const VF dp = hn::LoadU(d, dP + r * ld + c);
      hn::StoreU(hn::Mul(hn::Mul(p, hn::Sub(dp, dd)), s), d, dP + r * ld + c);
    }
  }
}

// Row sums in kRowChains chains (key c in chain c mod 16): kRowVectors vectors a row.
constexpr size_t kRowChains = 16;
constexpr size_t kRowVectors = kRowChains / HWY_LANES(float);

#if HWY_TARGET != HWY_SCALAR
// The first n (<= 4) floats of p in a 4-lane vector (0 past them), and back.
HWY_INLINE hn::Vec<hn::Full128<float>> LoadFirst(const float* p, size_t n) {
  HWY_ALIGN float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (size_t i = 0; i < n; ++i) x[i] = p[i];
  return hn::Load(hn::Full128<float>(), x);
}
HWY_INLINE void StoreFirst(hn::Vec<hn::Full128<float>> v, float* p, size_t n) {
  HWY_ALIGN float x[4];
  hn::Store(v, hn::Full128<float>(), x);
  for (size_t i = 0; i < n; ++i) p[i] = x[i];
}

// The sums of four rows' chains (sum[r][v] lane i: chain v·L + i of row r) by the tree above
// (Sums4), lane r for row r: Across4 sums each block of four chains, the blocks then meet as
// (B0 + B2) + (B1 + B3) — by halving over the vectors, then BlockReduce within the last one.
HWY_INLINE hn::Vec<hn::Full128<float>> Sums4(DF d, const VF (&sum)[4][kRowVectors]) {
  VF x[kRowVectors];
  for (size_t v = 0; v < kRowVectors; ++v) x[v] = Across4(d, sum[0][v], sum[1][v], sum[2][v], sum[3][v], AddOp());
  return BlockReduce(d, HalvingVectorSum(x), AddOp());
}
#else
// The scalar target: sum[0][c] is chain c of the one row; Sums4's tree written out.
HWY_INLINE float ChainsSum(const VF (&chains)[kRowVectors]) {
  float b[4];
  for (size_t k = 0; k < 4; ++k)
    b[k] = (hn::GetLane(chains[4 * k]) + hn::GetLane(chains[4 * k + 2])) +
           (hn::GetLane(chains[4 * k + 1]) + hn::GetLane(chains[4 * k + 3]));
  return (b[0] + b[2]) + (b[1] + b[3]);
}
#endif

// R rows of SoftmaxUpdateRows side by side: R independent chains keep the units busy where one
// row waits on each step's latency. On vector targets the per-row statistics go four rows at a
// time (a row left over takes three empty rows beside it): the row maxima and sums reduced across
// lanes together (Reduce4, Sums4), and m, alpha and l updated as one 4-lane vector, where a row at
// a time pays a lane reduction, a scalar e^x and their latencies per row (the decode's 8-row GQA
// tiles of 64 keys are much of that work). The sums are Sums4's, so the same bits on every target.
// kScaled: S holds unscaled scores x, and each is read as t = x·s (one rounded multiply, where it
// is read, both times: the same t as a product that wrote x·s).
// kToBf16 (AVX-512 only): P goes to Pb[r][c] rounded to bfloat16 (StoreBf16) instead of back to S.
template <size_t R, bool kForBf16, bool kScaled = false, bool kToBf16 = false>
HWY_INLINE void SoftmaxRowsTogether(DF d, float* S, size_t lds, size_t padded, float* m, float* l, float* alpha,
                                    float s = 1.0f, std::uint16_t* Pb = nullptr, size_t ldp = 0, bool fold = false) {
  const size_t L = hn::Lanes(d);
  const VF sv = hn::Set(d, s);
  const auto score = [&](const float* at) HWY_ATTR {
    const VF x = hn::LoadU(d, at);
    return kScaled ? hn::Mul(x, sv) : x;
  };
  VF mx[R], mu[R], sum[4][kRowVectors];
  HWY_ALIGN float m_new[4], m_use[4];
  for (size_t r = 0; r < R; ++r) mx[r] = hn::Set(d, -INFINITY);
  // kScaled: the maximum of the x, then scaled: x -> x·s rounded is monotone for s > 0, so the
  // largest x·s is the largest x times s (NaN, kept by Max as the largest x, too). Only a maximum
  // of zero can differ, in its sign (x of both signs that underflow to ±0), and e^(t − m) and
  // m + log l are the same for m = ±0.
  for (size_t c = 0; c < padded; c += L)
    for (size_t r = 0; r < R; ++r) mx[r] = hn::Max(mx[r], hn::LoadU(d, S + r * lds + c));
  if constexpr (kScaled)
    for (size_t r = 0; r < R; ++r) mx[r] = hn::Mul(mx[r], sv);
#if HWY_TARGET != HWY_SCALAR
  const hn::Full128<float> d4;
  const auto old_m = LoadFirst(m, R);
  VF mx4[4];  // the rows' maxima vectors, -inf for the rows past R
  for (size_t r = 0; r < 4; ++r) mx4[r] = r < R ? mx[r] : hn::Set(d, -INFINITY);
  const auto mn = hn::Max(old_m, Reduce4(d, mx4[0], mx4[1], mx4[2], mx4[3], MaxOp()));
  hn::Store(mn, d4, m_new);
  hn::Store(hn::IfThenZeroElse(hn::Eq(mn, hn::Set(d4, -INFINITY)), mn), d4, m_use);  // the guard below
#else
  static_assert(R == 1, "the scalar target goes row by row");
  m_new[0] = std::max(m[0], hn::GetLane(mx[0]));
  m_use[0] = m_new[0] == -INFINITY ? 0.0f : m_new[0];  // the fully-masked guard of SoftmaxUpdate
#endif
  for (size_t r = 0; r < 4; ++r)
    for (size_t v = 0; v < kRowVectors; ++v) sum[r][v] = hn::Zero(d);
  // fold (bf16, scaled, where the caller allows it): ExpFolded (exp2-inl.h) where every row of the
  // call has |m| <= kFoldLimit; beyond it ExpBelowMax's three operations.
  bool folding = kForBf16 && kScaled && fold;
  for (size_t r = 0; r < R; ++r) folding = folding && std::fabs(m_use[r]) <= kFoldLimit;
  const auto exp_pass = [&](auto folded) HWY_ATTR {
    constexpr bool kFold = decltype(folded)::value;
    const VF c1 = hn::Set(d, s * kLog2E);
    for (size_t r = 0; r < R; ++r) mu[r] = hn::Set(d, kFold ? -m_use[r] * kLog2E : m_use[r]);
    for (size_t c = 0, v = 0; c < padded; c += L, v = (v + 1) % kRowVectors)
      for (size_t r = 0; r < R; ++r) {
        const VF p = kFold ? ExpFolded<DF, true>(d, hn::LoadU(d, S + r * lds + c), c1, mu[r])
                           : ExpBelowMax<DF, kForBf16>(d, score(S + r * lds + c), mu[r]);
        if constexpr (kToBf16) StoreBf16(p, Pb + r * ldp + c);
        else hn::StoreU(p, d, S + r * lds + c);
        sum[r][v] = hn::Add(sum[r][v], p);
      }
  };
  if (folding) exp_pass(std::true_type{});
  else exp_pass(std::false_type{});
#if HWY_TARGET != HWY_SCALAR
  const auto a = ExpBelowMax<decltype(d4), kForBf16>(d4, old_m, hn::Load(d4, m_use));
  const auto l_new = FusedMulAdd(a, LoadFirst(l, R), Sums4(d, sum));
  StoreFirst(a, alpha, R);
  StoreFirst(l_new, l, R);
  StoreFirst(hn::Load(d4, m_new), m, R);
#else
  const float a = hn::GetLane(ExpBelowMax<DF, kForBf16>(d, hn::Set(d, m[0]), hn::Set(d, m_use[0])));
  alpha[0] = a;
  l[0] = hn::GetLane(FusedMulAdd(hn::Set(d, a), hn::Set(d, l[0]), hn::Set(d, ChainsSum(sum[0]))));
  m[0] = m_new[0];
#endif
}

// Online softmax over a score tile in row layout, S[rows][lds] (one query per row, keys along
// the row; the bf16 forward's layout): the same update as SoftmaxUpdate per row, with the max
// and sum reduced across lanes. Columns [cols, round_up(cols, 16)) are treated as -inf and come
// out as P = 0, so a ragged tile is padded to whole sets of the 16 chains (lds holds them).
template <bool kForBf16, bool kScaled = false, bool kToBf16 = false>
HWY_INLINE void SoftmaxUpdateRowsFor(float* S, size_t lds, size_t rows, size_t cols, float* m, float* l, float* alpha,
                                     float s = 1.0f, std::uint16_t* Pb = nullptr, size_t ldp = 0, bool fold = false) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const size_t full = cols / L * L, padded = (cols + kRowChains - 1) / kRowChains * kRowChains;
  const auto tail = hn::FirstN(d, cols - full);
  for (size_t r = 0; r < rows; ++r) {
    if (full < cols)
      hn::StoreU(hn::IfThenElse(tail, hn::LoadU(d, S + r * lds + full), hn::Set(d, -INFINITY)), d, S + r * lds + full);
    for (size_t c = full < cols ? full + L : full; c < padded; c += L) hn::StoreU(hn::Set(d, -INFINITY), d, S + r * lds + c);
  }
  const auto pb = [&](size_t r) { return kToBf16 ? Pb + r * ldp : nullptr; };
  size_t r = 0;
#if HWY_TARGET != HWY_SCALAR
  for (; r + 4 <= rows; r += 4)
    SoftmaxRowsTogether<4, kForBf16, kScaled, kToBf16>(d, S + r * lds, lds, padded, m + r, l + r, alpha + r, s,
                                                       pb(r), ldp, fold);
  switch (rows - r) {
    case 1: SoftmaxRowsTogether<1, kForBf16, kScaled, kToBf16>(d, S + r * lds, lds, padded, m + r, l + r, alpha + r, s, pb(r), ldp, fold); break;
    case 2: SoftmaxRowsTogether<2, kForBf16, kScaled, kToBf16>(d, S + r * lds, lds, padded, m + r, l + r, alpha + r, s, pb(r), ldp, fold); break;
    case 3: SoftmaxRowsTogether<3, kForBf16, kScaled, kToBf16>(d, S + r * lds, lds, padded, m + r, l + r, alpha + r, s, pb(r), ldp, fold); break;
    default: break;
  }
#else
  (void)pb;
  for (; r < rows; ++r)
    SoftmaxRowsTogether<1, kForBf16, kScaled>(d, S + r * lds, lds, padded, m + r, l + r, alpha + r, s, nullptr, 0,
                                              fold);
#endif
}
void SoftmaxUpdateRows(float* S, size_t lds, size_t rows, size_t cols, float* m, float* l, float* alpha) {
  SoftmaxUpdateRowsFor<false>(S, lds, rows, cols, m, l, alpha);
}
// P rounded to bfloat16 next (the bf16 forward): e^x by Exp2Fraction's degree-3 polynomial.
void SoftmaxUpdateRowsBf16(float* S, size_t lds, size_t rows, size_t cols, float* m, float* l, float* alpha) {
  SoftmaxUpdateRowsFor<true>(S, lds, rows, cols, m, l, alpha);
}
// The same over unscaled scores x, read as x·s (the bf16 forward's products then store their tiles
// in place: bf16_forward.cc).
void SoftmaxUpdateRowsBf16Scaled(float* S, size_t lds, size_t rows, size_t cols, float* m, float* l, float* alpha,
                                 float s, bool fold) {
  SoftmaxUpdateRowsFor<true, true>(S, lds, rows, cols, m, l, alpha, s, nullptr, 0, fold);
}

// The same, P rounded to bfloat16 into Pb[r][c] for c < round_up(cols, 16) (ldp) instead of left in
// S (the bf16 forward's whole tiles, whose P goes straight to P·V): the bits of softmax_update_rows
// then to_bf16, without P's float32 store and reload. scaled: S holds x, read as x·s.
void SoftmaxUpdateRowsToBf16(float* S, size_t lds, size_t rows, size_t cols, float* m, float* l, float* alpha,
                             float s, bool scaled, bool fold, std::uint16_t* Pb, size_t ldp) {
#if HWY_TARGET == HWY_AVX3
  if (scaled) return SoftmaxUpdateRowsFor<true, true, true>(S, lds, rows, cols, m, l, alpha, s, Pb, ldp, fold);
  SoftmaxUpdateRowsFor<true, false, true>(S, lds, rows, cols, m, l, alpha, 1.0f, Pb, ldp);
#else  // (not reached: AVX-512 BF16 implies this target) the two steps
  if (scaled) SoftmaxUpdateRowsFor<true, true>(S, lds, rows, cols, m, l, alpha, s, nullptr, 0, fold);
  else SoftmaxUpdateRowsFor<true>(S, lds, rows, cols, m, l, alpha);
  const size_t padded = (cols + kRowChains - 1) / kRowChains * kRowChains;
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < padded; c += hn::Lanes(DF())) StoreBf16(hn::LoadU(DF(), S + r * lds + c), Pb + r * ldp + c);
#endif
}

// Soft-capping of a run of n scores, x → c·tanh(x / c) (softcap-inl.h), and when dcap is given its
// derivative dcap = 1 − tanh²(x / c) for the backward (score_transforms.h); whole vectors, the tail
// by a masked load and store. Each lane is a function of its own value only, so a score gets the
// same bits wherever it lies in a run or a tile.
void Softcap(float* x, size_t n, float c, float* dcap) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF cap = hn::Set(d, c), inv = hn::Set(d, 1.0f / c), one = hn::Set(d, 1.0f);
  auto step = [&](VF v, auto store) {
    const VF t = CapTanh(d, v, inv);
    store(hn::Mul(cap, t), x);
    if (dcap) store(hn::NegMulAdd(t, t, one), dcap);
  };
  size_t i = 0;
  for (; i + L <= n; i += L, x += L, dcap = dcap ? dcap + L : nullptr)
    step(hn::LoadU(d, x), [&](VF v, float* to) { hn::StoreU(v, d, to); });
  if (i < n) {
    const auto m = hn::FirstN(d, n - i);
    step(hn::MaskedLoad(m, d, x), [&](VF v, float* to) { hn::BlendedStore(v, m, d, to); });
  }
}

// dst[i] = src[i] · f for i < n (an output row divided by its softmax sum): whole vectors, the
// tail masked. Each element one multiply, so the bits do not depend on the target.
void ScaledCopy(const float* src, float f, float* dst, size_t n) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF s = hn::Set(d, f);
  size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Mul(hn::LoadU(d, src + i), s), d, dst + i);
  if (i < n) {
    const auto m = hn::FirstN(d, n - i);
    hn::BlendedStore(hn::Mul(hn::MaskedLoad(m, d, src + i), s), m, d, dst + i);
  }
}

// out[c·ld + r] = rows[r][c]·f for r < n, c < d (rows of unit stride). On AVX-512 by 16 × 16
// blocks in registers: each row's 16 values times f (the same products as one at a time), then
// transpose16_words (transpose16.h); other rows and columns one value at a time.
void TransposeScaled(const float* const* rows, size_t n, size_t d, float f, float* out, size_t ld) {
  size_t r0 = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  const __m512 s = _mm512_set1_ps(f);
  for (; r0 + 16 <= n; r0 += 16) {
    size_t c0 = 0;
    for (; c0 + 16 <= d; c0 += 16) {
      __m512i r[16], w[16];
      for (int x = 0; x < 16; ++x) r[x] = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(rows[r0 + x] + c0), s));
      transpose16_words(r, w);
      for (int c = 0; c < 16; ++c) _mm512_storeu_si512(out + (c0 + c) * ld + r0, w[c]);
    }
    for (; c0 < d; ++c0)
      for (size_t x = r0; x < r0 + 16; ++x) out[c0 * ld + x] = rows[x][c0] * f;
  }
#endif
  for (; r0 < n; ++r0)
    for (size_t c = 0; c < d; ++c) out[c * ld + r0] = rows[r0][c] * f;
}

// d[r] = Σ_c a[r][c]·b[r][c] for r < 8, c < n, each row's sum one float64 chain in column order:
// the product of two float32 values is exact in float64, then one rounding an add, as the scalar
// loop below takes them. On AVX-512 the 8 rows side by side in one vector of doubles, each 8 × 8
// block of a and b transposed in registers (unpacks, then 128-bit lane swaps) so that vector k
// holds column c + k of the 8 rows.
void RowDots8(const float* const* a, const float* const* b, size_t n, double* d) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t c = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  const auto columns = [](const float* const* rows, size_t c0, __m256* x) HWY_ATTR {
    __m256 t[8], u[8];
    for (int r = 0; r < 8; ++r) x[r] = _mm256_loadu_ps(rows[r] + c0);
    for (int r = 0; r < 8; r += 2) {
      t[r] = _mm256_unpacklo_ps(x[r], x[r + 1]);
      t[r + 1] = _mm256_unpackhi_ps(x[r], x[r + 1]);
    }
    for (int g = 0; g < 8; g += 4) {
      u[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
      u[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
      u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
      u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {
      x[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
      x[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
  };
  __m512d sum = _mm512_setzero_pd();
  for (; c + 8 <= n; c += 8) {
    __m256 x[8], y[8];
    columns(a, c, x);
    columns(b, c, y);
    for (int k = 0; k < 8; ++k) sum = _mm512_add_pd(sum, _mm512_mul_pd(_mm512_cvtps_pd(x[k]), _mm512_cvtps_pd(y[k])));
  }
  _mm512_storeu_pd(acc, sum);
#endif
  for (; c < n; ++c)
    for (size_t r = 0; r < 8; ++r) acc[r] += static_cast<double>(a[r][c]) * static_cast<double>(b[r][c]);
  for (size_t r = 0; r < 8; ++r) d[r] = acc[r];
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace attnscale::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
