// Per-target pieces of one query row's online softmax over cache keys, shared by the one-row stream
// (kv_stream_row.cc) and the heads side by side (kv_stream_heads.cc), so that both give the same
// bits: a key's score (KeyScore; Scores4 for four keys, StreamScore for the stream's row kinds), the
// score transforms, a key's and a tile's softmax step (SoftmaxStep, TileSoftmax), the pair order of
// bfloat16 rows, and the scalar target's key-by-key stream (StreamRowT).
#if defined(ATTNSCALE_ATTENTION_KV_ROW_STREAM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNSCALE_ATTENTION_KV_ROW_STREAM_INL_H_
#undef ATTNSCALE_ATTENTION_KV_ROW_STREAM_INL_H_
#else
#define ATTNSCALE_ATTENTION_KV_ROW_STREAM_INL_H_
#endif

#include <hwy/highway.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "attention/alibi.h"
#include "attention/exp2-inl.h"
#include "attention/kv_kernels.h"
#include "attention/kv_rows-inl.h"
#include "attention/lane_reduce-inl.h"
#include "attention/raw_vectors-inl.h"
#include "attention/softcap-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::kv::HWY_NAMESPACE {
// One key's score s = Q·K_j (two accumulators, as ScoresRows), then its online-softmax step:
// alpha rescales what was summed before, p weighs this key.
template <int kType>
HWY_INLINE float KeyScore(DF d, size_t dk, const void* krow, const float* ks, const float* Q) {
  const size_t L = hn::Lanes(d), full = dk / L * L;
  VF a0 = hn::Zero(d), a1 = hn::Zero(d);
  size_t c = 0;
  for (; c + 2 * L <= full; c += 2 * L) {
    a0 = hn::MulAdd(LoadRow<kType>(d, krow, ks, c), hn::LoadU(d, Q + c), a0);
    a1 = hn::MulAdd(LoadRow<kType>(d, krow, ks, c + L), hn::LoadU(d, Q + c + L), a1);
  }
  if (c < full) a0 = hn::MulAdd(LoadRow<kType>(d, krow, ks, c), hn::LoadU(d, Q + c), a0);
  float s = LaneSum(d, hn::Add(a0, a1));
  for (size_t e = full; e < dk; ++e) s += Q[e] * Element<kType>(krow, ks, e);
  return s;
}
HWY_INLINE void SoftmaxStep(float s, float& m, float& l, float& alpha, float& p) {
  alpha = 1.0f;
  if (s > m) {  // a new maximum: the output so far is rescaled (e^(-inf) = 0 before the first key)
    alpha = std::exp(m - s);
    m = s;
  }
  // While every score is -inf, m stays -inf and e^(s − m) would be NaN: subtract 0 instead (P = 0).
  p = std::exp(s - (m == -INFINITY ? 0.0f : m));
  l = alpha * l + p;
}

// The row's score transforms (RowTransform) on scores s[x] of the call's keys j + x, x < n: the cap
// as simd::softcap computes it (softcap-inl.h), over whole vectors (s holds n rounded up to the
// lane count), ALiBi's distance as the tile path subtracts it.
HWY_INLINE void TransformScores(DF d, float* s, size_t j, size_t n, const RowTransform& tf) {
  if (tf.cap > 0.0f) {
    const size_t L = hn::Lanes(d);
    const VF cap = hn::Set(d, tf.cap), inv = hn::Set(d, 1.0f / tf.cap);
    for (size_t x = 0; x < n; x += L)
      hn::StoreU(hn::Mul(cap, detail::HWY_NAMESPACE::CapTanh(d, hn::LoadU(d, s + x), inv)), d, s + x);
  }
  if (tf.slope != 0.0f) subtract_alibi(s, static_cast<std::int64_t>(n), 1, tf.slope, tf.diag - static_cast<std::int64_t>(j));
}

// Keys one at a time, any dv: the output row in O between keys.
template <int kType, class R, class S>
void StreamRowT(size_t nk, size_t dk, size_t dv, R krow, S ksc, R vrow, S vsc, const float* Q, float* m, float* l,
                float* O, const RowTransform* tf) {
  const DF d;
  const size_t L = hn::Lanes(d), fullv = dv / L * L;
  float mm = *m, ll = *l;
  for (size_t j = 0; j < nk; ++j) {
    const float* vs = vsc ? vsc[j] : nullptr;
    float alpha, p;
    HWY_ALIGN float s[hn::MaxLanes(DF())] = {KeyScore<kType>(d, dk, krow[j], ksc ? ksc[j] : nullptr, Q)};
    if (tf) TransformScores(d, s, j, 1, *tf);  // on a whole vector: its other lanes are 0
    SoftmaxStep(s[0], mm, ll, alpha, p);
    const VF va = hn::Set(d, alpha), vp = hn::Set(d, p);
    for (size_t e = 0; e < fullv; e += L) {
      const VF o = alpha == 1.0f ? hn::LoadU(d, O + e) : hn::Mul(hn::LoadU(d, O + e), va);
      hn::StoreU(hn::MulAdd(vp, LoadRow<kType>(d, vrow[j], vs, e), o), d, O + e);
    }
    for (size_t e = fullv; e < dv; ++e) O[e] = O[e] * alpha + p * Element<kType>(vrow[j], vs, e);
  }
  *m = mm;
  *l = ll;
}

#if HWY_TARGET != HWY_SCALAR
// The scores of four keys, lane x = Q·K_x. An int8 row's score is Σ_b scale_b·(Q·K)_b over its
// blocks b of 32 (dk is a multiple of 32 for int8): one multiply by the scale per block, not per
// vector. Other types: two accumulators per key (even and odd vectors), as KeyScore. With NK = 1,
// one key's score in lane 0 with the same bits (a key's lane of the four-way reduction depends on
// its own sums alone).
template <int kType, size_t NK = 4, class R, class S>
HWY_INLINE hn::Vec<hn::Full128<float>> Scores4(DF d, size_t dk, R krow, S ksc, const float* Q) {
  static_assert(NK == 4 || NK == 1);
  const size_t L = hn::Lanes(d), full = dk / L * L;
  VF acc[NK];
  if constexpr (kType == kI8) {
    for (size_t x = 0; x < NK; ++x) acc[x] = hn::Zero(d);
    for (size_t c = 0; c < dk; c += 32) {
      VF t[NK];
      const VF q0 = hn::LoadU(d, Q + c);
      for (size_t x = 0; x < NK; ++x) t[x] = hn::Mul(LoadRaw<kI8>(d, krow[x], c), q0);
      for (size_t e = c + L; e < c + 32; e += L) {
        const VF q = hn::LoadU(d, Q + e);
        for (size_t x = 0; x < NK; ++x) t[x] = hn::MulAdd(LoadRaw<kI8>(d, krow[x], e), q, t[x]);
      }
      for (size_t x = 0; x < NK; ++x) acc[x] = hn::MulAdd(hn::Set(d, ksc[x][c / 32]), t[x], acc[x]);
    }
  } else {
    VF odd[NK];
    for (size_t x = 0; x < NK; ++x) acc[x] = odd[x] = hn::Zero(d);
    size_t c = 0;
    for (; c + 2 * L <= full; c += 2 * L) {
      const VF q0 = hn::LoadU(d, Q + c), q1 = hn::LoadU(d, Q + c + L);
      for (size_t x = 0; x < NK; ++x) {
        acc[x] = hn::MulAdd(LoadRaw<kType>(d, krow[x], c), q0, acc[x]);
        odd[x] = hn::MulAdd(LoadRaw<kType>(d, krow[x], c + L), q1, odd[x]);
      }
    }
    if (c < full) {
      const VF q0 = hn::LoadU(d, Q + c);
      for (size_t x = 0; x < NK; ++x) acc[x] = hn::MulAdd(LoadRaw<kType>(d, krow[x], c), q0, acc[x]);
    }
    for (size_t x = 0; x < NK; ++x) acc[x] = hn::Add(acc[x], odd[x]);
  }
  const hn::Full128<float> d4;
  auto s = Sum4(d, acc[0], acc[1 % NK], acc[2 % NK], acc[3 % NK]);
  if (full < dk) {  // float32 / bf16 rows whose length is not a whole number of vectors
    HWY_ALIGN float tail[4] = {0, 0, 0, 0};
    for (size_t x = 0; x < NK; ++x)
      for (size_t e = full; e < dk; ++e) tail[x] += Q[e] * Element<kType>(krow[x], nullptr, e);
    s = hn::Add(s, hn::Load(d4, tail));
  }
  return s;
}

// A tile of stream_row_strided on vector targets: kStreamKeys keys, their scores as one vector (on
// 16-lane targets; two or four on narrower ones), one online-softmax step with the tile's
// exponentials in a vector exp, then the output row by the tile's V rows. The tiles start at the
// first key of the call, so a key's tile (and the result's bits) follow from its position alone.
constexpr size_t kStreamKeys = 16;

// Scores of the tile's keys [x0, x1) into s: four at a time (Scores4) from x0 (a multiple of 4)
// while four remain, the keys past the last four one at a time (KeyScore).
template <int kType, class R, class S>
HWY_INLINE void TileScores(DF d, size_t x0, size_t x1, size_t dk, R krow, S ksc,
                           const float* Q, float* s) {
  const hn::Full128<float> d4;
  size_t x = x0;
  for (; x + 4 <= x1; x += 4) hn::Store(Scores4<kType>(d, dk, krow + x, ksc ? ksc + x : S(), Q), d4, s + x);
  for (; x < x1; ++x) s[x] = KeyScore<kType>(d, dk, krow[x], ksc ? ksc[x] : nullptr, Q);
}

// The tile's online-softmax step: M = max(m, max_x s_x); alpha = e^(m − M) rescales what was
// summed before; p_x = e^(s_x − M) (ExpDiff, exp2-inl.h) written over s; l = alpha·l + Σ_x p_x.
// Lanes past the tile's nk keys are set to -inf first (p = 0). As in SoftmaxStep, while every
// score is -inf the exponent subtracts 0 instead of M (P = 0, not NaN). Returns alpha.
HWY_INLINE float TileSoftmax(DF d, size_t nk, float* s, float& m, float& l) {
  for (size_t x = nk; x < kStreamKeys; ++x) s[x] = -INFINITY;
  const size_t L = hn::Lanes(d);  // 4, 8 or 16: divides kStreamKeys
  VF mx = hn::Load(d, s);
  for (size_t i = L; i < kStreamKeys; i += L) mx = hn::Max(mx, hn::Load(d, s + i));
  const float bm = hn::GetLane(hn::MaxOfLanes(d, mx));
  float alpha = 1.0f;
  if (bm > m) {
    alpha = std::exp(m - bm);
    m = bm;
  }
  const VF mu = hn::Set(d, m == -INFINITY ? 0.0f : m);
  VF sum = hn::Zero(d);
  for (size_t i = 0; i < kStreamKeys; i += L) {
    const VF p = detail::HWY_NAMESPACE::ExpBelowMax(d, hn::Load(d, s + i), mu);
    sum = hn::Add(sum, p);
    hn::Store(p, d, s + i);
  }
  l = alpha * l + LaneSum(d, sum);
  return alpha;
}

// out = x (n elements, a multiple of 2L) in pair order: out[c + i] = x[c + 2i], out[c + L + i] =
// x[c + 2i + 1] for each chunk c; RowOrder undoes it.
HWY_INLINE void PairOrder(size_t L, const float* x, size_t n, float* out) {
  for (size_t c = 0; c < n; c += 2 * L)
    for (size_t i = 0; i < L; ++i) {
      out[c + i] = x[c + 2 * i];
      out[c + L + i] = x[c + 2 * i + 1];
    }
}
HWY_INLINE void RowOrder(size_t L, const float* x, size_t n, float* out) {
  for (size_t c = 0; c < n; c += 2 * L)
    for (size_t i = 0; i < L; ++i) {
      out[c + 2 * i] = x[c + i];
      out[c + 2 * i + 1] = x[c + L + i];
    }
}

// A key's score in the one-row stream of rows of kDk values (StreamKeys, StreamHeads; kDk = 0:
// dk given): KeyScore's, but bfloat16 rows of kDk = an even number of vectors in pair order (q in
// pair order, PairOrder), and int8 rows one product sum per block of 32 values times its scale,
// even and odd blocks in two sums.
template <int kType, size_t kDk>
constexpr bool PairScores() {
  return kType == kBF16 && kDk > 0 && (kDk / hn::MaxLanes(DF())) % 2 == 0;
}
// An int8 key's score before its lane sum (StreamScore is LaneSum of it).
template <size_t kDk>
HWY_INLINE VF Int8ScoreLanes(DF d, size_t dk, const void* row, const float* sc, const float* q) {
  constexpr size_t L = hn::MaxLanes(DF());
  constexpr size_t kPer = 32 / L;  // vectors of one block
  const size_t blocks = (kDk ? kDk : dk) / 32;
  VF a0 = hn::Zero(d), a1 = hn::Zero(d);
#pragma GCC unroll 16
  for (size_t b = 0; b < blocks; ++b) {
    VF t = hn::Mul(LoadRaw<kI8>(d, row, b * 32), hn::LoadU(d, q + b * 32));
#pragma GCC unroll 4
    for (size_t e = 1; e < kPer; ++e)
      t = hn::MulAdd(LoadRaw<kI8>(d, row, b * 32 + e * L), hn::LoadU(d, q + b * 32 + e * L), t);
    if (b % 2 == 0) a0 = hn::MulAdd(hn::Set(d, sc[b]), t, a0);
    else a1 = hn::MulAdd(hn::Set(d, sc[b]), t, a1);
  }
  return hn::Add(a0, a1);
}
template <int kType, size_t kDk>
HWY_INLINE float StreamScore(DF d, size_t dk, const void* row, const float* sc, const float* q) {
  constexpr size_t L = hn::MaxLanes(DF());
  if constexpr (PairScores<kType, kDk>()) {
    (void)sc, (void)dk;
    VF a0 = hn::Zero(d), a1 = hn::Zero(d);
#pragma GCC unroll 16
    for (size_t c = 0; c < kDk; c += 2 * L) {
      const auto w = LoadPairs(row, c);
      a0 = hn::MulAdd(PairLow(d, w), hn::Load(d, q + c), a0);
      a1 = hn::MulAdd(PairHigh(d, w), hn::Load(d, q + c + L), a1);
    }
    return LaneSum(d, hn::Add(a0, a1));
  } else if constexpr (kType != kI8) {
    (void)sc;
    return KeyScore<kType>(d, kDk ? kDk : dk, row, nullptr, q);
  } else {
    return LaneSum(d, Int8ScoreLanes<kDk>(d, dk, row, sc, q));
  }
}
#endif

}  // namespace attnscale::detail::kv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
