// The bf16 products on CPUs without a bfloat16 dot instruction (bf16_kernels.h's Path::widened):
// bfdot::gemm's contract, each pair widened to float32 in registers and multiplied by float32
// multiply-adds, compiled once per Highway target (AVX2, AVX-512 without BF16, the scalar
// emulation) and dispatched like kernels.cc.
//
// A bfloat16 is the upper half of a float32, so widening is exact and costs one integer operation.
// A 32-bit word of Bp holds the pair (B(2kk, n) in its low half, B(2kk+1, n) in its high half):
//   B(2kk, n) = float(word << 16),   B(2kk+1, n) = float(word & 0xFFFF0000).
// Per pair row kk, a tile of MR rows x NR vectors loads NR words vectors twice (shifted, then
// masked) and does 2·MR·NR multiply-adds, one broadcast of A a row and half-step. A's rows are
// widened into a float32 panel once per MR rows, so its broadcasts are plain loads.
//
// Every element C(m, n) is one chain, acc = fma(A(m, 2kk), B(2kk, n), acc) then the same with
// 2kk + 1, for kk = 0, 1, ...: the result does not depend on the tile an element falls in, nor on
// the threads (the bf16 backward's bitwise determinism rests on that).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/bf16_widened.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnscale/tensor.h"
#include "common/bfloat_rows.h"

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::bfdot::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;

// Rows and vectors of a tile: 6 x 2 on AVX2 (12 accumulators, two B vectors, one broadcast and
// the mask: its 16 registers), 6 x 4 on 16-lane targets (32 registers).
constexpr int kRows = 6;
constexpr int kVectors = HWY_LANES(float) >= 16 ? 4 : 2;

// C[MR x cols] (cols <= NR·lanes) = init + out_scale · Aw·B for the MR widened rows aw[i·K + k].
template <int MR, int NR>
HWY_INLINE void Tile(std::size_t K, const float* aw, const std::uint32_t* B32, std::size_t ldb, float* C,
                     std::size_t ldc, std::size_t cols, int mode, const float* row_scale, float out_scale) {
  const DF df;
  const DU du;
  const std::size_t L = hn::Lanes(df);
  const auto high = hn::Set(du, 0xFFFF0000u);
  VF acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc[i][r] = hn::Zero(df);
  for (std::size_t kk = 0; kk < K / 2; ++kk) {
    const std::uint32_t* words = B32 + kk * ldb;
    VF b[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) b[r] = hn::BitCast(df, hn::ShiftLeft<16>(hn::LoadU(du, words + r * L)));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const VF a = hn::Set(df, aw[i * K + 2 * kk]);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[i][r] = hn::MulAdd(a, b[r], acc[i][r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) b[r] = hn::BitCast(df, hn::And(hn::LoadU(du, words + r * L), high));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const VF a = hn::Set(df, aw[i * K + 2 * kk + 1]);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[i][r] = hn::MulAdd(a, b[r], acc[i][r]);
    }
  }
  const VF s = hn::Set(df, out_scale);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      float* c = C + i * ldc + r * L;
      const std::size_t left = cols > r * L ? cols - r * L : 0;
      if (left == 0) continue;
      const auto mask = hn::FirstN(df, left);
      VF v = out_scale == 1.0f ? acc[i][r] : hn::Mul(acc[i][r], s);
      if (mode != 0) {
        VF old = hn::MaskedLoad(mask, df, c);
        if (mode == 2) old = hn::Mul(old, hn::Set(df, row_scale[i]));
        v = hn::Add(old, v);
      }
      if (left >= L) hn::StoreU(v, df, c);
      else hn::BlendedStore(v, mask, df, c);
    }
}

template <int MR>
void Panel(std::size_t N, std::size_t K, const float* aw, const std::uint32_t* B32, std::size_t ldb, float* C,
           std::size_t ldc, int mode, const float* row_scale, float out_scale) {
  const std::size_t L = hn::Lanes(DF());
  const std::size_t wide = kVectors * L;
  std::size_t n0 = 0;
  for (; n0 + wide <= N; n0 += wide)
    Tile<MR, kVectors>(K, aw, B32 + n0, ldb, C + n0, ldc, wide, mode, row_scale, out_scale);
  // The last columns: whole vectors within ldb (a multiple of 16), stores masked to N.
  for (; n0 < N; n0 += L)
    Tile<MR, 1>(K, aw, B32 + n0, ldb, C + n0, ldc, std::min(L, N - n0), mode, row_scale, out_scale);
}

void GemmWidened(std::size_t M, std::size_t N, std::size_t K, const std::uint16_t* A, std::size_t lda,
                 const std::uint16_t* Bp, std::size_t ldb, float* C, std::size_t ldc, int mode,
                 const float* row_scale, float out_scale) {
  // The panel of widened rows: grown once per thread, then reused (no allocation per call).
  thread_local std::vector<float> panel;
  if (panel.size() < kRows * K) panel.resize(kRows * K);
  float* aw = panel.data();
  const auto* B32 = reinterpret_cast<const std::uint32_t*>(Bp);
  for (std::size_t m = 0; m < M; m += kRows) {
    const std::size_t rows = std::min<std::size_t>(kRows, M - m);
    for (std::size_t i = 0; i < rows; ++i)
      f32_row(A + (m + i) * lda, static_cast<std::int64_t>(K), aw + i * K);  // exact: the bits shifted up
    const float* rs = row_scale ? row_scale + m : nullptr;
    float* c = C + m * ldc;
    switch (rows) {
      case 6: Panel<6>(N, K, aw, B32, ldb, c, ldc, mode, rs, out_scale); break;
      case 5: Panel<5>(N, K, aw, B32, ldb, c, ldc, mode, rs, out_scale); break;
      case 4: Panel<4>(N, K, aw, B32, ldb, c, ldc, mode, rs, out_scale); break;
      case 3: Panel<3>(N, K, aw, B32, ldb, c, ldc, mode, rs, out_scale); break;
      case 2: Panel<2>(N, K, aw, B32, ldb, c, ldc, mode, rs, out_scale); break;
      default: Panel<1>(N, K, aw, B32, ldb, c, ldc, mode, rs, out_scale); break;
    }
  }
}

// Rows r and r + 1 of src rounded to bf16 (tensor.h's to_bf16: to nearest even, NaN kept and
// quietened) into one row of pair words, dst[c] = bf16(even[c]) | bf16(odd[c]) << 16 for c < cols;
// odd null gives zeros there. The rounding in 32-bit lanes: u + 0x7FFF + ((u >> 16) & 1), high half.
void PairRow(const float* even, const float* odd, std::size_t cols, std::uint32_t* dst) {
  const DF df;
  const DU du;
  const std::size_t L = hn::Lanes(df);
  const auto round = [&](const float* p) {
    const auto u = hn::BitCast(du, hn::LoadU(df, p));
    const auto nan = hn::Gt(hn::And(u, hn::Set(du, 0x7FFFFFFFu)), hn::Set(du, 0x7F800000u));
    const auto up = hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
    return hn::ShiftRight<16>(hn::IfThenElse(nan, hn::Or(u, hn::Set(du, 0x400000u)), up));
  };
  std::size_t c = 0;
  for (; c + L <= cols; c += L) {
    const auto lo = round(even + c);
    const auto words = odd ? hn::Or(lo, hn::ShiftLeft<16>(round(odd + c))) : lo;
    hn::StoreU(words, du, dst + c);
  }
  for (; c < cols; ++c) {
    const std::uint32_t lo = to_bf16(even[c]).bits, hi = odd ? to_bf16(odd[c]).bits : 0u;
    dst[c] = lo | hi << 16;
  }
}

}  // namespace attnscale::detail::bfdot::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "attention/bf16_kernels.h"
#include "attention/kernels.h"

namespace attnscale::detail::bfdot {
HWY_EXPORT(GemmWidened);
HWY_EXPORT(PairRow);

void gemm_widened(std::size_t M, std::size_t N, std::size_t K, const std::uint16_t* A, std::size_t lda,
                  const std::uint16_t* Bp, std::size_t ldb, float* C, std::size_t ldc, int mode,
                  const float* row_scale, float out_scale) {
  simd::init_target_from_env();
  HWY_DYNAMIC_DISPATCH(GemmWidened)(M, N, K, A, lda, Bp, ldb, C, ldc, mode, row_scale, out_scale);
}

void pair_row(const float* even, const float* odd, std::size_t cols, std::uint32_t* dst) {
  simd::init_target_from_env();
  HWY_DYNAMIC_DISPATCH(PairRow)(even, odd, cols, dst);
}

}  // namespace attnscale::detail::bfdot
#endif  // HWY_ONCE
