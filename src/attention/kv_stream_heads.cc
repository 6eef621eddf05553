// stream_heads (kv_kernels.h): one query row for each of several KV heads whose rows of a key lie
// together (a paged or FlashAttention-layout cache), the keys read in address order, each head with
// stream_row_strided's arithmetic (kv_row_stream-inl.h). Compiled once per Highway target like
// kernels.cc.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kv_stream_heads.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "attention/kv_kernels.h"
#include "attention/kv_row_stream-inl.h"
#include "attention/kv_rows-inl.h"
#include "common/prefetch.h"

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::kv::HWY_NAMESPACE {

#if HWY_TARGET != HWY_SCALAR
// stream_heads (kv_kernels.h): one query row for each of several KV heads whose rows of a key lie
// together, each head with stream_row_strided's arithmetic, but the keys read in address order:
// key x's K rows of all heads (one run of memory where the heads' rows touch), then its V rows. A
// head's own rows lie a run's length apart (4 KiB for 8 heads of 128 float32 values), a stride
// the hardware prefetcher does not follow: head by head, a paged or FlashAttention-layout cache
// read at about half of a contiguous cache's rate (docs/performance.md).
// Same bits as stream_row_strided on the same keys, on every target: its tiles of kStreamKeys keys from
// the call's first, the same scores (kQuads: StreamTiles', Scores4's sums for keys of whole groups
// of four, KeyScore's for the rest; else StreamKeys', StreamScore with dk = kDk), the same softmax
// step per tile (TileSoftmax), and each output element's sum in the same order (alpha·O, then
// p_x·V_x key by key, as TileUpdate and TileUpdateRow: a multiply-add per vector element with an
// int8 row's coefficient p_x·scale_b, a multiply and an add past the last whole vector).
// The output rows stay in memory (heads·dv floats, in L1), loaded and stored around each key:
// several keys a step per head read V rows out of address order again, and lost (bf16 d = 128
// 1.45 -> 1.19 of a contiguous cache's time with one key, int8 1.77 -> 1.34; docs/performance.md).
template <int kType, size_t kDk, bool kQuads>
HWY_INLINE void StreamHeadsT(size_t nk, size_t heads, size_t dk, size_t dv, const HeadRows& K, const HeadRows& V,
                             const HeadRow* hr, size_t ahead, size_t known, float* work) {
  const DF d;
  constexpr size_t L = hn::MaxLanes(DF()), kT = kStreamKeys;
  constexpr bool kPairs = !kQuads && PairScores<kType, kDk>();
  constexpr size_t kPer = kType == kI8 ? 32 / L : 1;  // vectors of one coefficient of V
  const size_t fullv = dv / L * L;
  // [2][heads][kT]: the scores of tile t, then t + 1's, from the first 64-byte boundary of work
  // (whole vectors, as TileSoftmax and StreamScore load them).
  float* const s = reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(work) + 63) / 64 * 64);
  float* const qp = s + 2 * heads * kT;  // kPairs: each head's q in pair order
  std::fill_n(s, 2 * heads * kT, 0.0f);  // defined lanes past a short tile (transforms read them)
  if constexpr (kPairs)
    for (size_t h = 0; h < heads; ++h) PairOrder(L, hr[h].q, kDk, qp + h * kDk);
  const auto q_of = [&](size_t h) { return kPairs ? qp + h * kDk : hr[h].q; };
  const auto row = [](const HeadRows& R, size_t j, size_t h) {
    return static_cast<const void*>(static_cast<const char*>(R.row[j]) + static_cast<std::ptrdiff_t>(h) * R.head);
  };
  const auto scales = [](const HeadRows& R, size_t j, size_t h) -> const float* {
    return kType == kI8 ? R.scales[j] + static_cast<std::ptrdiff_t>(h) * R.scales_head : nullptr;
  };
  // The scores of key x of the tile of n keys from key j, each head's (into st + x, a row of kT
  // per head).
  const auto score = [&](size_t j, size_t x, size_t n, float* st) HWY_ATTR {
    for (size_t h = 0; h < heads; ++h) {
      const void* const kr = row(K, j + x, h);
      const float* const ks = scales(K, j + x, h);
      if constexpr (kQuads) {
        const float* const* kss = kType == kI8 ? &ks : nullptr;
        st[h * kT + x] = x < n / 4 * 4 ? hn::GetLane(Scores4<kType, 1>(d, dk, &kr, kss, q_of(h)))
                                       : KeyScore<kType>(d, dk, kr, ks, q_of(h));
      } else {
        st[h * kT + x] = StreamScore<kType, kDk>(d, dk, kr, ks, q_of(h));
      }
    }
  };
  // O_h += p_h·V_h of key j for each head (p_h at p[h·kT]).
  const auto update = [&](size_t j, const float* p) HWY_ATTR {
    for (size_t h = 0; h < heads; ++h) {
      const void* const vr = row(V, j, h);
      const float* const vs = scales(V, j, h);
      const float ph = p[h * kT];
      float* const o = hr[h].o;
      for (size_t e0 = 0; e0 < fullv; e0 += kPer * L) {
        const VF cf = hn::Set(d, kType == kI8 ? ph * vs[e0 / 32] : ph);
#pragma GCC unroll 4
        for (size_t e = e0; e < e0 + kPer * L; e += L)
          hn::StoreU(hn::MulAdd(cf, LoadRaw<kType>(d, vr, e), hn::LoadU(d, o + e)), d, o + e);
      }
      for (size_t e = fullv; e < dv; ++e) o[e] += ph * Element<kType>(vr, nullptr, e);  // not int8 (dv % 32 == 0)
    }
  };
  // The K and V rows of all heads of key j (and int8 scales), when given (j < known).
  const size_t esize = kType == kF32 ? 4 : kType == kI8 ? 1 : 2;
  const std::int64_t k_run = static_cast<std::int64_t>((heads - 1) * static_cast<size_t>(K.head) + dk * esize);
  const std::int64_t v_run = static_cast<std::int64_t>((heads - 1) * static_cast<size_t>(V.head) + dv * esize);
  const CacheLevel level = feed_level();  // L2 on Intel's cores (prefetch.cc)
  const auto prefetch = [&](size_t j) {
    if (j >= known) return;
    prefetch_bytes(K.row[j], k_run, level);
    prefetch_bytes(V.row[j], v_run, level);
    if constexpr (kType == kI8) {
      prefetch_line(K.scales[j], CacheLevel::near);
      prefetch_line(V.scales[j], CacheLevel::near);
    }
  };
  const size_t first = nk < kT ? nk : kT;
  for (size_t x = 0; x < first; ++x) score(0, x, first, s);
  for (size_t j = 0, t = 0; j < nk; j += kT, t ^= 1) {
    const size_t n = nk - j < kT ? nk - j : kT;
    const size_t rest = nk - j - n, next = rest < kT ? rest : kT;
    float* const st = s + t * heads * kT;
    float* const sn = s + (t ^ 1) * heads * kT;
    for (size_t h = 0; h < heads; ++h) {
      float* const sh = st + h * kT;
      if (hr[h].tf) TransformScores(d, sh, j, kT, *hr[h].tf);
      const float alpha = TileSoftmax(d, n, sh, *hr[h].m, *hr[h].l);
      float* const o = hr[h].o;
      if (alpha != 1.0f)
        for (size_t e = 0; e < fullv; e += L) hn::StoreU(hn::Mul(hn::LoadU(d, o + e), hn::Set(d, alpha)), d, o + e);
      for (size_t e = fullv; e < dv; ++e) o[e] *= alpha;
    }
    // Key x of the next tile scored beside key x of this one updating, so that K and V stream
    // side by side (as StreamKeys and StreamTiles do).
    for (size_t x = 0; x < n; ++x) {
      if (ahead) prefetch(j + x + ahead);
      if (x < next) score(j + kT, x, next, sn);
      update(j + x, st + x);
    }
  }
}

template <int kType>
HWY_INLINE void StreamHeadsDispatch(size_t nk, size_t heads, size_t dk, size_t dv, const HeadRows& K,
                                    const HeadRows& V, const HeadRow* hr, size_t ahead, size_t known, float* work) {
  const size_t L = hn::Lanes(DF());
  // As StreamRowSteps chooses: StreamKeys' scores where it takes the rows, with dk a constant
  // (StreamKeysFor) for int8 and dk = dv; else StreamTiles'.
  if (dk == dv || kType != kI8) {
    const auto keys = [&](auto cb) HWY_ATTR {
      constexpr size_t kDv = decltype(cb)::value * hn::MaxLanes(DF());
      if (kType == kI8 || dk == kDv)
        return StreamHeadsT<kType, kDv, false>(nk, heads, dk, dv, K, V, hr, ahead, known, work);
      if constexpr (kType != kI8) StreamHeadsT<kType, 0, false>(nk, heads, dk, dv, K, V, hr, ahead, known, work);
    };
    if constexpr (kAccumulators >= 16)
      if (dv == 16 * L) return keys(std::integral_constant<size_t, 16>());
    if (dv == 8 * L) return keys(std::integral_constant<size_t, 8>());
    if (dv == 4 * L) return keys(std::integral_constant<size_t, 4>());
  }
  // StreamTiles: float32 rows on 8 lanes (the output row in memory) score key by key, others in
  // groups of four.
  if (hn::MaxLanes(DF()) == 8 && kType == kF32)
    return StreamHeadsT<kType, 0, false>(nk, heads, dk, dv, K, V, hr, ahead, known, work);
  StreamHeadsT<kType, 0, true>(nk, heads, dk, dv, K, V, hr, ahead, known, work);
}
#endif

void StreamHeads(int type, size_t nk, size_t heads, size_t dk, size_t dv, const HeadRows& k, const HeadRows& v,
                 const HeadRow* rows, size_t ahead, size_t known, float* work) {
#if HWY_TARGET != HWY_SCALAR
  WithType(type, [&](auto t) {
    StreamHeadsDispatch<decltype(t)::value>(nk, heads, dk, dv, k, v, rows, ahead, known, work);
  });
#else
  // The scalar target's stream is key by key (StreamRowT): head by head, the same sums.
  (void)work, (void)ahead, (void)known;
  struct Of {  // head h's rows (or int8 scales) of each key
    const HeadRows* R;
    size_t h;
    const void* operator[](size_t j) const {
      return static_cast<const char*>(R->row[j]) + static_cast<std::ptrdiff_t>(h) * R->head;
    }
  };
  struct ScalesOf {
    const HeadRows* R;
    size_t h;
    const float* operator[](size_t j) const { return R->scales[j] + static_cast<std::ptrdiff_t>(h) * R->scales_head; }
    explicit operator bool() const { return R != nullptr; }
  };
  for (size_t h = 0; h < heads; ++h) {
    const ScalesOf ks{type == kI8 ? &k : nullptr, h}, vs{type == kI8 ? &v : nullptr, h};
    WithType(type, [&](auto t) {
      StreamRowT<decltype(t)::value>(nk, dk, dv, Of{&k, h}, ks, Of{&v, h}, vs, rows[h].q, rows[h].m, rows[h].l,
                                     rows[h].o, rows[h].tf);
    });
  }
#endif
}

}  // namespace attnscale::detail::kv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnscale::detail::kv {
HWY_EXPORT(StreamHeads);

void stream_heads(int type, std::size_t nk, std::size_t heads, std::size_t dk, std::size_t dv, const HeadRows& k,
                  const HeadRows& v, const HeadRow* rows, std::size_t ahead, std::size_t known, float* work) {
  HWY_DYNAMIC_DISPATCH(StreamHeads)(type, nk, heads, dk, dv, k, v, rows, ahead, known, work);
}
}  // namespace attnscale::detail::kv
#endif  // HWY_ONCE
