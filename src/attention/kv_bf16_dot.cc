// Cache decode's bfloat16 products (kv_bf16_dot.h). The kernels are compiled with target
// attributes, as bf16_gemm.cc's, and called only after available() said the CPU runs them.
#include "attention/kv_bf16_dot.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "attention/bf16_kernels.h"
#include "attention/kv_kernels.h"

namespace attnscale::detail::kv::bf16dot {

bool available() { return bfdot::vdpbf16ps_path(bfdot::path()); }
bool amx() { return bfdot::path() == bfdot::Path::amx; }

AmxOperands::AmxOperands(std::size_t rows, std::size_t dk, std::size_t dv)
    : rows_(rows), dk_(dk), dv_(dv), dkp_((dk + 31) / 32 * 32), ldq_((rows + 15) / 16 * 16),
      qt_(static_cast<std::int64_t>(dkp_ / 2 * ldq_ * 2)), k_(static_cast<std::int64_t>(kTileKeys * dkp_)),
      st_(static_cast<std::int64_t>(rows ? kTileKeys * 16 : 0)), p_(static_cast<std::int64_t>(ldq_ * kTileKeys)),
      v_(static_cast<std::int64_t>(kTileKeys * dv)) {}

#if defined(__x86_64__)
#define ATTNSCALE_BF16_DOT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define ATTNSCALE_BF16_DOT_INLINE ATTNSCALE_BF16_DOT __attribute__((always_inline))

namespace {

constexpr std::size_t kKeys = 8;  // keys a step of the scores

// Four keys' accumulators of four rows (128-bit block h of a[x]: row h's four pair lanes) as one
// vector whose block h holds row h's four scores, key x in lane x:
//   unpacklo + unpackhi: (a0 + a2, b0 + b2, a1 + a3, b1 + b3), likewise (c, d); then the low
//   halves of both plus their high halves: (a0 + a2 + a1 + a3, b.., c.., d..).
// (The all-lanes masks of the maskz forms: GCC 12's plain forms pass an undefined vector that its
// flow analysis reports as maybe uninitialised; the code is the same.)
constexpr __mmask16 kAll = 0xffff;
ATTNSCALE_BF16_DOT inline __m512 Sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_maskz_unpacklo_ps(kAll, a, b), _mm512_maskz_unpackhi_ps(kAll, a, b));
  const __m512 cd = _mm512_add_ps(_mm512_maskz_unpacklo_ps(kAll, c, d), _mm512_maskz_unpackhi_ps(kAll, c, d));
  return _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
}

// kKeys keys (rows[x]) against one block of nr <= 4·H packed rows: S[r][x].
template <int H>
ATTNSCALE_BF16_DOT void Keys8(std::size_t chunks, const std::uint16_t* const* krow, const std::uint16_t* pq, float* S,
                              std::size_t lds, std::size_t nr, LineFeed& feed) {
  __m512 a[kKeys][H];
#pragma GCC unroll 8
  for (std::size_t x = 0; x < kKeys; ++x)
    for (int h = 0; h < H; ++h) a[x][h] = _mm512_setzero_ps();
  // Two chunks (16 columns) a step, one row pointer read for both: the feed's step and the
  // pointers' loads once per 32 products.
  const auto chunk = [&](const std::uint16_t* const* rows, std::size_t c) ATTNSCALE_BF16_DOT_INLINE {
    const __m512bh q0 = (__m512bh)_mm512_loadu_si512(pq + c * 128);
    const __m512bh q1 = H == 2 ? (__m512bh)_mm512_loadu_si512(pq + c * 128 + 64) : q0;
#pragma GCC unroll 8
    for (std::size_t x = 0; x < kKeys; ++x) {
      const __m512bh k = (__m512bh)_mm512_maskz_broadcast_i32x4(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[x] + 8 * c)));
      a[x][0] = _mm512_dpbf16_ps(a[x][0], q0, k);
      if constexpr (H == 2) a[x][1] = _mm512_dpbf16_ps(a[x][1], q1, k);
    }
  };
  std::size_t c = 0;
  for (; c + 2 <= chunks; c += 2) {
    feed.next();
    // The row pointers read from memory each step, as kv_quad_keys-inl.h's QuadKeys reads them (GCC
    // otherwise parks them in vector registers and moves each back before its load).
    const std::uint16_t* const* rows = krow;
    asm("" : "+r"(rows));
    chunk(rows, c);
    chunk(rows, c + 1);
  }
  if (c < chunks) {
    feed.next();
    chunk(krow, c);
  }
  // (Every loop over the accumulators unrolled: one left as a loop makes GCC keep them in memory,
  // stored at every step.)
  alignas(64) float t[16];
#pragma GCC unroll 2
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 2
    for (std::size_t g = 0; g < kKeys; g += 4) {
      _mm512_store_ps(t, Sum4(a[g][h], a[g + 1][h], a[g + 2][h], a[g + 3][h]));
      for (std::size_t r = 0; r < 4 && 4 * h + r < nr; ++r) std::memcpy(S + (4 * h + r) * lds + g, t + 4 * r, 4 * sizeof(float));
    }
}

ATTNSCALE_BF16_DOT void ScoresAvx512(std::size_t nk, std::size_t rows, std::size_t dk, const void* const* krow,
                                     const std::uint16_t* packed, float* S, std::size_t lds, LineFeed& feed) {
  const std::size_t chunks = dk / 8, groups = (nk + kKeys - 1) / kKeys;
  feed.pace(static_cast<std::int64_t>((rows + 7) / 8 * groups * ((chunks + 1) / 2)));
  for (std::size_t r0 = 0; r0 < rows; r0 += 8) {
    const std::size_t nr = std::min<std::size_t>(8, rows - r0);
    const std::uint16_t* pq = packed + r0 / 8 * chunks * 128;
    float* s = S + r0 * lds;
    const std::uint16_t* k[kKeys];
    for (std::size_t j = 0; j < nk; j += kKeys) {
      const std::size_t n = std::min(kKeys, nk - j);
      for (std::size_t x = 0; x < kKeys; ++x) k[x] = static_cast<const std::uint16_t*>(krow[j + std::min(x, n - 1)]);
      if (n == kKeys && j + kKeys <= lds) {
        if (nr > 4) Keys8<2>(chunks, k, pq, s + j, lds, nr, feed);
        else Keys8<1>(chunks, k, pq, s + j, lds, nr, feed);
      } else {  // the last keys, the group filled up with the last one, into a scratch tile
        float part[8 * kKeys];
        if (nr > 4) Keys8<2>(chunks, k, pq, part, kKeys, nr, feed);
        else Keys8<1>(chunks, k, pq, part, kKeys, nr, feed);
        for (std::size_t r = 0; r < nr; ++r) std::memcpy(s + r * lds + j, part + r * kKeys, n * sizeof(float));
      }
    }
  }
}

// Output columns 16b .. 16b + 15 of a group of 32 from the interleave's two accumulators: lo's lane
// 4k + i holds column 8k + i and hi's column 8k + 4 + i (k < 4, i < 4).
alignas(64) constexpr std::int32_t kPlace[2][16] = {{0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23},
                                                    {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31}};

// Rows r < NR (P pair words Pw[r][j / 2], kTileKeys / 2 a row) against CB groups of 32 columns
// from c0: O[r][c] = alpha[r]·O[r][c] + Σ_j P[r][j]·V_j[c].
template <int NR, int CB>
ATTNSCALE_BF16_DOT void Columns(std::size_t nk, std::size_t c0, const void* const* vrow, const std::uint32_t* Pw,
                                const float* alpha, float* O, std::size_t ldo, LineFeed& feed) {
  constexpr std::size_t kWords = kTileKeys / 2;
  __m512 acc[NR][CB][2];
#pragma GCC unroll 16
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < CB; ++b) acc[r][b][0] = acc[r][b][1] = _mm512_setzero_ps();
  // A pair of keys: their V rows interleaved, against each row's two P (one 32-bit broadcast).
  const auto pair = [&](std::size_t j, const std::uint16_t* v0, const std::uint16_t* v1) ATTNSCALE_BF16_DOT_INLINE {
    __m512bh lo[CB], hi[CB];
#pragma GCC unroll 4
    for (int b = 0; b < CB; ++b) {
      const __m512i x0 = _mm512_loadu_si512(v0 + c0 + 32 * b), x1 = _mm512_loadu_si512(v1 + c0 + 32 * b);
      lo[b] = (__m512bh)_mm512_unpacklo_epi16(x0, x1);
      hi[b] = (__m512bh)_mm512_unpackhi_epi16(x0, x1);
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int>(Pw[r * kWords + j / 2]));
#pragma GCC unroll 4
      for (int b = 0; b < CB; ++b) {
        acc[r][b][0] = _mm512_dpbf16_ps(acc[r][b][0], p, lo[b]);
        acc[r][b][1] = _mm512_dpbf16_ps(acc[r][b][1], p, hi[b]);
      }
    }
  };
  const auto row = [&](std::size_t j) { return static_cast<const std::uint16_t*>(vrow[j]); };
  std::size_t j = 0;
#pragma GCC unroll 2
  for (; j + 2 <= nk; j += 2) {
    feed.next();
    pair(j, row(j), row(j + 1));
  }
  if (j < nk) {  // an odd tile's last key, paired with itself against P's zero pad
    feed.next();
    pair(j, row(j), row(j));
  }
  const __m512i place0 = _mm512_load_si512(kPlace[0]), place1 = _mm512_load_si512(kPlace[1]);
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 4
    for (int b = 0; b < CB; ++b) {
      float* o = O + r * ldo + c0 + 32 * b;
      const __m512 s0 = _mm512_permutex2var_ps(acc[r][b][0], place0, acc[r][b][1]);
      const __m512 s1 = _mm512_permutex2var_ps(acc[r][b][0], place1, acc[r][b][1]);
      _mm512_storeu_ps(o, _mm512_fmadd_ps(a, _mm512_loadu_ps(o), s0));
      _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(a, _mm512_loadu_ps(o + 16), s1));
    }
  }
}

// Groups of 32 columns a pass for a block of nr rows: as many as nr·groups·2 <= 16 accumulators allow.
constexpr std::size_t GroupsPerPass(std::size_t nr) { return nr >= 5 ? 1 : nr >= 3 ? 2 : 4; }

template <int NR>
ATTNSCALE_BF16_DOT void Rows(std::size_t nk, std::size_t dv, const void* const* vrow, const std::uint32_t* Pw,
                             const float* alpha, float* O, std::size_t ldo, LineFeed& feed) {
  constexpr int CB = static_cast<int>(GroupsPerPass(NR));
  std::size_t c = 0;
  for (; c + 32 * CB <= dv; c += 32 * CB) Columns<NR, CB>(nk, c, vrow, Pw, alpha, O, ldo, feed);
  for (; c < dv; c += 32) Columns<NR, 1>(nk, c, vrow, Pw, alpha, O, ldo, feed);
}

// Passes over the keys for a block of nr rows (Rows).
std::size_t Passes(std::size_t nr, std::size_t dv) {
  const std::size_t groups = dv / 32, cb = GroupsPerPass(nr);
  return groups / cb + groups % cb;
}

ATTNSCALE_BF16_DOT void AccumulateAvx512(std::size_t nk, std::size_t rows, std::size_t dv, const void* const* vrow,
                                         const float* P, const float* alpha, float* O, std::size_t ldo,
                                         LineFeed& feed) {
  constexpr std::size_t kWords = kTileKeys / 2;
  std::size_t passes = 0;
  for (std::size_t r0 = 0; r0 < rows; r0 += 8) passes += Passes(std::min<std::size_t>(8, rows - r0), dv);
  feed.pace(static_cast<std::int64_t>(passes * ((nk + 1) / 2)));
  alignas(64) std::uint32_t Pw[8 * kWords];
  // The lanes of 16 keys from key j that lie before nk.
  const auto before_nk = [nk](std::size_t j) -> __mmask16 {
    return j >= nk ? 0 : nk - j >= 16 ? 0xffff : static_cast<__mmask16>((1u << (nk - j)) - 1);
  };
  for (std::size_t r0 = 0; r0 < rows; r0 += 8) {
    const std::size_t nr = std::min<std::size_t>(8, rows - r0);
    // P's rows as bf16 pair words, zero past key nk - 1 (an odd tile's last pair).
    for (std::size_t r = 0; r < nr; ++r) {
      const float* p = P + (r0 + r) * kTileKeys;
      for (std::size_t w = 0; w < kWords; w += 16) {
        const std::size_t j = 2 * w;
        const __m512 a = _mm512_maskz_loadu_ps(before_nk(j), p + j), b = _mm512_maskz_loadu_ps(before_nk(j + 16), p + j + 16);
        _mm512_store_si512(Pw + r * kWords + w, (__m512i)_mm512_cvtne2ps_pbh(b, a));
      }
    }
    const float* a = alpha + r0;
    float* o = O + r0 * ldo;
    switch (nr) {
      case 1: Rows<1>(nk, dv, vrow, Pw, a, o, ldo, feed); break;
      case 2: Rows<2>(nk, dv, vrow, Pw, a, o, ldo, feed); break;
      case 3: Rows<3>(nk, dv, vrow, Pw, a, o, ldo, feed); break;
      case 4: Rows<4>(nk, dv, vrow, Pw, a, o, ldo, feed); break;
      case 5: Rows<5>(nk, dv, vrow, Pw, a, o, ldo, feed); break;
      case 6: Rows<6>(nk, dv, vrow, Pw, a, o, ldo, feed); break;
      case 7: Rows<7>(nk, dv, vrow, Pw, a, o, ldo, feed); break;
      default: Rows<8>(nk, dv, vrow, Pw, a, o, ldo, feed); break;
    }
  }
}

}  // namespace

// Rounded by vcvtneps2bf16 (nearest even; a float32 subnormal becomes zero, as vdpbf16ps would
// take it anyway).
ATTNSCALE_BF16_DOT void pack(std::size_t rows, std::size_t dk, const float* Q, std::size_t ldq, std::uint16_t* packed) {
  const std::size_t chunks = dk / 8;
  std::fill(packed, packed + packed_size(rows, dk), std::uint16_t{0});
  for (std::size_t r = 0; r < rows; ++r) {
    std::uint16_t* block = packed + r / 8 * chunks * 128 + (r % 8) / 4 * 64 + r % 4 * 8;
    for (std::size_t c = 0; c < chunks; ++c)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(block + c * 128),
                       (__m128i)_mm256_cvtneps_pbh(_mm256_loadu_ps(Q + r * ldq + 8 * c)));
  }
}

// The AMX form (AmxOperands): the operands copied and rounded here, the products by tdpbf16ps on
// the tiles bfdot::TileScope configured (bf16_kernels.h): every tile 16 rows of 64 bytes, tiles 0-3 four accumulators,
// tiles 4 and 5 the operand they share in a step (in turn) and tiles 6 and 7 the others.
#define ATTNSCALE_AMX_DOT __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

ATTNSCALE_BF16_DOT void AmxOperands::pack(const float* Q, std::size_t ldq) {
  qt_.fill(std::uint16_t{0});
  alignas(64) std::uint16_t row[16];
  for (std::size_t r = 0; r < rows_; ++r)
    for (std::size_t c = 0; c < dk_; c += 16) {
      const std::size_t n = std::min<std::size_t>(16, dk_ - c);
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
      _mm256_store_si256(reinterpret_cast<__m256i*>(row), (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, Q + r * ldq + c)));
      for (std::size_t e = 0; e < n; ++e) qt_.get()[((c + e) / 2 * ldq_ + r) * 2 + (c + e) % 2] = row[e];
    }
}

// Up to four accumulator tiles (nt) against one shared operand in tile kS (4 or 5, in turn from
// step to step: a tile's load waits for the products still reading it, the tiles are not
// renamed), their own operands at a[t] + off (stride sa[t] bytes) in tiles 6, 7, 6, 7: tile t +=
// a_t · tile kS (kSharedB: the shared tile is B, as in the scores, Sᵀ = K·Qᵀ) or tile kS · a_t (the
// shared tile is A: P·V).
// (One function per shared tile: the intrinsics take the tile's number as written.)
#define ATTNSCALE_TILE_STEP(KS, T, AT)                   \
  if (nt > T) {                                          \
    feed.next();                                         \
    _tile_loadd(AT, a[T] + off, sa[T]);                  \
    if constexpr (kSharedB) _tile_dpbf16ps(T, AT, KS);   \
    else _tile_dpbf16ps(T, KS, AT);                      \
  }
#define ATTNSCALE_TILE_STEPS(NAME, KS)                                                                         \
  template <bool kSharedB>                                                                                     \
  ATTNSCALE_AMX_DOT inline void NAME(std::size_t nt, const std::uint16_t* const* a, const std::size_t* sa,     \
                                     std::size_t off, LineFeed& feed) {                                        \
    ATTNSCALE_TILE_STEP(KS, 0, 6)                                                                              \
    ATTNSCALE_TILE_STEP(KS, 1, 7)                                                                              \
    ATTNSCALE_TILE_STEP(KS, 2, 6)                                                                              \
    ATTNSCALE_TILE_STEP(KS, 3, 7)                                                                              \
  }
ATTNSCALE_TILE_STEPS(TileStep4, 4)
ATTNSCALE_TILE_STEPS(TileStep5, 5)
#undef ATTNSCALE_TILE_STEPS
#undef ATTNSCALE_TILE_STEP

ATTNSCALE_AMX_DOT void AmxOperands::scores(std::size_t nk, const void* const* krow, float* S, std::size_t lds,
                                           LineFeed& feed) {
  // (The feed is used where it lies: copied into a local, kept in registers, the AMX products took
  // 1.08x the time from DRAM, docs/performance.md.)
  // Each block of 16 keys read where it lies when its rows are one stride apart and fill whole
  // tile rows (dk % 32 == 0, 16 keys), else copied into k_ (zero past dk): the same values either way.
  const std::size_t mt = (nk + 15) / 16, ks = dkp_ / 32, blocks = ldq_ / 16;
  const std::uint16_t* a[4];
  std::size_t sa[4], staged = 0;
  for (std::size_t t = 0; t < mt; ++t) {
    const char* r0 = static_cast<const char*>(krow[16 * t]);
    bool direct = dk_ % 32 == 0 && nk - 16 * t >= 16;
    const std::ptrdiff_t stride = direct ? static_cast<const char*>(krow[16 * t + 1]) - r0 : 0;
    for (std::size_t i = 2; i < 16 && direct; ++i)
      direct = static_cast<const char*>(krow[16 * t + i]) == r0 + static_cast<std::ptrdiff_t>(i) * stride;
    if (direct && stride > 0) {
      a[t] = reinterpret_cast<const std::uint16_t*>(r0), sa[t] = static_cast<std::size_t>(stride);
    } else {
      a[t] = nullptr, sa[t] = dkp_ * 2;
      staged += std::min<std::size_t>(16, nk - 16 * t);
    }
  }
  // The feed steps once per row copied, per product step and per 16 scores gathered: spread over
  // the whole call (the products alone are a short part of it).
  feed.pace(static_cast<std::int64_t>(staged + blocks * ks * mt + rows_ * mt));
  for (std::size_t t = 0; t < mt; ++t) {
    if (a[t]) continue;
    for (std::size_t j = 16 * t; j < std::min(nk, 16 * t + 16); ++j) {
      feed.next();
      const auto* src = static_cast<const std::uint16_t*>(krow[j]);
      std::uint16_t* dst = k_.get() + j * dkp_;
      for (std::size_t c = 0; c < dk_; c += 32) {
        const std::size_t n = std::min<std::size_t>(32, dk_ - c);
        const __mmask32 m = n == 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << n) - 1);
        _mm512_storeu_si512(dst + c, _mm512_maskz_loadu_epi16(m, src + c));
      }
    }
    a[t] = k_.get() + 16 * t * dkp_;
  }
  const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(16));
  for (std::size_t b = 0; b < blocks; ++b) {  // query rows 16b .. 16b + 15
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (std::size_t k = 0; k < ks; ++k) {
      const std::uint16_t* q = qt_.get() + (16 * k * ldq_ + 16 * b) * 2;
      if (k % 2 == 0) {
        _tile_loadd(4, q, ldq_ * 4);
        TileStep4<true>(mt, a, sa, 32 * k, feed);
      } else {
        _tile_loadd(5, q, ldq_ * 4);
        TileStep5<true>(mt, a, sa, 32 * k, feed);
      }
    }
    // Sᵀ's tiles (keys x 16 rows), then each row's keys gathered 16 at a time.
    _tile_stored(0, st_.get(), 64);
    if (mt > 1) _tile_stored(1, st_.get() + 256, 64);
    if (mt > 2) _tile_stored(2, st_.get() + 512, 64);
    if (mt > 3) _tile_stored(3, st_.get() + 768, 64);
    for (std::size_t r = 16 * b; r < std::min(rows_, 16 * b + 16); ++r)
      for (std::size_t j = 0; j < nk; j += 16) {
        feed.next();
        const __mmask16 m = nk - j >= 16 ? 0xffff : static_cast<__mmask16>((1u << (nk - j)) - 1);
        _mm512_mask_storeu_ps(S + r * lds + j, m,
                              _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, st_.get() + j * 16 + r % 16, 4));
      }
  }
}

ATTNSCALE_AMX_DOT void AmxOperands::accumulate(std::size_t nk, std::size_t rows, const void* const* vrow,
                                               const float* P, const float* alpha, float* O, std::size_t ldo,
                                               LineFeed& feed) {
  const std::size_t kp = (nk + 31) / 32 * 32, pairs = (nk + 1) / 2;
  const std::size_t blocks = (rows + 15) / 16, passes = (dv_ + 63) / 64;
  // The feed steps once per 16 P rounded, per key pair repacked, per product step and per row
  // merged: spread over the whole call.
  feed.pace(static_cast<std::int64_t>(pairs + blocks * passes * (kp / 32) * 4 + rows * (kp / 16 + passes)));
  // P's rows rounded to bf16, zero from key nk to kp.
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < kp; j += 16) {
      feed.next();
      const __mmask16 m = j >= nk ? 0 : nk - j >= 16 ? 0xffff : static_cast<__mmask16>((1u << (nk - j)) - 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p_.get() + r * kTileKeys + j),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, P + r * kTileKeys + j)));
    }
  // V's rows in key pairs: an odd tile's last key with zeros, zero pairs up to kp (a stale pair
  // there could hold an Inf, and 0·Inf is NaN).
  for (std::size_t p = 0; p < pairs; ++p) {
    feed.next();
    const auto* v0 = static_cast<const std::uint16_t*>(vrow[2 * p]);
    const auto* v1 = 2 * p + 1 < nk ? static_cast<const std::uint16_t*>(vrow[2 * p + 1]) : nullptr;
    std::uint16_t* dst = v_.get() + p * dv_ * 2;
    for (std::size_t c = 0; c < dv_; c += 32) {
      const __m512i x0 = _mm512_loadu_si512(v0 + c), x1 = v1 ? _mm512_loadu_si512(v1 + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + 2 * c, _mm512_unpacklo_epi16(x0, x1));
      _mm512_storeu_si512(dst + 2 * c + 32, _mm512_unpackhi_epi16(x0, x1));
    }
  }
  std::fill(v_.get() + pairs * dv_ * 2, v_.get() + kp / 2 * dv_ * 2, std::uint16_t{0});
  alignas(64) float acc[4][256];
  for (std::size_t b = 0; b < blocks; ++b) {  // rows 16b .. 16b + 15
    const std::size_t nr = std::min<std::size_t>(16, rows - 16 * b);
    for (std::size_t c0 = 0; c0 < dv_; c0 += 64) {  // columns c0 .. c0 + 63: up to four tiles of 16
      const std::size_t nt = std::min<std::size_t>(4, (dv_ - c0) / 16);
      const std::uint16_t* a[4];
      std::size_t sa[4];
      for (std::size_t t = 0; t < 4; ++t) a[t] = v_.get() + (c0 + 16 * t) * 2, sa[t] = dv_ * 4;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (std::size_t k = 0; k < kp / 32; ++k) {
        const std::uint16_t* pk = p_.get() + 16 * b * kTileKeys + 32 * k;
        if (k % 2 == 0) {
          _tile_loadd(4, pk, kTileKeys * 2);
          TileStep4<false>(nt, a, sa, 16 * k * dv_ * 2, feed);
        } else {
          _tile_loadd(5, pk, kTileKeys * 2);
          TileStep5<false>(nt, a, sa, 16 * k * dv_ * 2, feed);
        }
      }
      _tile_stored(0, acc[0], 64);
      _tile_stored(1, acc[1], 64);
      if (nt > 2) {
        _tile_stored(2, acc[2], 64);
        _tile_stored(3, acc[3], 64);
      }
      for (std::size_t r = 0; r < nr; ++r) {
        feed.next();
        const __m512 s = _mm512_set1_ps(alpha[16 * b + r]);
        float* o = O + (16 * b + r) * ldo + c0;
        for (std::size_t t = 0; t < nt; ++t)
          _mm512_storeu_ps(o + 16 * t, _mm512_fmadd_ps(s, _mm512_loadu_ps(o + 16 * t), _mm512_load_ps(acc[t] + 16 * r)));
      }
    }
  }
}

ATTNSCALE_BF16_DOT void AmxOperands::unpermute(std::size_t rows, float* O, std::size_t ldo) const {
  const __m512i place0 = _mm512_load_si512(kPlace[0]), place1 = _mm512_load_si512(kPlace[1]);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < dv_; c += 32) {
      float* o = O + r * ldo + c;
      const __m512 lo = _mm512_loadu_ps(o), hi = _mm512_loadu_ps(o + 16);
      _mm512_storeu_ps(o, _mm512_permutex2var_ps(lo, place0, hi));
      _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(lo, place1, hi));
    }
}

void scores(std::size_t nk, std::size_t rows, std::size_t dk, const void* const* krow, const std::uint16_t* packed,
            float* S, std::size_t lds, LineFeed& feed) {
  ScoresAvx512(nk, rows, dk, krow, packed, S, lds, feed);
}
void accumulate(std::size_t nk, std::size_t rows, std::size_t dv, const void* const* vrow, const float* P,
                const float* alpha, float* O, std::size_t ldo, LineFeed& feed) {
  AccumulateAvx512(nk, rows, dv, vrow, P, alpha, O, ldo, feed);
}

#else  // not x86-64: available() is false there, and these are never called

void pack(std::size_t, std::size_t, const float*, std::size_t, std::uint16_t*) {}
void AmxOperands::pack(const float*, std::size_t) {}
void AmxOperands::scores(std::size_t, const void* const*, float*, std::size_t, LineFeed&) {}
void AmxOperands::accumulate(std::size_t, std::size_t, const void* const*, const float*, const float*, float*,
                             std::size_t, LineFeed&) {}
void AmxOperands::unpermute(std::size_t, float*, std::size_t) const {}

void scores(std::size_t, std::size_t, std::size_t, const void* const*, const std::uint16_t*, float*, std::size_t,
            LineFeed&) {}
void accumulate(std::size_t, std::size_t, std::size_t, const void* const*, const float*, const float*, float*,
                std::size_t, LineFeed&) {}

#endif

}  // namespace attnscale::detail::kv::bf16dot
