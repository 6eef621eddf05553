// The bf16 GEMM paths (see bf16_kernels.h; the widened one is in bf16_widened.cc) and their
// run-time detection. The AVX-512 BF16 and AMX kernels are compiled with target attributes, so the
// library itself needs no -m flags and runs anywhere; they are called only after detection says the
// CPU and OS support them.
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "attention/bf16_kernels.h"
#include "attention/transpose16.h"
#include "common/bfloat_rows.h"
#include "common/cpu_model.h"
#include "common/prefetch.h"
#include "attnscale/error.h"

namespace attnscale::detail::bfdot {
namespace {

float widen(std::uint16_t x) { return from_bf16(bf16{x}); }  // exact (tensor.h)

void finish(float* c, float acc, int mode, float rs, float out_scale) {
  acc *= out_scale;
  *c = mode == 0 ? acc : mode == 1 ? *c + acc : rs * *c + acc;
}

// Portable: the same contract in plain loops (float32 products of bf16 values are exact, so this
// matches the SIMD paths up to summation order).
void gemm_portable(std::size_t M, std::size_t N, std::size_t K, const std::uint16_t* A, std::size_t lda,
                   const std::uint16_t* Bp, std::size_t ldb, float* C, std::size_t ldc, int mode,
                   const float* row_scale, float out_scale) {
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n) {
      float acc = 0;
      for (std::size_t k = 0; k < K; ++k) acc += widen(A[m * lda + k]) * widen(Bp[((k / 2) * ldb + n) * 2 + k % 2]);
      finish(C + m * ldc + n, acc, mode, row_scale ? row_scale[m] : 1.0f, out_scale);
    }
}

#if defined(__x86_64__)
#define ATTNSCALE_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// The first min(n, 16) of 16 float32 lanes (a row's columns at a ragged edge).
inline __mmask16 first_lanes(std::size_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// One MR x (4 x 16) tile: acc[i][r] += A(m0+i, 2kk..2kk+1) · Bp[kk][n0 + 16r .. +16][0..1].
template <int MR>
ATTNSCALE_BF16_TARGET void tile_avx512(std::size_t K, const std::uint16_t* A, std::size_t lda, const std::uint16_t* Bp,
                                      std::size_t ldb, float* C, std::size_t ldc, std::size_t cols, int mode,
                                      const float* row_scale, float out_scale) {
  // Every loop below has a constant trip count and is unrolled, so the MR x 4 accumulators stay
  // in registers (a loop the compiler keeps makes it spill them to the stack every step).
  __m512 acc[MR][4];
  __mmask16 mask[4];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    const std::size_t left = cols > 16u * r ? cols - 16u * r : 0;
    mask[r] = first_lanes(left);
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) acc[i][r] = _mm512_setzero_ps();
  // C's lines, read back at the end when accumulating (mode 1, the backward's), requested now: the
  // products take long enough for them to arrive from L3, where the dQᵀ partials (32 KiB a query
  // block) are (H = 8, N = 4096, d = 128: the bf16 backward 11% faster, docs/performance.md). The
  // forward's output rows (mode 2) are in L1 or L2 already.
  if (mode == 1)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r)
        if (mask[r]) prefetch_line(C + i * ldc + 16 * r, CacheLevel::near);
  for (std::size_t kk = 0; kk < K / 2; ++kk) {
    __m512bh b[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
      b[r] = (__m512bh)_mm512_maskz_loadu_epi32(mask[r], Bp + (kk * ldb + 16 * r) * 2);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      std::int32_t pair;
      std::memcpy(&pair, A + i * lda + 2 * kk, 4);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], a, b[r]);
    }
  }
  // Each element finished as finish() above does it, a multiply and an add rounded one after the
  // other, in every column and every instantiation: the file is compiled with -ffp-contract=off
  // (src/CMakeLists.txt), where GCC had fused some of these pairs into one multiply-add and not others.
  const __m512 s = _mm512_set1_ps(out_scale);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      float* c = C + i * ldc + 16 * r;
      __m512 v = out_scale == 1.0f ? acc[i][r] : _mm512_mul_ps(acc[i][r], s);  // P·V's scale is 1
      if (mode != 0) {
        __m512 old = _mm512_maskz_loadu_ps(mask[r], c);
        if (mode == 2) old = _mm512_mul_ps(old, _mm512_set1_ps(row_scale[i]));
        v = _mm512_add_ps(old, v);
      }
      _mm512_mask_storeu_ps(c, mask[r], v);  // an empty mask stores nothing
    }
}

// Ahead's lines asked for over a product's `steps` steps (its tiles or blocks): step i (from 0)
// asks for lines [lines·i / steps, lines·(i + 1) / steps).
class AheadFeed {
 public:
  AheadFeed(const Ahead& ahead, std::size_t steps)
      : p_(static_cast<const char*>(ahead.p)), lines_((ahead.bytes + 63) / 64), steps_(steps) {}
  void step() {
    if (lines_ == 0) return;
    const std::size_t to = lines_ * ++step_ / steps_;
    for (; fed_ < to; ++fed_) prefetch_line(p_ + 64 * fed_, CacheLevel::far);
  }

 private:
  const char* p_;
  std::size_t lines_, steps_, step_ = 0, fed_ = 0;
};

ATTNSCALE_BF16_TARGET void gemm_avx512(std::size_t M, std::size_t N, std::size_t K, const std::uint16_t* A,
                                       std::size_t lda, const std::uint16_t* Bp, std::size_t ldb, float* C,
                                       std::size_t ldc, int mode, const float* row_scale, float out_scale,
                                       const Ahead& ahead) {
  AheadFeed feed(ahead, (N + 63) / 64 * ((M + 3) / 4));  // a step before each tile
  for (std::size_t n0 = 0; n0 < N; n0 += 64) {
    const std::size_t cols = std::min<std::size_t>(64, N - n0);
    std::size_t m = 0;
    for (; m + 4 <= M; m += 4) {
      feed.step();
      tile_avx512<4>(K, A + m * lda, lda, Bp + n0 * 2, ldb, C + m * ldc + n0, ldc, cols, mode,
                     row_scale ? row_scale + m : nullptr, out_scale);
    }
    if (m < M) feed.step();
    for (; m < M; ++m)
      tile_avx512<1>(K, A + m * lda, lda, Bp + n0 * 2, ldb, C + m * ldc + n0, ldc, cols, mode,
                     row_scale ? row_scale + m : nullptr, out_scale);
  }
}

// AMX: a block of C of up to 32 x 32 float32 accumulates in tiles 0-3 (2 x 2 tiles of 16 x 16:
// tile 0 rows 0-15 columns 0-15, 1 rows 0-15 columns 16-31, 2 and 3 the rows 16-31), from A tiles 4
// and 5 (16 rows x 32 bf16 each, the block's two row halves) and B tiles 6 and 7 (16 pair-rows x 16
// columns each, its two column halves): each tile loaded serves two tdpbf16ps. Every tile is
// configured 16 x 64 bytes, and the block's edge rows and columns past M and N are computed from the
// operands' padding (bf16_kernels.h) and not written: a block's tiles are stored to a scratch and
// merged into C by AVX-512 vectors with the mode (masked at a ragged edge), or loaded from and
// stored to C in place (gemm_amx), so one configuration serves every shape.
#define ATTNSCALE_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

ATTNSCALE_AMX_TARGET void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  // ldtilecfg by hand, its operand the whole configuration: GCC 12's _tile_loadconfig names only
  // its first 8 bytes as read, and where it was inlined into a caller the stores of the rows and
  // widths above were dropped as dead (the tiles then unconfigured: SIGILL at the first tile op).
  asm volatile("ldtilecfg %0" : : "m"(cfg));
}

// C[i][0, cols) (i < rows) merged with out_scale · tile (16 x 16, rows 64 bytes apart) as finish()
// merges one element: a multiply and an add rounded one after the other (-ffp-contract=off), the
// same operations in a whole tile (unmasked, unrolled) as at a ragged edge. One instantiation per
// mode and scaling: with the mode tested inside the row loop, the forward's 128 x 128 x 128 P·V
// (mode 2) took 1.14-1.16x its time now (docs/performance.md, the Intel AMX machine).
template <int kMode, bool kScaled>
ATTNSCALE_AMX_TARGET inline __m512 merged(const float* tile_row, __m512 old, __m512 s, float rs) {
  __m512 v = _mm512_load_ps(tile_row);
  if (kScaled) v = _mm512_mul_ps(v, s);
  if (kMode == 0) return v;
  if (kMode == 2) old = _mm512_mul_ps(old, _mm512_set1_ps(rs));
  return _mm512_add_ps(old, v);
}

template <int kMode, bool kScaled>
ATTNSCALE_AMX_TARGET void merge_tile(const float* tile, std::size_t rows, std::size_t cols, float* C,
                                     std::size_t ldc, const float* row_scale, float out_scale) {
  const __m512 s = _mm512_set1_ps(out_scale);
  if (rows == 16 && cols == 16) {
#pragma GCC unroll 16
    for (std::size_t i = 0; i < 16; ++i) {
      const __m512 old = kMode == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(C + i * ldc);
      _mm512_storeu_ps(C + i * ldc, merged<kMode, kScaled>(tile + 16 * i, old, s, kMode == 2 ? row_scale[i] : 0.0f));
    }
    return;
  }
  const __mmask16 mask = first_lanes(cols);
  for (std::size_t i = 0; i < rows; ++i) {
    const __m512 old = kMode == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, C + i * ldc);
    _mm512_mask_storeu_ps(C + i * ldc, mask,
                          merged<kMode, kScaled>(tile + 16 * i, old, s, kMode == 2 ? row_scale[i] : 0.0f));
  }
}

ATTNSCALE_AMX_TARGET void merge_tile(const float* tile, std::size_t rows, std::size_t cols, float* C, std::size_t ldc,
                                     int mode, const float* row_scale, float out_scale) {
  const bool scaled = out_scale != 1.0f;  // a multiply by 1 changes nothing
  if (mode == 0 && !scaled) merge_tile<0, false>(tile, rows, cols, C, ldc, row_scale, out_scale);
  else if (mode == 0) merge_tile<0, true>(tile, rows, cols, C, ldc, row_scale, out_scale);
  else if (mode == 1) merge_tile<1, true>(tile, rows, cols, C, ldc, row_scale, out_scale);
  else if (!scaled) merge_tile<2, false>(tile, rows, cols, C, ldc, row_scale, out_scale);
  else merge_tile<2, true>(tile, rows, cols, C, ldc, row_scale, out_scale);
}

// The tile configuration of this thread: whether it is loaded, and how many TileScopes are open.
thread_local bool tiles_configured = false;
thread_local int tile_scopes = 0;

ATTNSCALE_AMX_TARGET void ensure_tiles() {
  if (tiles_configured) return;
  configure_tiles();
  tiles_configured = true;
}

ATTNSCALE_AMX_TARGET void release_tiles() {
  _tile_release();
  tiles_configured = false;
}

// C's tile at c (rows x cols of it, the rest zero) into a 16 x 16 scratch tile.
ATTNSCALE_AMX_TARGET void load_tile(const float* c, std::size_t ldc, std::size_t rows, std::size_t cols, float* tile) {
  const __mmask16 mask = first_lanes(cols);
  for (std::size_t i = 0; i < 16; ++i)
    _mm512_store_ps(tile + 16 * i, i < rows ? _mm512_maskz_loadu_ps(mask, c + i * ldc) : _mm512_setzero_ps());
}

// Blocks of 32 x 32 in row-major order over C. Where C's new value is the tiles' sum as it stands
// (mode 1 with out_scale 1: the accumulator starts from C; mode 0 with out_scale 1: from zero), the
// tiles load and store C in place, through a scratch block only at a ragged edge; otherwise the
// tiles start from zero and merge_tile() finishes each element with the mode.
ATTNSCALE_AMX_TARGET void gemm_amx(std::size_t M, std::size_t N, std::size_t K, const std::uint16_t* A,
                                   std::size_t lda, const std::uint16_t* Bp, std::size_t ldb, float* C,
                                   std::size_t ldc, int mode, const float* row_scale, float out_scale,
                                   const Ahead& ahead) {
  ensure_tiles();
  AheadFeed feed(ahead, (N + 31) / 32 * ((M + 31) / 32));  // a step after each block
  alignas(64) float out[4][16 * 16];
  const std::size_t sa = lda * 2, sb = ldb * 4, sc = ldc * 4;  // row strides in bytes
  const bool in_place = out_scale == 1.0f && (mode == 0 || mode == 1), from_c = in_place && mode == 1;
  for (std::size_t m0 = 0; m0 < M; m0 += 32) {
    const std::size_t rows = std::min<std::size_t>(32, M - m0);
    const bool two_m = rows > 16;
    const std::uint16_t* a = A + m0 * lda;
    for (std::size_t n0 = 0; n0 < N; n0 += 32) {
      const std::size_t cols = std::min<std::size_t>(32, N - n0);
      const bool two_n = cols > 16, whole = rows == 32 && cols == 32;
      const std::uint16_t* b = Bp + n0 * 2;
      float* c = C + m0 * ldc + n0;
      // Tile t covers rows r(t) and columns q(t) of the block, at c + off(t).
      const std::size_t r0 = std::min<std::size_t>(16, rows), q0 = std::min<std::size_t>(16, cols);
      const std::size_t r[4] = {r0, r0, rows - r0, rows - r0}, q[4] = {q0, cols - q0, q0, cols - q0};
      const std::size_t off[4] = {0, 16, 16 * ldc, 16 * ldc + 16};
      if (from_c && whole) {
        _tile_loadd(0, c, sc);
        _tile_loadd(1, c + 16, sc);
        _tile_loadd(2, c + 16 * ldc, sc);
        _tile_loadd(3, c + 16 * ldc + 16, sc);
      } else if (from_c) {
        for (int t = 0; t < 4; ++t)
          if (r[t] && q[t]) load_tile(c + off[t], ldc, r[t], q[t], out[t]);
        _tile_loadd(0, out[0], 64);
        if (two_n) _tile_loadd(1, out[1], 64);
        if (two_m) _tile_loadd(2, out[2], 64);
        if (two_m && two_n) _tile_loadd(3, out[3], 64);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (std::size_t k0 = 0; k0 < K; k0 += 32) {
        const std::uint16_t* bk = b + (k0 / 2) * ldb * 2;
        _tile_loadd(4, a + k0, sa);
        _tile_loadd(6, bk, sb);
        _tile_dpbf16ps(0, 4, 6);
        if (two_n) {
          _tile_loadd(7, bk + 32, sb);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_m) {
          _tile_loadd(5, a + 16 * lda + k0, sa);
          _tile_dpbf16ps(2, 5, 6);
          if (two_n) _tile_dpbf16ps(3, 5, 7);
        }
      }
      feed.step();
      if (in_place && whole) {
        _tile_stored(0, c, sc);
        _tile_stored(1, c + 16, sc);
        _tile_stored(2, c + 16 * ldc, sc);
        _tile_stored(3, c + 16 * ldc + 16, sc);
        continue;
      }
      _tile_stored(0, out[0], 64);
      if (two_n) _tile_stored(1, out[1], 64);
      if (two_m) _tile_stored(2, out[2], 64);
      if (two_m && two_n) _tile_stored(3, out[3], 64);
      for (int t = 0; t < 4; ++t)  // in place: copied (mode 0, out_scale 1)
        if (r[t] && q[t])
          merge_tile(out[t], r[t], q[t], c + off[t], ldc, in_place ? 0 : mode,
                     row_scale ? row_scale + m0 + (t >= 2 ? 16 : 0) : nullptr, out_scale);
    }
  }
  if (tile_scopes == 0) release_tiles();
}

ATTNSCALE_BF16_TARGET void to_bf16_avx512(const float* src, std::size_t lds, std::size_t rows, std::size_t cols,
                                          std::uint16_t* dst, std::size_t ldd) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + r * ldd + c),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + r * lds + c)));
}

// Two rows at a time: each rounded to 16 bf16, widened to 32-bit lanes, the odd row shifted into
// the upper halves: 16 pairs in one store. (The zero-masked forms of the widening and the shift, with
// every lane kept, are the plain instructions; GCC 12 warns that the plain intrinsics' undefined
// pass-through vector "may be used uninitialized".)
ATTNSCALE_BF16_TARGET void to_bf16_pairs_avx512(const float* src, std::size_t lds, std::size_t rows,
                                                std::size_t pad_rows, std::size_t cols, std::uint16_t* dst,
                                                std::size_t ldd) {
  for (std::size_t r = 0; r < pad_rows; r += 2)
    for (std::size_t c = 0; c < cols; c += 16) {
      const __m512i even = r < rows ? _mm512_maskz_cvtepu16_epi32(0xFFFF, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + r * lds + c)))
                                    : _mm512_setzero_si512();
      const __m512i odd = r + 1 < rows
                              ? _mm512_maskz_cvtepu16_epi32(0xFFFF, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + (r + 1) * lds + c)))
                              : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + ((r / 2) * ldd + c) * 2, _mm512_or_si512(even, _mm512_maskz_slli_epi32(0xFFFF, odd, 16)));
    }
}

// w[i] = word w0 + i of rows[x] at lane x (i, x < 16): the rows loaded, then transpose16_words.
ATTNSCALE_BF16_TARGET inline void words16_transposed(const std::uint16_t* const* rows, std::size_t w0, __m512i* w) {
  __m512i r[16];
  for (int x = 0; x < 16; ++x) r[x] = _mm512_loadu_si512(rows[x] + 2 * w0);
  transpose16_words(r, w);
}

// out[w·ldo + x] = rows[x][w0 + w] (w, x < 16), 32-bit words.
ATTNSCALE_BF16_TARGET void transpose_words16_avx512(const std::uint16_t* const* rows, std::size_t w0,
                                                    std::uint32_t* out, std::size_t ldo) {
  __m512i w[16];
  words16_transposed(rows, w0, w);
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(out + i * ldo, w[i]);
}

// out[c·ldo + x] = rows[x][c0 + c] (c < 32, x < 16), 16-bit values: word i of the 16 rows holds
// their columns 2i and 2i + 1 side by side in each 32-bit lane, which one vpermw sorts into
// column 2i's 16 values (the low half) and column 2i + 1's (the high half).
ATTNSCALE_BF16_TARGET void transpose_halves16_avx512(const std::uint16_t* const* rows, std::size_t c0,
                                                     std::uint16_t* out, std::size_t ldo) {
  alignas(64) static constexpr std::uint16_t kSort[32] = {0, 2,  4,  6,  8,  10, 12, 14, 16, 18, 20,
                                                          22, 24, 26, 28, 30, 1,  3,  5,  7,  9,  11,
                                                          13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  const __m512i sort = _mm512_load_si512(kSort);
  __m512i w[16];
  words16_transposed(rows, c0 / 2, w);
  for (int i = 0; i < 16; ++i) {
    const __m512i two = _mm512_maskz_permutexvar_epi16(0xFFFFFFFFu, sort, w[i]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (2 * i) * ldo), _mm512_maskz_extracti64x4_epi64(0xF, two, 0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (2 * i + 1) * ldo), _mm512_maskz_extracti64x4_epi64(0xF, two, 1));
  }
}

std::uint64_t xgetbv0() {
  std::uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}
bool osxsave() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27));
}
#endif  // __x86_64__

bool detect_avx512_bf16() {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 16)) || !(b & (1u << 30))) return false;  // F, BW
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return false;  // AVX512_BF16
  return osxsave() && (xgetbv0() & 0xE6) == 0xE6;  // SSE, AVX and the three AVX-512 states
#else
  return false;
#endif
}

bool detect_amx() {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = d & (1u << 24), bf16 = d & (1u << 22);
  if (!tile || !bf16 || !osxsave()) return false;
  const std::uint64_t xcr0 = xgetbv0();
  if ((xcr0 & (3u << 17)) != (3u << 17)) return false;  // XTILECFG and XTILEDATA state enabled
  if (!detect_avx512_bf16()) return false;  // the products' merge into C, the conversions
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

std::once_flag detect_once, env_once;
bool has_amx = false, has_avx512_bf16 = false;
Path chosen = Path::widened;

// The best path of a CPU: AMX where usable; vdpbf16ps only where one bf16 dot does at least the
// work of the two float32 multiply-adds it replaces. On AMD's cores it does: on Zen 5 the
// vdpbf16ps loop of peak_loops.h measures about twice the FMA loop. On Intel's it does not:
// an Emerald Rapids core issues one vdpbf16ps zmm every second cycle against two FMAs a cycle
// (86 against 176 GFLOP/s on one thread), so that bf16 pairs widened in registers and multiplied
// by FMAs (bf16_widened.cc) take 0.61 of the bf16 forward's time and 0.64 of the backward's
// (N = 4096, d = 128, H = 8, two threads: 444.7 -> 271.3 ms, 1104.9 -> 702.6; docs/performance.md,
// "Emerald Rapids without AMX"). The rule follows from the CPU alone, so a machine's bits do not
// depend on a timing.
Path best_of_cpu() {
  if (has_amx) return Path::amx;
  if (has_avx512_bf16 && !cpu_model().intel) return Path::avx512_bf16;
  return Path::widened;
}

// The CPU's paths, detected once. force_path() needs only these: calling detect() from it would
// enter env_once again from inside its own initialiser (with $ATTNSCALE_BF16 set), a deadlock.
void detect_cpu() {
  std::call_once(detect_once, [] {
    has_amx = detect_amx();
    has_avx512_bf16 = detect_avx512_bf16();
    chosen = best_of_cpu();
  });
}

void detect() {
  detect_cpu();
  std::call_once(env_once, [] {
    if (const char* env = std::getenv("ATTNSCALE_BF16"); env && *env) force_path(env);
  });
}

}  // namespace

bool vdpbf16ps_path(Path p) { return (p == Path::amx || p == Path::avx512_bf16) && avx512_bf16_usable(); }

const char* path_name(Path p) {
  return p == Path::amx ? "amx" : p == Path::avx512_bf16 ? "avx512-bf16" : p == Path::widened ? "widened" : "portable";
}
bool amx_usable() {
  detect();
  return has_amx;
}
bool avx512_bf16_usable() {
  detect();
  return has_avx512_bf16;
}
Path best_path() {
  detect_cpu();
  return best_of_cpu();
}
Path path() {
  detect();
  return chosen;
}
void force_path(const char* name) {
  detect_cpu();
  const std::string n = name;
  if (n.empty()) chosen = best_path();
  else if (n == "portable") chosen = Path::portable;
  else if (n == "widened") chosen = Path::widened;
  else if (n == "avx512-bf16" && has_avx512_bf16) chosen = Path::avx512_bf16;
  else if (n == "amx" && has_amx) chosen = Path::amx;
  else throw Error("ATTNSCALE_BF16: '" + n + "' is not a bf16 path this CPU supports (amx, avx512-bf16, widened, portable)");
}

TileScope::TileScope(Path path) : amx_(path == Path::amx) {
#if defined(__x86_64__)
  if (!amx_) return;
  ++tile_scopes;
  ensure_tiles();
#endif
}

TileScope::~TileScope() {
#if defined(__x86_64__)
  if (amx_ && --tile_scopes == 0 && tiles_configured) release_tiles();
#endif
}

void round_bits(const float* src, std::size_t n, std::uint16_t* dst) {
  bf16_row(src, static_cast<std::int64_t>(n), dst);
}

void transpose_words16(const std::uint16_t* const* rows, std::size_t words, std::uint32_t* out, std::size_t ldo) {
  std::size_t w = 0;
#if defined(__x86_64__)
  if (avx512_bf16_usable())
    for (; w + 16 <= words; w += 16) transpose_words16_avx512(rows, w, out + w * ldo, ldo);
#endif
  for (; w < words; ++w)
    for (std::size_t x = 0; x < 16; ++x) std::memcpy(out + w * ldo + x, rows[x] + 2 * w, 4);
}

void transpose_halves16(const std::uint16_t* const* rows, std::size_t n, std::uint16_t* out, std::size_t ldo) {
  std::size_t c = 0;
#if defined(__x86_64__)
  if (avx512_bf16_usable())
    for (; c + 32 <= n; c += 32) transpose_halves16_avx512(rows, c, out + c * ldo, ldo);
#endif
  for (; c < n; ++c)
    for (std::size_t x = 0; x < 16; ++x) out[c * ldo + x] = rows[x][c];
}

void to_bf16(Path path, const float* src, std::size_t lds, std::size_t rows, std::size_t cols, std::uint16_t* dst,
             std::size_t ldd) {
#if defined(__x86_64__)
  if (vdpbf16ps_path(path)) return to_bf16_avx512(src, lds, rows, cols, dst, ldd);
#endif
  for (std::size_t r = 0; r < rows; ++r) round_bits(src + r * lds, cols, dst + r * ldd);
}

void to_bf16_pairs(Path path, const float* src, std::size_t lds, std::size_t rows, std::size_t pad_rows,
                   std::size_t cols, std::uint16_t* dst, std::size_t ldd) {
#if defined(__x86_64__)
  if (vdpbf16ps_path(path))
    return to_bf16_pairs_avx512(src, lds, rows, pad_rows, cols, dst, ldd);
#endif
  if (path == Path::widened) {
    for (std::size_t r = 0; r < pad_rows; r += 2) {
      std::uint32_t* words = reinterpret_cast<std::uint32_t*>(dst) + (r / 2) * ldd;
      if (r < rows) pair_row(src + r * lds, r + 1 < rows ? src + (r + 1) * lds : nullptr, cols, words);
      else std::fill(words, words + cols, 0u);
    }
    return;
  }
  for (std::size_t r = 0; r < pad_rows; ++r)
    for (std::size_t c = 0; c < cols; ++c)
      dst[((r / 2) * ldd + c) * 2 + r % 2] = r < rows ? round_to_bf16(src[r * lds + c]) : std::uint16_t(0);
}

// Under AddressSanitizer every call checks the operands' layout (bf16_kernels.h) against their
// allocations: AMX tile loads are not instrumented, and a tile read past the end of a buffer was
// seen only where it crossed into an unmapped page (once in a while, by the heap's layout).
static void check_operands(std::size_t M, std::size_t N, std::size_t K, const std::uint16_t* A, std::size_t lda,
                    const std::uint16_t* Bp, std::size_t ldb) {
#if defined(__SANITIZE_ADDRESS__)
  if (K == 0) return;
  const auto up16 = [](std::size_t x) { return (x + 15) / 16 * 16; };
  const std::size_t a_elems = (up16(M) - 1) * lda + K, b_elems = ((K / 2 - 1) * ldb + up16(N)) * 2;
  for (auto [ptr, elems, name] : {std::tuple{A, a_elems, "A"}, std::tuple{Bp, b_elems, "Bp"}})
    if (void* bad = __asan_region_is_poisoned(const_cast<std::uint16_t*>(ptr), elems * 2)) {
      std::fprintf(stderr, "bfdot::gemm(M=%zu, N=%zu, K=%zu): operand %s's padded layout ends past its allocation\n",
                   M, N, K, name);
      __asan_describe_address(bad);
      std::abort();
    }
  if (K % 32 != 0 || ldb % 16 != 0) {
    std::fprintf(stderr, "bfdot::gemm: K = %zu (a multiple of 32) and ldb = %zu (of 16)\n", K, ldb);
    std::abort();
  }
#else
  (void)M, (void)N, (void)K, (void)A, (void)lda, (void)Bp, (void)ldb;
#endif
}

void gemm(Path path, std::size_t M, std::size_t N, std::size_t K, const std::uint16_t* A, std::size_t lda,
          const std::uint16_t* Bp, std::size_t ldb, float* C, std::size_t ldc, int mode, const float* row_scale,
          float out_scale, const Ahead& ahead) {
  if (M == 0 || N == 0) return;
  check_operands(M, N, K, A, lda, Bp, ldb);
#if defined(__x86_64__)
  if (path == Path::amx) return gemm_amx(M, N, K, A, lda, Bp, ldb, C, ldc, mode, row_scale, out_scale, ahead);
  if (path == Path::avx512_bf16) return gemm_avx512(M, N, K, A, lda, Bp, ldb, C, ldc, mode, row_scale, out_scale, ahead);
#endif
  if (path == Path::widened) return gemm_widened(M, N, K, A, lda, Bp, ldb, C, ldc, mode, row_scale, out_scale);
  gemm_portable(M, N, K, A, lda, Bp, ldb, C, ldc, mode, row_scale, out_scale);
}

}  // namespace attnscale::detail::bfdot
