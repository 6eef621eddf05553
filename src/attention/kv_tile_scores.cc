// scores (kv_kernels.h): a tile's scores S = Q·Kᵀ for a group's query rows (up to 8 a block, row
// by row, pointers to key rows of float32, bfloat16, float16 or int8), each key row read once for
// the block's rows, with lane sums. Compiled once per Highway target like kernels.cc.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kv_tile_scores.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstddef>

#include "attention/kv_kernels.h"
#include "attention/kv_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::kv::HWY_NAMESPACE {

// S[r][j] = Σ_c Q[r][c] · K_j[c] for NR rows (row stride ldq) and keys j < nk. Two
// accumulators per row (even and odd vectors of the row) halve the chain of dependent FMAs.
template <int kType, size_t NR>
HWY_INLINE void ScoresRows(size_t nk, size_t dk, const void* const* krow, const float* const* ksc, const float* Q,
                           size_t ldq, float* S, size_t lds) {
  const DF d;
  const size_t L = hn::Lanes(d), full = dk / L * L;
  for (size_t j = 0; j < nk; ++j) {
    const float* sc = ksc ? ksc[j] : nullptr;
    VF acc[NR][2];
    for (size_t r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = hn::Zero(d);
    size_t c = 0;
    for (; c + 2 * L <= full; c += 2 * L) {
      const VF k0 = LoadRow<kType>(d, krow[j], sc, c), k1 = LoadRow<kType>(d, krow[j], sc, c + L);
      for (size_t r = 0; r < NR; ++r) {
        acc[r][0] = hn::MulAdd(k0, hn::LoadU(d, Q + r * ldq + c), acc[r][0]);
        acc[r][1] = hn::MulAdd(k1, hn::LoadU(d, Q + r * ldq + c + L), acc[r][1]);
      }
    }
    if (c < full) {
      const VF k0 = LoadRow<kType>(d, krow[j], sc, c);
      for (size_t r = 0; r < NR; ++r) acc[r][0] = hn::MulAdd(k0, hn::LoadU(d, Q + r * ldq + c), acc[r][0]);
    }
    for (size_t r = 0; r < NR; ++r) {
      float s = LaneSum(d, hn::Add(acc[r][0], acc[r][1]));
      for (size_t e = full; e < dk; ++e) s += Q[r * ldq + e] * Element<kType>(krow[j], sc, e);
      S[r * lds + j] = s;
    }
  }
}

#if HWY_TARGET != HWY_SCALAR
// ScoresRows for NR a multiple of 4, two keys at a time: each vector of Q is loaded once for both
// keys, and the lane sums go four rows at a time through Sum4.
template <int kType, size_t NR>
HWY_INLINE void ScoresRowsPairs(size_t nk, size_t dk, const void* const* krow, const float* const* ksc,
                                const float* Q, size_t ldq, float* S, size_t lds) {
  static_assert(NR % 4 == 0);
  const DF d;
  const size_t L = hn::Lanes(d), full = dk / L * L;
  size_t j = 0;
  for (; j + 2 <= nk; j += 2) {
    const float* sc0 = ksc ? ksc[j] : nullptr;
    const float* sc1 = ksc ? ksc[j + 1] : nullptr;
    VF acc[NR][2];
    for (size_t r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = hn::Zero(d);
    for (size_t c = 0; c < full; c += L) {
      const VF k0 = LoadRow<kType>(d, krow[j], sc0, c), k1 = LoadRow<kType>(d, krow[j + 1], sc1, c);
      for (size_t r = 0; r < NR; ++r) {
        const VF q = hn::LoadU(d, Q + r * ldq + c);
        acc[r][0] = hn::MulAdd(k0, q, acc[r][0]);
        acc[r][1] = hn::MulAdd(k1, q, acc[r][1]);
      }
    }
    for (size_t x = 0; x < 2; ++x) {
      float sums[NR];
      for (size_t r = 0; r < NR; r += 4)
        StoreSum4(d, acc[r][x], acc[r + 1][x], acc[r + 2][x], acc[r + 3][x], sums + r);
      for (size_t r = 0; r < NR; ++r) {
        float s = sums[r];
        for (size_t e = full; e < dk; ++e) s += Q[r * ldq + e] * Element<kType>(krow[j + x], x ? sc1 : sc0, e);
        S[r * lds + j + x] = s;
      }
    }
  }
  if (j < nk) ScoresRows<kType, NR>(1, dk, krow + j, ksc ? ksc + j : nullptr, Q, ldq, S + j, lds);
}

// ScoresRows for four rows, four keys at a time: 16 accumulators, and every step loads four
// vectors of Q and four of K for 16 FMAs, where two keys against eight rows (ScoresRowsPairs)
// load ten for 16, Q's from L1 at every step. Eight rows take two calls, the tile's K rows staying
// in L1 between them; float32 only, since the other types would widen each K vector twice.
// (Interleaved call by call, Hq = 32, Hkv = 4, d = 128, load average 0.7-1.3: 1.06x at
// Nkv = 65536, 1.12x at 4096, 1.05x for Hq = 8, Hkv = 1 at 262144.)
template <int kType>
HWY_INLINE void ScoresRowsQuads(size_t nk, size_t dk, const void* const* krow, const float* const* ksc,
                                const float* Q, size_t ldq, float* S, size_t lds) {
  constexpr size_t NR = 4, NK = 4;
  const DF d;
  const size_t L = hn::Lanes(d), full = dk / L * L;
  size_t j = 0;
  for (; j + NK <= nk; j += NK) {
    const float* sc[NK];
    for (size_t x = 0; x < NK; ++x) sc[x] = ksc ? ksc[j + x] : nullptr;
    VF acc[NR][NK];
    for (size_t r = 0; r < NR; ++r)
      for (size_t x = 0; x < NK; ++x) acc[r][x] = hn::Zero(d);
    for (size_t c = 0; c < full; c += L) {
      VF k[NK];
      for (size_t x = 0; x < NK; ++x) k[x] = LoadRow<kType>(d, krow[j + x], sc[x], c);
      for (size_t r = 0; r < NR; ++r) {
        const VF q = hn::LoadU(d, Q + r * ldq + c);
        for (size_t x = 0; x < NK; ++x) acc[r][x] = hn::MulAdd(k[x], q, acc[r][x]);
      }
    }
    for (size_t x = 0; x < NK; ++x) {
      float sums[NR];
      StoreSum4(d, acc[0][x], acc[1][x], acc[2][x], acc[3][x], sums);
      for (size_t r = 0; r < NR; ++r) {
        float s = sums[r];
        for (size_t e = full; e < dk; ++e) s += Q[r * ldq + e] * Element<kType>(krow[j + x], sc[x], e);
        S[r * lds + j + x] = s;
      }
    }
  }
  if (j < nk) ScoresRowsPairs<kType, NR>(nk - j, dk, krow + j, ksc ? ksc + j : nullptr, Q, ldq, S + j, lds);
}

// ScoresRows for one row (no GQA), four keys at a time: four independent accumulators, and the
// four lane sums in one Sum4 instead of a SumOfLanes per key. (Interleaved call by call with
// ScoresRows, H = 8, d = 128, load average 1.1-1.4: int8 K/V 1.03x at Nkv = 65536 and about 1.1x
// at 4096; float32 the same speed.)
template <int kType>
HWY_INLINE void ScoresKeys4(size_t nk, size_t dk, const void* const* krow, const float* const* ksc, const float* Q,
                            float* S) {
  constexpr size_t NK = 4;
  const DF d;
  const size_t L = hn::Lanes(d), full = dk / L * L;
  size_t j = 0;
  for (; j + NK <= nk; j += NK) {
    const float* sc[NK];
    for (size_t x = 0; x < NK; ++x) sc[x] = ksc ? ksc[j + x] : nullptr;
    VF acc[NK];
    for (size_t x = 0; x < NK; ++x) acc[x] = hn::Zero(d);
    for (size_t c = 0; c < full; c += L) {
      const VF q = hn::LoadU(d, Q + c);
      for (size_t x = 0; x < NK; ++x) acc[x] = hn::MulAdd(LoadRow<kType>(d, krow[j + x], sc[x], c), q, acc[x]);
    }
    float sums[NK];
    StoreSum4(d, acc[0], acc[1], acc[2], acc[3], sums);
    for (size_t x = 0; x < NK; ++x) {
      float s = sums[x];
      for (size_t e = full; e < dk; ++e) s += Q[e] * Element<kType>(krow[j + x], sc[x], e);
      S[j + x] = s;
    }
  }
  if (j < nk) ScoresRows<kType, 1>(nk - j, dk, krow + j, ksc ? ksc + j : nullptr, Q, 0, S + j, 0);
}
#endif

template <int kType>
void ScoresT(size_t nk, size_t rows, size_t dk, const void* const* krow, const float* const* ksc, const float* Q,
             size_t ldq, float* S, size_t lds) {
  for (size_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const float* q = Q + r0 * ldq;
    float* s = S + r0 * lds;
    switch (rows - r0 < kRowBlock ? rows - r0 : kRowBlock) {
#if HWY_TARGET != HWY_SCALAR
      case 1:
        ScoresKeys4<kType>(nk, dk, krow, ksc, q, s);
        break;
#else
      case 1: ScoresRows<kType, 1>(nk, dk, krow, ksc, q, ldq, s, lds); break;
#endif
      case 2: ScoresRows<kType, 2>(nk, dk, krow, ksc, q, ldq, s, lds); break;
      case 3: ScoresRows<kType, 3>(nk, dk, krow, ksc, q, ldq, s, lds); break;
#if HWY_TARGET != HWY_SCALAR
      case 4:
        if constexpr (kType == kF32) ScoresRowsQuads<kType>(nk, dk, krow, ksc, q, ldq, s, lds);
        else ScoresRowsPairs<kType, 4>(nk, dk, krow, ksc, q, ldq, s, lds);
        break;
#else
      case 4: ScoresRows<kType, 4>(nk, dk, krow, ksc, q, ldq, s, lds); break;
#endif
      case 5: ScoresRows<kType, 5>(nk, dk, krow, ksc, q, ldq, s, lds); break;
      case 6: ScoresRows<kType, 6>(nk, dk, krow, ksc, q, ldq, s, lds); break;
      case 7: ScoresRows<kType, 7>(nk, dk, krow, ksc, q, ldq, s, lds); break;
#if HWY_TARGET != HWY_SCALAR
      default:
        if constexpr (kType == kF32) {
          ScoresRowsQuads<kType>(nk, dk, krow, ksc, q, ldq, s, lds);
          ScoresRowsQuads<kType>(nk, dk, krow, ksc, q + 4 * ldq, ldq, s + 4 * lds, lds);
        } else {
          ScoresRowsPairs<kType, 8>(nk, dk, krow, ksc, q, ldq, s, lds);
        }
        break;
#else
      default: ScoresRows<kType, 8>(nk, dk, krow, ksc, q, ldq, s, lds); break;
#endif
    }
  }
}

void Scores(int type, size_t nk, size_t rows, size_t dk, const void* const* krow, const float* const* ksc,
            const float* Q, size_t ldq, float* S, size_t lds) {
  WithType(type, [&](auto t) { ScoresT<decltype(t)::value>(nk, rows, dk, krow, ksc, Q, ldq, S, lds); });
}

}  // namespace attnscale::detail::kv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnscale::detail::kv {
HWY_EXPORT(Scores);

void scores(int type, std::size_t nk, std::size_t rows, std::size_t dk, const void* const* krow,
            const float* const* ksc, const float* Q, std::size_t ldq, float* S, std::size_t lds) {
  HWY_DYNAMIC_DISPATCH(Scores)(type, nk, rows, dk, krow, ksc, Q, ldq, S, lds);
}
}  // namespace attnscale::detail::kv
#endif  // HWY_ONCE
