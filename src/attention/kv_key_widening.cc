// widen and scores_quads_widening (kv_kernels.h): bfloat16, float16 and int8 key rows as float32 for
// the GQA scores, a whole tile (widen) or, on 8-lane targets, a chunk of keys at a time just before
// the products read them (kv_quad_keys-inl.h's KeyChunks8). Compiled once per Highway target like
// kernels.cc.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kv_key_widening.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

#include "attention/kv_kernels.h"
#include "attention/kv_quad_keys-inl.h"
#include "attention/kv_rows-inl.h"
#include "common/prefetch.h"

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::kv::HWY_NAMESPACE {

#if HWY_TARGET != HWY_SCALAR
// bf16, float16 and int8 K rows on 8-lane targets (AVX2), which do not read them in place
// (scores_quads_widening, kv_kernels.h): KeyChunks8 on the chunk's keys widened (LoadRow's values)
// into buf, rows of dk floats from a line's start, just before the products read them. A chunk's
// rows (6 KiB at d = 128, 24 KiB at d = 512) stay in L1 from their stores to their loads; a whole
// tile widened first (32 KiB of float32 at d = 128, all of Zen 3's L1) missed L1 with its stores
// and was read back from L2. The products and their order are those of the widened tile.
template <int kType>
HWY_INLINE void WidenedKeyChunks(size_t nk, size_t rows, size_t dk, const void* const* krow, const float* const* ksc,
                                 const float* packed, float* buf, float* S, size_t lds, LineFeed& feed) {
  const DF d;
  const size_t L = hn::Lanes(d), full = dk / L * L, ldb = widening_row(dk);
  buf += (16 - reinterpret_cast<std::uintptr_t>(buf) / sizeof(float) % 16) % 16;  // to a line's start
  const float* rows_x[kWideningKeys];
  for (size_t x = 0; x < kWideningKeys; ++x) rows_x[x] = buf + x * ldb;
  KeyChunks8(nk, rows, dk, packed, S, lds, feed, [&](size_t j0, size_t nx) HWY_ATTR __attribute__((always_inline)) {
    for (size_t x = 0; x < nx; ++x) {
      const size_t j = j0 + x < nk ? j0 + x : nk - 1;
      const void* row = krow[j];
      const float* sc = ksc ? ksc[j] : nullptr;
      float* out = buf + x * ldb;
      if constexpr (kType == kI8) {  // dk % 32 == 0: a block's scale broadcast once (LoadRow's product)
        for (size_t c = 0; c < dk; c += 32) {
          const VF s = hn::Set(d, sc[c / 32]);
#pragma GCC unroll 4
          for (size_t e = c; e < c + 32; e += L) hn::Store(hn::Mul(LoadRaw<kI8>(d, row, e), s), d, out + e);
        }
      } else {
        size_t c = 0;
        for (; c + 4 * L <= full; c += 4 * L) {
#pragma GCC unroll 4
          for (size_t e = c; e < c + 4 * L; e += L) hn::Store(LoadRow<kType>(d, row, sc, e), d, out + e);
        }
        for (; c < full; c += L) hn::Store(LoadRow<kType>(d, row, sc, c), d, out + c);
        for (c = full; c < dk; ++c) out[c] = Element<kType>(row, sc, c);
      }
    }
    return static_cast<const float* const*>(rows_x);
  });
}

// ScoresQuadsT's 8-lane paths (TripleKeys8 for 5-8 rows, QuadKeys8 for up to 4), the feed paced
// alike, on rows widened a chunk of keys at a time.
template <int kType>
HWY_NOINLINE void ScoresWidening8(size_t nk, size_t rows, size_t dk, const void* const* krow, const float* const* ksc,
                                  const float* packed, float* S, size_t lds, LineFeed& feed, float* buf) {
  if constexpr (hn::MaxLanes(DF()) == 8) {
    WidenedKeyChunks<kType>(nk, rows, dk, krow, ksc, packed, buf, S, lds, feed);
  } else {
    (void)nk, (void)rows, (void)dk, (void)krow, (void)ksc, (void)packed, (void)S, (void)lds, (void)feed, (void)buf;
  }
}
#endif

// widen (kv_kernels.h): each row as float32, L lanes at a time (LoadRow), the tail element by element.
template <int kType>
void WidenT(size_t nk, size_t d, const void* const* row, const float* const* sc, float* out, size_t ldo) {
  const DF df;
  const size_t L = hn::Lanes(df), full = d / L * L;
  for (size_t j = 0; j < nk; ++j) {
    const float* s = sc ? sc[j] : nullptr;
    for (size_t c = 0; c < full; c += L) hn::StoreU(LoadRow<kType>(df, row[j], s, c), df, out + j * ldo + c);
    for (size_t c = full; c < d; ++c) out[j * ldo + c] = Element<kType>(row[j], s, c);
  }
}
void Widen(int type, size_t nk, size_t d, const void* const* row, const float* const* sc, float* out, size_t ldo) {
  WithType(type, [&](auto t) { WidenT<decltype(t)::value>(nk, d, row, sc, out, ldo); });
}
void ScoresWidening(int type, size_t nk, size_t rows, size_t dk, const void* const* krow, const float* const* ksc,
                    const float* packed, float* S, size_t lds, LineFeed& feed, float* buf) {
#if HWY_TARGET != HWY_SCALAR
  WithType(type, [&](auto t) { ScoresWidening8<decltype(t)::value>(nk, rows, dk, krow, ksc, packed, S, lds, feed, buf); });
#else
  (void)type, (void)nk, (void)rows, (void)dk, (void)krow, (void)ksc, (void)packed, (void)S, (void)lds, (void)feed, (void)buf;
#endif
}

}  // namespace attnscale::detail::kv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnscale::detail::kv {
HWY_EXPORT(Widen);
HWY_EXPORT(ScoresWidening);

void widen(int type, std::size_t nk, std::size_t d, const void* const* row, const float* const* sc, float* out,
           std::size_t ldo) {
  HWY_DYNAMIC_DISPATCH(Widen)(type, nk, d, row, sc, out, ldo);
}
void scores_quads_widening(int type, std::size_t nk, std::size_t rows, std::size_t dk, const void* const* krow,
                           const float* const* ksc, const float* packed, float* S, std::size_t lds, LineFeed& feed,
                           float* buf) {
  HWY_DYNAMIC_DISPATCH(ScoresWidening)(type, nk, rows, dk, krow, ksc, packed, S, lds, feed, buf);
}
std::size_t widened_keys() { return rows_in_place() ? 16 : kTileKeys; }
}  // namespace attnscale::detail::kv
#endif  // HWY_ONCE
