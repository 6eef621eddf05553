// The tiled forward with online softmax, for one block of query rows over one range of keys.
// Used by forward() (all keys at once) and by decode (keys split into chunks, merged by LSE).
//
// Per query row, over key tiles of kBc (scores t_j = s·q·k_j + bias_j, natural units):
//   m' = max(m, max_j t_j);  P_j = e^(t_j − m');  l' = e^(m − m')·l + Σ_j P_j;
//   o' = e^(m − m')·o + Σ_j P_j v_j
// and at the end out = o / l, lse = m + ln l (each e^(t − m) as in ExpDiff, kernels-inl.h). The N x N matrix never exists: a thread
// holds one block's Qᵀ (dk x kBr), one score tile (kBc x kBr), o (kBr x dv) and m, l.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attention/params.h"
#include "attention/score_transforms.h"
#include "attention/tiles.h"
#include "common/bfloat_rows.h"
#include "common/prefetch.h"

namespace attnscale::detail {

// Blocks of at most this many rows compute their scores one dot product per (key, row)
// (dot_tile) instead of by the GEMM kernel, whose 16-lane columns they would mostly leave empty.
inline constexpr std::int64_t kDotRows = 4;

template <class T>
struct ForwardScratch {
  static constexpr std::int64_t ld = kBr;  // columns of Qᵀ and of score tiles (queries)
  Buffer<T> qt, qr, st, o, kp, vp, m, l, alpha, sub, mul;
  // keys: the most keys a tile holds (the bf16 forward's tiles are longer than kBc).
  explicit ForwardScratch(const Params& p, std::int64_t keys = kBc)
      : qt(p.dk * ld), qr(kDotRows * p.dk), st(kBc * ld), o(ld * p.dv), kp(keys * p.dk), vp(keys * p.dv), m(ld), l(ld),
        alpha(ld), sub(ld), mul(ld), dk(p.dk), dv(p.dv) {}
  // The bytes of those buffers, in the constructor's order (forward_scratch.h).
  static std::int64_t bytes(std::int64_t dk, std::int64_t dv, std::int64_t keys = kBc) {
    return (dk * ld + kDotRows * dk + kBc * ld + ld * dv + keys * dk + keys * dv + 5 * ld) *
           static_cast<std::int64_t>(sizeof(T));
  }
  std::int64_t dk, dv;
  // When set (forward_all; misaligned or gapped V, gapped K): the V (K) rows of the block's head,
  // 64-byte aligned, row stride v_ld (k_ld) (AlignedRows, tiles.h); attend() reads them instead of
  // the view's.
  const T* v_rows = nullptr;
  const T* k_rows = nullptr;
  std::int64_t v_ld = 0, k_ld = 0;
  bool fits(const Params& p) const { return p.dk == dk && p.dv == dv; }  // reusable for p (PerThread)
};

// Columns of the score tile in use: the block's rows rounded up to the widest SIMD width (a
// decode block of one row computes 16 columns, not kBr).
inline std::int64_t columns(const RowBlock& rb) { return round_up(std::max<std::int64_t>(rb.n, 1), simd::kColumnPad); }

// Score tile St[j - j0][r] = s·q_r·k_j + bias_rj for keys [j0, j1), masked pairs -inf.
template <class T>
void score_tile(const Params& p, const RowBlock& rb, std::int64_t j0, std::int64_t j1, TileKind kind,
                ForwardScratch<T>& s) {
  const std::int64_t nk = j1 - j0;
  const StridedOperand k = s.k_rows ? StridedOperand{s.k_rows + j0 * s.k_ld, s.k_ld, 1}
                                    : strided_operand<T>(p.k, rb.b, rb.kh, j0, nk, p.dk, s.kp.get());
  const T* K = static_cast<const T*>(k.ptr);
  if (std::is_same_v<T, float> && kind == TileKind::partial) {
    // Strips of kColumnPad keys, each against the groups of query columns that see one of its keys
    // (a causal diagonal tile: 10 of its 16 strip-group products). The rest is masked below; a
    // score's operations do not depend on how the tile is cut (gemm), so the same bits.
    rb.groups.each_strip(j0, j1, [&](std::int64_t ja, std::int64_t jb, std::int64_t c0, std::int64_t c1) {
      Ops<T>::forward_gemm(jb - ja, std::min(c1, columns(rb)) - c0, p.dk, K + (ja - j0) * k.rs, k.rs, k.cs,
                           s.qt.get() + c0, s.ld, s.st.get() + (ja - j0) * s.ld + c0, s.ld, simd::kOverwrite);
    });
  } else {
    Ops<T>::forward_gemm(nk, columns(rb), p.dk, K, k.rs, k.cs, s.qt.get(), s.ld, s.st.get(), s.ld, simd::kOverwrite);
  }
  if (p.transforms_scores()) transform_scores(p, rb, j0, nk, s.st.get(), 1, s.ld);
  if (kind == TileKind::partial) apply_mask(p, rb, j0, j1, s.st.get(), s.ld);
}

// The same scores for a block of at most kDotRows rows, in row layout S[r][j - j0] (row stride
// kBc): one dot product per (key, row) from the Q rows in s.qr, each key row read once.
template <class T>
void score_rows(const Params& p, const RowBlock& rb, std::int64_t j0, std::int64_t j1, TileKind kind,
                ForwardScratch<T>& s) {
  const std::int64_t nk = j1 - j0;
  const Operand k = rows_operand<T>(p.k, rb.b, rb.kh, j0, nk, p.dk, s.kp.get());
  Ops<T>::dot_tile(nk, rb.n, p.dk, static_cast<const T*>(k.ptr), k.ld, s.qr.get(), p.dk, s.st.get(), kBc);
  if (p.transforms_scores()) transform_scores(p, rb, j0, nk, s.st.get(), kBc, 1);
  if (kind == TileKind::partial) apply_mask_rows(p, rb, j0, j1, s.st.get(), kBc);
}

// o = alpha·o + P·V for a partial tile whose V holds a non-finite value: only the pairs the mask
// shows are read, so a NaN or inf in a hidden key's value never reaches a row (P = 0 for a hidden
// pair, but 0 · NaN = NaN). P(row r, key j) is P[r·prs + j·pcs]; the float and bf16 forwards share it.
template <class T>
void accumulate_visible(const Params& p, const RowBlock& rb, std::int64_t j0, std::int64_t nk, const T* P,
                        std::int64_t prs, std::int64_t pcs, const T* V, std::int64_t ldv, ForwardScratch<T>& s) {
  for (std::int64_t r = 0; r < rb.n; ++r)
    for (std::int64_t c = 0; c < p.dv; ++c) s.o[r * p.dv + c] *= s.alpha[r];
  visible_product(p, rb, j0, nk, P, prs, pcs, V, ldv, p.dv, s.o.get(), p.dv, /*into_rows=*/true);
}

// o = alpha·o + P·V for a partial tile (score layout, V finite): each group of kColumnPad rows
// over only the keys it sees. The others' P is +0 (e^-inf): in a float32 chain that starts at +0
// a term 0·v (v finite) leaves the sum as it was (the sum is never -0), so the same bits. Not for
// float64 (its loops add into o, which alpha = 0 can leave -0) nor for a float32 P·V of one column
// (dv = 1: it sums by gemm's inner blocks, which a shorter range would regroup): see attend().
template <class T>
void partial_pv(const Params& p, const RowBlock& rb, std::int64_t j0, std::int64_t j1, const T* V, std::int64_t ldv,
                ForwardScratch<T>& s) {
  rb.groups.each_group(rb.n, j0, j1, [&](std::int64_t r0, std::int64_t r1, std::int64_t a, std::int64_t e) {
    Ops<T>::forward_pv(r1 - r0, p.dv, e - a, s.st.get() + (a - j0) * s.ld + r0, 1, s.ld, V + (a - j0) * ldv, ldv,
                       s.o.get() + r0 * p.dv, p.dv, s.alpha.get() + r0);
  });
}

// Asks for the V rows of a key tile while the scores are computed (decode is bound by memory:
// the two streams, K for the scores and V for the product, then overlap instead of alternating).
inline void prefetch_rows(const TensorView& t, const RowBlock& rb, std::int64_t j0, std::int64_t n, std::int64_t d) {
  if (t.strides[3] != 1 || n <= 0) return;
  const std::int64_t size = static_cast<std::int64_t>(dtype_size(t.dtype)), bytes = d * size, stride = t.strides[2] * size;
  const char* row = static_cast<const char*>(element(t, rb.b, rb.kh, j0, 0));
  for (std::int64_t j = 0; j < n; ++j, row += stride)
    prefetch_bytes(row, bytes, CacheLevel::far);
}

// Attends the block's rows to keys [k0, k1): leaves o (unnormalised), m and l in s.
template <class T>
void attend(const Params& p, const RowBlock& rb, std::int64_t k0, std::int64_t k1, ForwardScratch<T>& s) {
  s.m.fill(-std::numeric_limits<T>::infinity());
  s.l.fill(T(0));
  s.o.fill(T(0));
  pack_transposed<T>(p.q, rb, p.dk, p.scale, s.qt.get(), s.ld);  // s folded into Q
  if (rb.n <= kDotRows) pack_scaled_rows(p.q, rb, p.dk, p.scale, s.qr.get());
  const std::int64_t jb = std::max(k0, rb.lo_min), je = std::min(k1, rb.hi_max);
  for (std::int64_t j0 = jb; !rb.empty() && j0 < je; j0 += kBc) {
    const std::int64_t j1 = std::min(j0 + kBc, je), nk = j1 - j0;
    const TileKind kind = classify(p, rb, j0, j1);
    if (kind == TileKind::skip) continue;  // causal: the tiles above the diagonal cost nothing
    // Few rows (decode): scores in row layout, so the softmax's vectors run along the keys.
    const bool rows = rb.n <= kDotRows;
    const std::int64_t prs = rows ? kBc : 1, pcs = rows ? 1 : s.ld;  // strides of P(r, j) in s.st
    if (rows) {
      prefetch_rows(p.v, rb, j0, nk, p.dv);
      score_rows(p, rb, j0, j1, kind, s);
      Ops<T>::softmax_update_rows(s.st.get(), kBc, rb.n, nk, s.m.get(), s.l.get(), s.alpha.get());
    } else {
      score_tile(p, rb, j0, j1, kind, s);
      Ops<T>::softmax_update(s.st.get(), s.ld, nk, columns(rb), s.m.get(), s.l.get(), s.alpha.get());
    }
    if (p.has_dropout()) apply_dropout(p, rb, j0, nk, s.st.get(), prs, pcs);  // l keeps every P
    const Operand v = s.v_rows && !rows ? Operand{s.v_rows + j0 * s.v_ld, s.v_ld}
                                        : rows_operand<T>(p.v, rb.b, rb.kh, j0, nk, p.dv, s.vp.get());
    const T* V = static_cast<const T*>(v.ptr);
    if (kind == TileKind::partial && !all_finite(V, v.ld, nk, p.dv))
      accumulate_visible(p, rb, j0, nk, s.st.get(), prs, pcs, V, v.ld, s);
    else if (kind == TileKind::partial && !rows && std::is_same_v<T, float> && p.dv > 1)
      partial_pv(p, rb, j0, j1, V, v.ld, s);
    else
      Ops<T>::forward_pv(rb.n, p.dv, nk, s.st.get(), prs, pcs, V, v.ld, s.o.get(), p.dv, s.alpha.get());
  }
}

// Row r of the block, out = orow · inv, by vectors where it is a float32 or bfloat16 row of unit
// stride (simd::scaled_copy; bfloat16 through a float32 run, then bf16_row: the same bits as
// write_rows' element loops). Element by element, the bf16 forward's output rows took 2% of it.
// Not for a NaN inv (a row whose sum is NaN): where both factors are NaN the result is the NaN of
// whichever the instruction takes first, and the compiler may order a vector multiply's operands
// otherwise than the element loop's, so that outputs of other strides would differ in its sign.
// Returns whether it wrote the row.
inline bool write_row_vectors(const Params& p, const RowBlock& rb, std::int64_t r, const float* orow, float inv) {
  if (p.out.strides[3] != 1 || std::isnan(inv)) return false;
  if (p.out.dtype == DType::f32) {
    simd::scaled_copy(orow, inv, at<float>(p.out, rb.b, rb.h[r], rb.i[r]), static_cast<std::size_t>(p.dv));
    return true;
  }
  if (p.out.dtype != DType::bf16) return false;
  auto* row = reinterpret_cast<std::uint16_t*>(at<bf16>(p.out, rb.b, rb.h[r], rb.i[r]));
  float run[64];
  for (std::int64_t c0 = 0; c0 < p.dv; c0 += 64) {
    const std::int64_t n = std::min<std::int64_t>(64, p.dv - c0);
    simd::scaled_copy(orow + c0, inv, run, static_cast<std::size_t>(n));
    bf16_row(run, n, row + c0);
  }
  return true;
}
inline bool write_row_vectors(const Params&, const RowBlock&, std::int64_t, const double*, double) { return false; }

// Writes out = o / l and lse = m + ln l; a row with l = 0 saw no key: out 0, lse -inf.
template <class T>
void write_rows(const Params& p, const RowBlock& rb, const T* o, const T* m, const T* l) {
  const std::int64_t cs = p.out.strides[3];
  for (std::int64_t r = 0; r < rb.n; ++r) {
    const T inv = l[r] == T(0) ? T(0) : T(1) / l[r];
    const T* orow = o + r * p.dv;
    // Else float32 and bfloat16 rows through a typed pointer (put() looks the dtype up per
    // element); the same conversions as put()'s.
    if (!write_row_vectors(p, rb, r, orow, inv)) {
      if (p.out.dtype == DType::f32) {
        float* row = at<float>(p.out, rb.b, rb.h[r], rb.i[r]);
        for (std::int64_t c = 0; c < p.dv; ++c) row[c * cs] = static_cast<float>(orow[c] * inv);
      } else if (p.out.dtype == DType::bf16) {
        bf16* row = at<bf16>(p.out, rb.b, rb.h[r], rb.i[r]);
        for (std::int64_t c = 0; c < p.dv; ++c) row[c * cs] = to_bf16(static_cast<float>(orow[c] * inv));
      } else {
        for (std::int64_t c = 0; c < p.dv; ++c) put(p.out, rb.b, rb.h[r], rb.i[r], c, orow[c] * inv);
      }
    }
    if (!p.lse.empty()) {
      const double lse = l[r] == T(0) ? -INFINITY : static_cast<double>(m[r]) + std::log(static_cast<double>(l[r]));
      put(p.lse, rb.b, rb.h[r], rb.i[r], 0, lse);
    }
  }
}

// Second pass for the optional probs output, with m and l final: P = e^(t − m) / l.
// scores_left: attend() has just run on this block over all keys. When its keys fit in one tile,
// attend left that tile as St = e^(t − m) with m final (same ExpDiff, same inputs), so P = St · (1/l)
// comes out bit for bit as the recomputation would, without the second score GEMM.
template <class T>
void write_probs(const Params& p, const RowBlock& rb, ForwardScratch<T>& s, bool scores_left = false) {
  for (std::int64_t r = 0; r < s.ld; ++r) {
    const bool seen = r < rb.n && s.l[r] != T(0);
    s.sub[r] = seen ? s.m[r] : std::numeric_limits<T>::infinity();  // e^(t − inf) = 0
    s.mul[r] = seen ? T(1) / s.l[r] : T(0);
  }
  // probs of the compute type T: written through typed row pointers (no per-element dtype dispatch).
  const bool typed = p.probs.dtype == (std::is_same_v<T, float> ? DType::f32 : DType::f64);
  T* rows[kBr];
  const std::int64_t cs = p.probs.strides[3];
  for (std::int64_t r = 0; r < rb.n; ++r)
    if (typed) rows[r] = at<T>(p.probs, rb.b, rb.h[r], rb.i[r]);
  // Keys no tile writes are zero; when one tile spans all the keys, it writes every entry itself.
  const bool covered = !rb.empty() && rb.lo_min == 0 && rb.hi_max == p.Nkv && p.Nkv <= kBc;
  for (std::int64_t r = 0; r < rb.n && !covered; ++r) {
    if (typed) {
      for (std::int64_t j = 0; j < p.Nkv; ++j) rows[r][j * cs] = T(0);
    } else {
      for (std::int64_t j = 0; j < p.Nkv; ++j) put(p.probs, rb.b, rb.h[r], rb.i[r], j, T(0));
    }
  }
  for (std::int64_t j0 = rb.lo_min; !rb.empty() && j0 < rb.hi_max; j0 += kBc) {
    const std::int64_t j1 = std::min(j0 + kBc, rb.hi_max), nk = j1 - j0;
    const TileKind kind = classify(p, rb, j0, j1);
    if (kind == TileKind::skip) continue;
    if (rb.n <= kDotRows) {  // row layout, the scores exactly as attend() computed them (m matches)
      if (!(scores_left && j0 == rb.lo_min && j1 == rb.hi_max)) {
        score_rows(p, rb, j0, j1, kind, s);
        Ops<T>::exp2_rows(s.st.get(), kBc, rb.n, round_up(nk, simd::kColumnPad), s.sub.get());
      }
      for (std::int64_t r = 0; r < rb.n; ++r)
        for (std::int64_t j = 0; j < nk; ++j) {
          const T x = s.st[r * kBc + j] * s.mul[r];
          if (typed) rows[r][(j0 + j) * cs] = x;
          else put(p.probs, rb.b, rb.h[r], rb.i[r], j0 + j, x);
        }
      continue;
    }
    if (scores_left && j0 == rb.lo_min && j1 == rb.hi_max) {
      for (std::int64_t j = 0; j < nk; ++j)
        for (std::int64_t r = 0; r < columns(rb); ++r) s.st[j * s.ld + r] *= s.mul[r];
    } else {
      score_tile(p, rb, j0, j1, kind, s);
      Ops<T>::exp2_columns(s.st.get(), s.ld, nk, columns(rb), s.sub.get(), s.mul.get());
    }
    if (typed && cs == 1) {
      for (std::int64_t r = 0; r < rb.n; ++r)
        for (std::int64_t j = 0; j < nk; ++j) rows[r][j0 + j] = s.st[j * s.ld + r];
    } else if (typed) {  // a strided view: walk the tile in its own (key-major) order
      for (std::int64_t j = 0; j < nk; ++j)
        for (std::int64_t r = 0; r < rb.n; ++r) rows[r][(j0 + j) * cs] = s.st[j * s.ld + r];
    } else {
      for (std::int64_t j = 0; j < nk; ++j)
        for (std::int64_t r = 0; r < rb.n; ++r)
          put(p.probs, rb.b, rb.h[r], rb.i[r], j0 + j, s.st[j * s.ld + r]);
    }
  }
  if (p.has_dropout()) mark_dropped_probs<T>(p, rb);
}

// Decode (few query rows, many keys), defined in decode.cc. cache_decode: float32 and bfloat16
// calls of a few rows a head (up to 32 over long keys, fewer over short ones) whose rows are new
// tokens of a cache (no explicit mask; windows and ALiBi where the diagonal is the token's key) run
// the KV-cache decode (kv_decode.cc); returns false, doing nothing, for the others. decode_all:
// keys split into fixed chunks processed in parallel, merged by their LSE, for the calls
// use_decode accepts.
bool cache_decode(const Params& p);
bool use_decode(const Params& p);
// Whether forward_all might hand p to either decode (a superset of the calls they take).
bool may_decode(const Params& p);
template <class T>
void decode_all(const Params& p);

}  // namespace attnscale::detail
