// backward(): gradients by recomputation from q, k, v, out, lse and dO, as FlashAttention-2 does.
//
// Forward (per row i):  t_ij = log2(e)·(s·q_i·k_j + bias_ij);  P_ij = 2^(t_ij − log2(e)·lse_i);
//                       o_i = Σ_j P_ij v_j.
// Backward:  dV_j = Σ_i P_ij dO_i;  dP_ij = dO_i·v_j;  D_i = Σ_j P_ij dP_ij = dO_i·o_i;
//            dS_ij = s·P_ij (dP_ij − D_i);  dQ_i = Σ_j dS_ij k_j;  dK_j = Σ_i dS_ij q_i.
// P is recomputed tile by tile from the stored lse: nothing N x N is kept.
//
// Deterministic by construction, with no atomics. One pass (5 tile products): each task takes
// (batch, KV head, group of key blocks) and walks its key blocks in order; for each it forms P and
// dS tile by tile against every query block of the group's query heads and adds dV += Pᵀ·dO,
// dK += dSᵀ·Q (the key block's rows are written by this task alone) and dQ += dS·K into a dQ
// partial of its own. The dQ partials of the key groups are then summed in group order. The
// number of key groups G depends on the shape only (enough tasks for the threads when B·Hkv is
// small), so every thread count gives the same bits. When G > 1 the partials cost G·|dQ| floats;
// past 64 MiB of them the backward runs in two passes instead (7 tile products): pass 1 as above
// without dQ, pass 2 per (batch, head, query block) recomputing P and dS to sum dQ over the key
// tiles in order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attention/params.h"
#include "attention/score_transforms.h"
#include "attention/tiles.h"
#include "attention/varlen.h"
#include "attnscale/error.h"
#include "common/parallel.h"

namespace attnscale {
namespace detail {
namespace {

template <class T>
struct BackwardScratch {
  static constexpr std::int64_t ld = kBr;  // columns of the transposed (query-column) tiles
  static constexpr std::int64_t ldr = kBc;  // columns of the row-layout (key-column) tiles
  Buffer<T> qt, dot, qr, dor, st, dpt, dcap, kp, vp, kt, vt, lse2, D, one, dk_acc, dv_acc, dq_acc;
  explicit BackwardScratch(const Params& p)
      : qt(p.dk * ld), dot(p.dv * ld), qr(ld * p.dk), dor(ld * p.dv), st(kBc * kBr), dpt(kBc * kBr), dcap(kBc * kBr),
        kp(kBc * p.dk), vp(kBc * p.dv), kt(p.dk * ldr), vt(p.dv * ldr), lse2(ld), D(ld), one(ld),
        dk_acc(kBc * p.dk), dv_acc(kBc * p.dv), dq_acc(ld * p.dk) {
    one.fill(T(1));
  }
};

// What every tile needs from a query row, computed once per backward: lse in base 2 (+inf for a
// fully masked row, lse = -inf, so that 2^(t − lse2) = 0 for every score, where subtracting -inf
// would give 2^(+inf) or NaN) and D_i = dO_i·o_i. Row (b, h, i) is at (b·Hq + h)·Nq + i.
template <class T>
struct RowStats {
  std::vector<T> lse2, D;
  std::vector<char> finite;  // q_i and dO_i hold only finite values
  std::int64_t at(const Params& p, std::int64_t b, std::int64_t h, std::int64_t i) const {
    return (b * p.Hq + h) * p.Nq + i;
  }
};
template <class T>
RowStats<T> row_stats(const BackwardParams& p, int threads) {
  RowStats<T> st;
  st.lse2.resize(p.B * p.Hq * p.Nq);
  st.D.resize(p.B * p.Hq * p.Nq);
  st.finite.resize(p.B * p.Hq * p.Nq);
  parallel_for(p.B * p.Hq, 1, threads, [&](std::int64_t t0, std::int64_t t1, int) {
    for (std::int64_t bh = t0; bh < t1; ++bh) {
      const std::int64_t b = bh / p.Hq, h = bh % p.Hq;
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        const double lse = value<double>(p.lse, b, h, i, 0);
        st.lse2[bh * p.Nq + i] = lse == -INFINITY ? std::numeric_limits<T>::infinity() : static_cast<T>(lse * kLog2e);
        // In float64: one chain of dv products, whose float32 error would grow with dv (4096 at the
        // edge) and enter every dS of the row.
        double d = 0;
        for (std::int64_t c = 0; c < p.dv; ++c) d += value<double>(p.dO, b, h, i, c) * value<double>(p.out, b, h, i, c);
        st.D[bh * p.Nq + i] = static_cast<T>(d);
        bool finite = true;
        for (std::int64_t c = 0; c < p.dk; ++c) finite = finite && std::isfinite(value<T>(p.q, b, h, i, c));
        for (std::int64_t c = 0; c < p.dv; ++c) finite = finite && std::isfinite(value<T>(p.dO, b, h, i, c));
        st.finite[bh * p.Nq + i] = finite;
      }
    }
  });
  return st;
}

RowBlock rows_of(const Params& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t i1) {
  RowBlock rb;
  rb.b = b;
  rb.kh = p.kv_head(h);
  for (std::int64_t i = i0; i < i1; ++i) rb.add(p, h, i);
  return rb;
}

// Keys [j0, j0 + n) of a [B, H, N, d] view at (b, h), transposed into Xt[c][j] (ld columns, zero
// beyond n), times `mul`.
template <class T>
void pack_keys_transposed(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t n,
                          std::int64_t d, double mul, T* Xt, std::int64_t ld) {
  const T f = static_cast<T>(mul);
  for (std::int64_t c = 0; c < d; ++c) std::fill(Xt + c * ld + n, Xt + (c + 1) * ld, T(0));
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t c = 0; c < d; ++c) Xt[c * ld + j] = value<T>(t, b, h, j0 + j, c) * f;
}

template <class T>
void write_rows(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t n,
                std::int64_t d, const T* x) {
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t c = 0; c < d; ++c) put(t, b, h, i0 + r, c, x[r * d + c]);
}

// dbias(b, h, i, j0 + j) = dS(r, j) of a tile (W(r, j) = W[r·rs + j·cs], unscaled), then dS ∘= s.
template <class T>
void write_bias_grad(const BackwardParams& p, const RowBlock& rb, std::int64_t j0, std::int64_t nk, T* dS,
                     std::int64_t rs, std::int64_t cs) {
  const T scale = static_cast<T>(p.scale);
  for (std::int64_t r = 0; r < rb.n; ++r)
    for (std::int64_t j = 0; j < nk; ++j) {
      T& x = dS[r * rs + j * cs];
      put(p.dBias, rb.b, rb.h[r], rb.i[r], j0 + j, x);
      x *= scale;
    }
}

// The one place where the backward forms a tile's P and dS, in row layout S[query][key] (ld
// kBc), for the block's rows read in place (Q, dO) against the key block packed in s.kt, s.vt:
//   S = Q·(s·log2e·Kᵀ) (+ mask), P = 2^(S − lse2) in s.st, dP = dO·Vᵀ, dS = s·P∘(dP − D) in s.dpt.
template <class T>
void p_and_ds_rows(const BackwardParams& p, const RowStats<T>& stats, const RowBlock& rb, std::int64_t j0,
                   std::int64_t j1, TileKind kind, bool guarded, const T* Q, std::int64_t ldq, const T* dO,
                   std::int64_t lddo, BackwardScratch<T>& s) {
  const std::int64_t nk = j1 - j0, cols = round_up(nk, simd::kColumnPad), ld = s.ldr, n = rb.n;
  const std::int64_t row = stats.at(p, rb.b, rb.h[0], rb.i[0]);
  Ops<T>::gemm(n, cols, p.dk, Q, ldq, 1, s.kt.get(), ld, s.st.get(), ld, simd::kOverwrite);
  if (p.transforms_scores()) transform_scores(p, rb, j0, nk, s.st.get(), ld, 1, s.dcap.get());
  if (kind == TileKind::partial) apply_mask_rows(p, rb, j0, j1, s.st.get(), ld);
  Ops<T>::exp2_rows(s.st.get(), ld, n, cols, stats.lse2.data() + row);
  Ops<T>::gemm(n, cols, p.dv, dO, lddo, 1, s.vt.get(), ld, s.dpt.get(), ld, simd::kOverwrite);
  if (p.has_dropout()) apply_dropout(p, rb, j0, nk, s.dpt.get(), ld, 1);  // dP = Z∘(dO·Vᵀ)/(1 − p)
  // With dbias wanted, dS = P∘(dP − D) comes unscaled first: it is the gradient of the additive mask.
  const bool bias = !p.dBias.empty();
  Ops<T>::softmax_grad_rows(s.st.get(), s.dpt.get(), ld, n, cols, stats.D.data() + row,
                            bias ? T(1) : static_cast<T>(p.scale));
  // A hidden pair's dS is 0 · (a non-finite dP) when its key holds one.
  if (guarded) zero_hidden(p, rb, j0, nk, s.dpt.get(), ld, 1);
  if (bias) write_bias_grad(p, rb, j0, nk, s.dpt.get(), ld, 1);
  if (p.softcap > 0) scale_by_cap(rb, nk, s.dpt.get(), s.dcap.get(), ld, 1);
  if (p.has_dropout()) apply_dropout(p, rb, j0, nk, s.st.get(), ld, 1);  // dV takes Z∘P/(1 − p)
}

// Where a key task adds dQ += dS·K: rows of (b, h) at dq + ((b·Hq + h)·Nq + i)·dk, or nowhere
// (two-pass mode).
template <class T>
struct DqPartial {
  T* dq = nullptr;
  T* rows(const Params& p, std::int64_t b, std::int64_t h, std::int64_t i) const {
    return dq + ((b * p.Hq + h) * p.Nq + i) * p.dk;
  }
};

// Key blocks [kb0, kb1) of (b, kh), in order: dK and dV of each block, and (unless dq.dq is null)
// its dS·K added to the dQ partial. Tiles in row layout, S[query][key]: the key block's Kᵀ (times
// s·log2 e) and Vᵀ are packed once, and every query block's Q and dO rows are read in place, so
// the loop over query blocks packs nothing.
template <class T>
void key_blocks(const BackwardParams& p, const RowStats<T>& stats, std::int64_t b, std::int64_t kh,
                std::int64_t kb0, std::int64_t kb1, DqPartial<T> dq, BackwardScratch<T>& s) {
  for (std::int64_t kb = kb0; kb < kb1; ++kb) {
    const std::int64_t j0 = kb * kBc, j1 = std::min(p.Nkv, j0 + kBc), nk = j1 - j0, ld = s.ldr;
    pack_keys_transposed<T>(p.k, b, kh, j0, nk, p.dk, p.scale_log2e, s.kt.get(), ld);
    pack_keys_transposed<T>(p.v, b, kh, j0, nk, p.dv, 1.0, s.vt.get(), ld);
    const Operand kr = dq.dq ? rows_operand<T>(p.k, b, kh, j0, nk, p.dk, s.kp.get()) : Operand{nullptr, 0};
    const bool keys_finite = all_finite(s.kt.get(), ld, p.dk, nk) && all_finite(s.vt.get(), ld, p.dv, nk);
    s.dk_acc.fill(T(0));
    s.dv_acc.fill(T(0));
    for (std::int64_t h = kh * p.group(); h < (kh + 1) * p.group(); ++h)
      for (std::int64_t i0 = 0; i0 < p.Nq; i0 += kBr) {
        const std::int64_t i1 = std::min(p.Nq, i0 + kBr), n = i1 - i0;
        // Key ranges grow with i (causal/window), so the block's union is [lo(i0), hi(i1 - 1)).
        const KeyRange first = key_range(p, i0), last = key_range(p, i1 - 1);
        if (last.hi <= j0 || first.lo >= j1) continue;
        const RowBlock rb = rows_of(p, b, h, i0, i1);
        const TileKind kind = classify(p, rb, j0, j1);
        if (kind == TileKind::skip) continue;
        const Operand q = rows_operand<T>(p.q, b, h, i0, n, p.dk, s.qr.get());
        const Operand dO = rows_operand<T>(p.dO, b, h, i0, n, p.dv, s.dor.get());
        const T* Q = static_cast<const T*>(q.ptr);
        const T* dOr = static_cast<const T*>(dO.ptr);
        // A hidden row's non-finite q or dO must not reach the keys through a zero weight, nor a
        // hidden key's non-finite k the rows' dQ (p_and_ds_rows clears the hidden dS).
        const std::int64_t row = stats.at(p, b, h, i0);
        const bool rows_finite =
            std::all_of(stats.finite.begin() + row, stats.finite.begin() + row + n, [](char f) { return f != 0; });
        const bool guarded = kind == TileKind::partial && !(keys_finite && rows_finite);
        p_and_ds_rows(p, stats, rb, j0, j1, kind, guarded, Q, q.ld, dOr, dO.ld, s);
        const T* K = static_cast<const T*>(kr.ptr);
        if (guarded && !rows_finite) {
          visible_product(p, rb, j0, nk, s.st.get(), ld, 1, dOr, dO.ld, p.dv, s.dv_acc.get(), p.dv, false);
          visible_product(p, rb, j0, nk, s.dpt.get(), ld, 1, Q, q.ld, p.dk, s.dk_acc.get(), p.dk, false);
        } else {
          Ops<T>::gemm(nk, p.dv, n, s.st.get(), 1, ld, dOr, dO.ld, s.dv_acc.get(), p.dv, simd::kAccumulate);
          Ops<T>::gemm(nk, p.dk, n, s.dpt.get(), 1, ld, Q, q.ld, s.dk_acc.get(), p.dk, simd::kAccumulate);
        }
        if (!dq.dq) continue;
        if (guarded)
          visible_product(p, rb, j0, nk, s.dpt.get(), ld, 1, K, kr.ld, p.dk, dq.rows(p, b, h, i0), p.dk, true);
        else
          Ops<T>::gemm(n, p.dk, nk, s.dpt.get(), ld, 1, K, kr.ld, dq.rows(p, b, h, i0), p.dk, simd::kAccumulate);
      }
    write_rows(p.dK, b, kh, j0, nk, p.dk, s.dk_acc.get());
    write_rows(p.dV, b, kh, j0, nk, p.dv, s.dv_acc.get());
  }
}

// Pass 2: dQ of rows [i0, i1) of (b, h). Tiles transposed, St[key][query]: the block's Qᵀ (times
// s·log2 e) and dOᵀ are packed once and K, V are read in place:
//   St = K·Qᵀ, Pt = 2^(St − lse2), dPt = V·dOᵀ, dSt = s·Pt∘(dPt − D);  dQ += dS·K.
template <class T>
void query_block(const BackwardParams& p, const RowStats<T>& stats, std::int64_t b, std::int64_t h,
                 std::int64_t i0, std::int64_t i1, BackwardScratch<T>& s) {
  const RowBlock rb = rows_of(p, b, h, i0, i1);
  pack_transposed<T>(p.q, rb, p.dk, p.scale_log2e, s.qt.get(), s.ld);
  pack_transposed<T>(p.dO, rb, p.dv, 1.0, s.dot.get(), s.ld);
  const std::int64_t row = stats.at(p, b, h, i0);
  for (std::int64_t r = 0; r < s.ld; ++r) {  // padding columns: P = 0
    s.lse2[r] = r < rb.n ? stats.lse2[row + r] : std::numeric_limits<T>::infinity();
    s.D[r] = r < rb.n ? stats.D[row + r] : T(0);
  }
  s.dq_acc.fill(T(0));
  for (std::int64_t j0 = rb.lo_min; !rb.empty() && j0 < rb.hi_max; j0 += kBc) {
    const std::int64_t j1 = std::min(j0 + kBc, rb.hi_max), nk = j1 - j0;
    const TileKind kind = classify(p, rb, j0, j1);
    if (kind == TileKind::skip) continue;
    const StridedOperand k = strided_operand<T>(p.k, rb.b, rb.kh, j0, nk, p.dk, s.kp.get());
    Ops<T>::gemm(nk, s.ld, p.dk, static_cast<const T*>(k.ptr), k.rs, k.cs, s.qt.get(), s.ld, s.st.get(), s.ld,
                 simd::kOverwrite);
    if (p.transforms_scores()) transform_scores(p, rb, j0, nk, s.st.get(), 1, s.ld, s.dcap.get());
    if (kind == TileKind::partial) apply_mask(p, rb, j0, j1, s.st.get(), s.ld);
    Ops<T>::exp2_columns(s.st.get(), s.ld, nk, s.ld, s.lse2.get(), s.one.get());
    const StridedOperand v = strided_operand<T>(p.v, rb.b, rb.kh, j0, nk, p.dv, s.vp.get());
    Ops<T>::gemm(nk, s.ld, p.dv, static_cast<const T*>(v.ptr), v.rs, v.cs, s.dot.get(), s.ld, s.dpt.get(), s.ld,
                 simd::kOverwrite);
    if (p.has_dropout()) apply_dropout(p, rb, j0, nk, s.dpt.get(), 1, s.ld);
    Ops<T>::softmax_grad(s.st.get(), s.dpt.get(), s.ld, nk, s.ld, s.D.get(), static_cast<T>(p.scale));
    const Operand kr = rows_operand<T>(p.k, b, rb.kh, j0, nk, p.dk, s.kp.get());
    const T* K = static_cast<const T*>(kr.ptr);
    // As in pass 1: a hidden key's non-finite k or v must not reach the rows through a zero dS.
    const bool dirty = kind == TileKind::partial && !(all_finite(K, kr.ld, nk, p.dk) &&
                                                      all_finite(static_cast<const T*>(v.ptr), v.rs, nk, p.dv, v.cs));
    if (dirty) zero_hidden(p, rb, j0, nk, s.dpt.get(), 1, s.ld);
    if (p.softcap > 0) scale_by_cap(rb, nk, s.dpt.get(), s.dcap.get(), 1, s.ld);
    if (dirty) {
      visible_product(p, rb, j0, nk, s.dpt.get(), 1, s.ld, K, kr.ld, p.dk, s.dq_acc.get(), p.dk, true);
      continue;
    }
    Ops<T>::gemm(rb.n, p.dk, nk, s.dpt.get(), 1, s.ld, static_cast<const T*>(kr.ptr), kr.ld, s.dq_acc.get(), p.dk,
                 simd::kAccumulate);
  }
  write_rows(p.dQ, b, h, i0, rb.n, p.dk, s.dq_acc.get());
}

// dsink_h = −Σ_{b,i} P_sink·D_i with P_sink = exp(sink_h − lse_i) = 2^(sink2_h − lse2_i): the sink
// joins the softmax like a key whose value is zero, so its dP is 0 and dS_sink = P_sink·(0 − D).
template <class T>
void write_sink_grads(const BackwardParams& p, const RowStats<T>& stats) {
  for (std::int64_t h = 0; h < p.Hq; ++h) {
    const double s2 = sink2(p, h);
    double g = 0;
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        const std::int64_t row = stats.at(p, b, h, i);
        g -= std::exp2(s2 - static_cast<double>(stats.lse2[row])) * static_cast<double>(stats.D[row]);
      }
    store(p.dSinks, element1(p.dSinks, h), g);
  }
}

// Key groups of the one-pass backward: enough (batch, KV head, key group) tasks to keep up to 8
// threads busy, from the shape alone.
inline constexpr std::int64_t kMinKeyTasks = 8;
std::int64_t max_partial_bytes = std::int64_t{64} << 20;  // see set_backward_partial_budget

template <class T>
void backward_all(const BackwardParams& p) {
  const std::int64_t nkb = (p.Nkv + kBc - 1) / kBc, nqb = (p.Nq + kBr - 1) / kBr, heads = p.B * p.Hkv;
  const std::int64_t groups = std::clamp<std::int64_t>((kMinKeyTasks + heads - 1) / heads, 1, std::max<std::int64_t>(nkb, 1));
  const std::int64_t per = (nkb + groups - 1) / groups, dq_size = p.B * p.Hq * p.Nq * p.dk;
  const bool one_pass = groups == 1 || groups * dq_size * std::int64_t(sizeof(T)) <= max_partial_bytes;
  const std::int64_t key_items = heads * (one_pass ? groups : nkb), query_items = p.B * p.Hq * nqb;
  const int threads = resolve_threads(p.threads, std::max(key_items, query_items));
  const RowStats<T> stats = row_stats<T>(p, threads);
  if (!p.dSinks.empty()) write_sink_grads(p, stats);
  if (!p.dBias.empty())  // the key tasks write every pair a tile reaches; the others are 0
    parallel_for(p.B * p.Hq, 1, threads, [&](std::int64_t t0, std::int64_t t1, int) {
      for (std::int64_t bh = t0; bh < t1; ++bh)
        for (std::int64_t i = 0; i < p.Nq; ++i)
          for (std::int64_t j = 0; j < p.Nkv; ++j) put(p.dBias, bh / p.Hq, bh % p.Hq, i, j, 0.0);
    });
  PerThread<BackwardScratch<T>> scratch(threads);
  auto scratch_of = [&](int t) -> BackwardScratch<T>& { return scratch.get(t, p); };
  if (!one_pass) {
    parallel_for(key_items, 1, threads, [&](std::int64_t t0, std::int64_t t1, int t) {
      for (std::int64_t item = t0; item < t1; ++item)
        key_blocks(p, stats, item / nkb / p.Hkv, item / nkb % p.Hkv, item % nkb, item % nkb + 1, DqPartial<T>{},
                   scratch_of(t));
    });
    parallel_for(query_items, 1, threads, [&](std::int64_t t0, std::int64_t t1, int t) {
      for (std::int64_t item = t0; item < t1; ++item) {
        const std::int64_t qb = nqb - 1 - item % nqb, head = item / nqb;  // costliest (causal) first
        query_block(p, stats, head / p.Hq, head % p.Hq, qb * kBr, std::min(p.Nq, (qb + 1) * kBr), scratch_of(t));
      }
    });
    return;
  }
  Buffer<T> partials(groups * dq_size);
  parallel_for(groups, 1, threads, [&](std::int64_t g0, std::int64_t g1, int) {
    for (std::int64_t g = g0; g < g1; ++g) std::fill(partials.get() + g * dq_size, partials.get() + (g + 1) * dq_size, T(0));
  });
  parallel_for(key_items, 1, threads, [&](std::int64_t t0, std::int64_t t1, int t) {
    for (std::int64_t item = t0; item < t1; ++item) {
      const std::int64_t g = item % groups, head = item / groups;  // under a causal mask, early keys cost most
      key_blocks(p, stats, head / p.Hkv, head % p.Hkv, g * per, std::min(nkb, (g + 1) * per),
                 DqPartial<T>{partials.get() + g * dq_size}, scratch_of(t));
    }
  });
  // dQ = Σ_g partial_g, in group order.
  parallel_for(p.B * p.Hq, 1, threads, [&](std::int64_t t0, std::int64_t t1, int t) {
    BackwardScratch<T>& s = scratch_of(t);
    for (std::int64_t bh = t0; bh < t1; ++bh)
      for (std::int64_t i0 = 0; i0 < p.Nq; i0 += kBr) {
        const std::int64_t n = std::min(p.Nq, i0 + kBr) - i0, at = (bh * p.Nq + i0) * p.dk;
        T* sum = s.dq_acc.get();
        std::copy(partials.get() + at, partials.get() + at + n * p.dk, sum);
        for (std::int64_t g = 1; g < groups; ++g) {
          const T* part = partials.get() + g * dq_size + at;
          for (std::int64_t x = 0; x < n * p.dk; ++x) sum[x] += part[x];
        }
        write_rows(p.dQ, bh / p.Hq, bh % p.Hq, i0, n, p.dk, sum);
      }
  });
}

}  // namespace

std::int64_t set_backward_partial_budget(std::int64_t bytes) {
  return std::exchange(max_partial_bytes, bytes);
}

}  // namespace detail

void detail::run_backward(const BackwardParams& p) {
  switch (p.dtype) {
    case DType::f32:
    case DType::bf16: return backward_all<float>(p);  // bf16: converted to float32 on load
    case DType::f64: return backward_all<double>(p);
    default: throw Error("q: dtype " + std::string(dtype_name(p.dtype)) + " is not supported by backward");
  }
}

void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& lse, const TensorView& dout, const Gradients& grads,
              const Options& options) {
  detail::simd::init_target_from_env();
  if (detail::is_varlen(options))
    return detail::varlen_backward(q, k, v, out, lse, dout, grads, options, detail::Kernel::fast);
  detail::run_backward(detail::make_backward_params(q, k, v, out, lse, dout, grads, options, detail::Kernel::fast));
}

}  // namespace attnscale
