// backward(): gradients by recomputation from q, k, v, out, lse and dO, as FlashAttention-2 does.
//
// Forward (per row i):  t_ij = s·q_i·k_j + bias_ij;  P_ij = e^(t_ij − lse_i);
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
#include <type_traits>
#include <utility>
#include <vector>

#include "attention/backward_rows.h"
#include "attention/bf16_as_float.h"
#include "attention/bf16_kernels.h"
#include "attention/params.h"
#include "attention/score_transforms.h"
#include "attention/tiles.h"
#include "attention/varlen.h"
#include "attnscale/error.h"
#include "common/parallel.h"

namespace attnscale {
namespace detail {
namespace {

// Key blocks a key task takes side by side in one sweep over the query blocks (key_blocks).
inline constexpr std::int64_t kKeyBlocks = 2;

template <class T>
struct BackwardScratch {
  static constexpr std::int64_t ld = kBr;  // columns of the transposed (query-column) tiles
  static constexpr std::int64_t ldr = kBc;  // columns of the row-layout (key-column) tiles
  // kp, vt, dk_acc and dv_acc hold kKeyBlocks key blocks, one after the other (kp_size etc. apart).
  Buffer<T> qt, dot, qr, dor, st, dpt, dcap, kp, vp, vt, lse, D, mul, dk_acc, dv_acc, dq_acc;
  AlignedRows<T> q_rows, do_rows;  // a key task's Q and dO rows, when copied (copy_query_rows)
  bool copy_q = false, copy_do = false;
  std::int64_t kp_size, vt_size, dk_size, dv_size;
  explicit BackwardScratch(const Params& p)
      : qt(p.dk * ld), dot(p.dv * ld), qr(ld * p.dk), dor(ld * p.dv), st(kBc * kBr), dpt(kBc * kBr), dcap(kBc * kBr),
        kp(kKeyBlocks * kBc * AlignedRows<T>::stride(p.dk)), vp(kBc * p.dv), vt(kKeyBlocks * p.dv * ldr), lse(ld),
        D(ld), mul(ld), dk_acc(kKeyBlocks * kBc * p.dk), dv_acc(kKeyBlocks * kBc * p.dv), dq_acc(ld * p.dk),
        kp_size(kBc * AlignedRows<T>::stride(p.dk)), vt_size(p.dv * ldr), dk_size(kBc * p.dk), dv_size(kBc * p.dv) {}
};

// Whether the key tasks read their query heads' rows of Q and dO from aligned copies (AlignedRows):
// for the views whose rows are off 64-byte boundaries or gapped (read by every key block), a copy of
// each per thread, when all of them fit in `budget` bytes (then subtracted from it). first: Q,
// second: dO.
template <class T>
std::pair<bool, bool> copy_query_rows(const BackwardParams& p, int threads, std::int64_t& budget) {
  const std::int64_t key_blocks = (p.Nkv + kBc - 1) / kBc;
  const bool q = AlignedRows<T>::wanted(p.q, key_blocks), dO = AlignedRows<T>::wanted(p.dO, key_blocks);
  const std::int64_t per_row = (q ? AlignedRows<T>::stride(p.dk) : 0) + (dO ? AlignedRows<T>::stride(p.dv) : 0);
  const std::int64_t bytes = threads * p.group() * p.Nq * per_row * std::int64_t{sizeof(T)};
  if (per_row == 0 || bytes > budget) return {false, false};
  budget -= bytes;
  return {q, dO};
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
  if constexpr (std::is_same_v<T, float>)
    if (t.dtype == DType::f32 && t.strides[3] == 1 && n <= kBc) {
      // float32 rows of unit stride: by 16 × 16 blocks in registers (the same products; value by
      // value, with a type switch each, 10% of a small backward's samples: N = 128, d = 64, H = 8).
      const float* rows[kBc];
      for (std::int64_t j = 0; j < n; ++j) rows[j] = at<const float>(t, b, h, j0 + j, 0);
      simd::transpose_scaled(rows, static_cast<std::size_t>(n), static_cast<std::size_t>(d), f, Xt,
                             static_cast<std::size_t>(ld));
      return;
    }
  if constexpr (std::is_same_v<T, float>)
    if (t.dtype == DType::bf16 && t.strides[3] == 1 && n <= kBc) {  // a backward reading them as stored
      transpose_bf16_rows(
          [&](std::int64_t j, std::int64_t c0) {
            return static_cast<const std::uint16_t*>(element(t, b, h, j0 + j, c0));
          },
          n, d, f, Xt, ld);
      return;
    }
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t c = 0; c < d; ++c) Xt[c * ld + j] = value<T>(t, b, h, j0 + j, c) * f;
}

// s·Kᵀ of every (batch, KV head), packed once per backward in key blocks of kBc: block kb
// of (b, kh) is Kt[c][j] (kBc columns, zero past the last key). Every score tile of the backward
// reads its keys here, so a (query, key) pair gets the same score bits in every pass and in both
// layouts (the row layout's fma(q_c, k'_c, acc) is the transposed layout's fma(k'_c, q_c, acc)).
template <class T>
struct PackedKeys {
  std::int64_t Hkv, nkb, dk;
  Buffer<T> data;
  const T* at(std::int64_t b, std::int64_t kh, std::int64_t kb) const {
    return data.get() + ((b * Hkv + kh) * nkb + kb) * dk * kBc;
  }
};
template <class T>
PackedKeys<T> pack_keys(const BackwardParams& p, std::int64_t nkb, int threads) {
  PackedKeys<T> kt{p.Hkv, nkb, p.dk, Buffer<T>(p.B * p.Hkv * nkb * p.dk * kBc)};
  parallel_for(p.B * p.Hkv * nkb, 1, threads, [&](std::int64_t t0, std::int64_t t1, int) {
    for (std::int64_t item = t0; item < t1; ++item) {
      const std::int64_t kb = item % nkb, head = item / nkb, j0 = kb * kBc;
      pack_keys_transposed<T>(p.k, head / p.Hkv, head % p.Hkv, j0, std::min(kBc, p.Nkv - j0), p.dk,
                              p.scale, const_cast<T*>(kt.at(head / p.Hkv, head % p.Hkv, kb)), kBc);
    }
  });
  return kt;
}

// The backward's score tile in row layout, S[r][j − j0] = t(s·q_r·k_j) + bias for the block's
// rows (Q read in place) against key block Kt (keys from j0), t the score transforms (soft-cap,
// ALiBi; their factor for dS in dcap when given), masked pairs -inf: the one place where the
// backward post-processes its row-layout scores, for the normaliser pass and the gradient pass
// alike.
//
// A partial tile can be narrowed (`groups`, from narrowed() below): its products then cover only
// the pairs some row sees (GroupRuns, tiles.h). The scores and dP go by groups of rows, each over
// the columns that hold its keys (rounded out to kColumnPad), the rest of its rows zero (masked:
// P = 0 there, dS = 0); dV and dK by strips of keys, each over the rows that see one of them; dQ
// by groups over their keys. An element then sums the same terms but some 0·x, which leave a
// float32 chain as it was (x finite, see partial_pv in flash_forward.h), so the same bits.
// Not where dbias is written (a hidden pair's dS goes there, its zero's sign that of dP − D), nor
// where a product of one column sums by gemm's inner blocks (dk or dv = 1), which a shorter range
// would regroup, nor for float64 (its loops add into C).
template <class T>
bool narrowed(const BackwardParams& p, TileKind kind, bool guarded) {
  return std::is_same_v<T, float> && kind == TileKind::partial && !guarded && p.dBias.empty() && p.dk > 1 && p.dv > 1;
}

// X[r][j − j0] for a tile's padded columns in row layout (row stride ld): product(r0, rows, c0,
// columns) computes the rows' block; whole, or by groups when narrowed.
template <class T, class Product>
void by_row_groups(const RowBlock& rb, std::int64_t j0, std::int64_t j1, const GroupRuns* groups, T* X,
                   std::int64_t ld, Product product) {
  const std::int64_t cols = round_up(j1 - j0, simd::kColumnPad), pad = simd::kColumnPad;
  if (!groups) return product(0, rb.n, 0, cols);
  groups->each_group(rb.n, j0, j1, [&](std::int64_t r0, std::int64_t r1, std::int64_t a, std::int64_t e) {
    const std::int64_t c0 = (a - j0) / pad * pad, c1 = a == e ? c0 : round_up(e - j0, pad);
    if (c1 > c0) product(r0, r1 - r0, c0, c1 - c0);
    for (std::int64_t r = r0; r < r1; ++r) {
      std::fill(X + r * ld, X + r * ld + c0, T(0));
      std::fill(X + r * ld + c1, X + r * ld + cols, T(0));
    }
  });
}

template <class T>
void scores_rows(const BackwardParams& p, const RowBlock& rb, std::int64_t j0, std::int64_t j1, TileKind kind,
                 const T* Q, std::int64_t ldq, const T* Kt, T* S, T* dcap = nullptr, const GroupRuns* groups = nullptr) {
  by_row_groups(rb, j0, j1, groups, S, kBc, [&](std::int64_t r0, std::int64_t rows, std::int64_t c0, std::int64_t nc) {
    Ops<T>::gemm(rows, nc, p.dk, Q + r0 * ldq, ldq, 1, Kt + c0, kBc, S + r0 * kBc + c0, kBc, simd::kOverwrite);
  });
  if (p.transforms_scores()) transform_scores(p, rb, j0, j1 - j0, S, kBc, 1, dcap);
  if (kind == TileKind::partial) apply_mask_rows(p, rb, j0, j1, S, kBc);
}

// Row normalisers from the backward's own scores. Derivation: the stored lse is the forward's
// log-normaliser rounded to float32 (an error of u/2·|lse| with u = 2^-24, and |lse| is at least
// ln Nkv, far more for unscaled logits), and the forward rounds its scores differently; so
// P = e^(t − lse) sums over a row to 1 + ε with |ε| ~ u·|lse|, an error that scales every P of
// the row alike, the largest ones too. A plain float32 implementation normalises its own P and
// has no such term (its dV error was 2-9x smaller at d_k = 64..4096 with unscaled logits). With
// σ_i = Σ_j e^(t_ij − lse_i) summed in float64 over the same t bits the gradient pass computes,
// P = e^(t − lse)/σ sums to 1 up to the rounding of its terms. The cost is one more score product
// per tile (6 instead of 5). An attention sink, a term of the normaliser beyond the keys, joins
// σ as e^(sink − lse). Not needed for float64 (its lse rounds at 1e-16), nor possible when lse counts
// keys not passed (Options::lse_covers_keys = false: a shard of the keys, σ < 1 by design).
// When the normaliser pass can be skipped. Derivation: the rounding of lse to float32 scales a
// row's P by 1 + ε with |ε| <= u/2·|lse| (u = 2^-24), the term σ removes; exp2 itself errs by up
// to 2e-7 ≈ 3.4u per element. Rows with |lse| <= 16 (scaled logits: lse ≈ ln Nkv + O(1) up to
// Nkv ~ 10^6) have |ε| <= 8u, a row-uniform error of the same order as the elementwise errors of a
// plain float32 softmax, so they skip the pass (one score product per tile of 6). Measured with
// python/tests/test_accuracy_edge.py's pooled errors (6 trials, every d_k and scaling): the
// largest ratio to float32 PyTorch stays 1.59 with or without the pass; the scaled cases go from
// <= 1.3 to <= 1.37; at a bound of 32, dV reaches 2.7x. A sink (a term σ must count) keeps the pass.
inline constexpr double kExactLse = 16;
template <class T>
bool lse_exact_enough(const RowStats<T>& stats, std::int64_t row, std::int64_t n, double sink) {
  if (sink != -INFINITY) return false;
  for (std::int64_t r = 0; r < n; ++r)
    if (!(std::abs(static_cast<double>(stats.lse[row + r])) <= kExactLse)) return false;
  return true;
}
template <class T>
void normalisers(const BackwardParams& p, const PackedKeys<T>& kt, std::int64_t b, std::int64_t h, std::int64_t i0,
                 std::int64_t i1, RowStats<T>& stats, BackwardScratch<T>& s) {
  const RowBlock rb = rows_of(p, b, h, i0, i1);
  const std::int64_t row = stats.at(p, b, h, i0);
  if (lse_exact_enough(stats, row, rb.n, sink_logit(p, h))) return;
  const Operand q = rows_operand<T>(p.q, b, h, i0, rb.n, p.dk, s.qr.get());
  double sigma[kBr] = {};
  for (std::int64_t j0 = rb.lo_min / kBc * kBc; !rb.empty() && j0 < rb.hi_max; j0 += kBc) {
    const std::int64_t j1 = std::min(p.Nkv, j0 + kBc), nk = j1 - j0;  // the gradient pass's key blocks
    const TileKind kind = classify(p, rb, j0, j1);
    if (kind == TileKind::skip) continue;
    scores_rows(p, rb, j0, j1, kind, static_cast<const T*>(q.ptr), q.ld, kt.at(b, rb.kh, j0 / kBc), s.st.get());
    Ops<T>::exp2_rows(s.st.get(), kBc, rb.n, round_up(nk, simd::kColumnPad), stats.lse.data() + row);
    for (std::int64_t r = 0; r < rb.n; ++r)
      for (std::int64_t j = 0; j < nk; ++j) sigma[r] += s.st[r * kBc + j];
  }
  const double sink = sink_logit(p, h);
  for (std::int64_t r = 0; r < rb.n; ++r) {
    if (sink != -INFINITY) sigma[r] += std::exp(sink - static_cast<double>(stats.lse[row + r]));
    stats.mul[row + r] = sigma[r] > 0 ? static_cast<T>(1 / sigma[r]) : T(1);
  }
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
// kBc), for the block's rows read in place (Q, dO) against key block Kt and the block's Vᵀ, Vt:
//   S = scores_rows(), P = e^(S − lse)/σ in s.st, dP = dO·Vᵀ, dS = s·P∘(dP − D) in s.dpt.
template <class T>
void p_and_ds_rows(const BackwardParams& p, const RowStats<T>& stats, const RowBlock& rb, std::int64_t j0,
                   std::int64_t j1, TileKind kind, bool guarded, const T* Q, std::int64_t ldq, const T* Kt,
                   const T* Vt, const T* dO, std::int64_t lddo, BackwardScratch<T>& s, const GroupRuns* groups) {
  const std::int64_t nk = j1 - j0, cols = round_up(nk, simd::kColumnPad), ld = s.ldr, n = rb.n;
  const std::int64_t row = stats.at(p, rb.b, rb.h[0], rb.i[0]);
  scores_rows(p, rb, j0, j1, kind, Q, ldq, Kt, s.st.get(), s.dcap.get(), groups);
  Ops<T>::exp2_rows(s.st.get(), ld, n, cols, stats.lse.data() + row, stats.mul.data() + row);
  T* dP = s.dpt.get();
  by_row_groups(rb, j0, j1, groups, dP, ld, [&](std::int64_t r0, std::int64_t rows, std::int64_t c0, std::int64_t nc) {
    Ops<T>::gemm(rows, nc, p.dv, dO + r0 * lddo, lddo, 1, Vt + c0, ld, dP + r0 * ld + c0, ld, simd::kOverwrite);
  });
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
// its dS·K added to the dQ partial. Tiles in row layout, S[query][key]: the key block's s·Kᵀ
// comes packed, its Vᵀ is packed once here, and every query block's Q and dO rows are read in
// place, so the loop over query blocks packs nothing. The blocks go kKeyBlocks at a time, each
// query block's tiles against all of them before the next query block, so that the rows of Q,
// dO and dQ are read once per kKeyBlocks key blocks (from the third-level cache or memory: a
// head's are 6 MiB at N = 4096, d = 128). The sums are those of one block at a time, in the same
// order: dK and dV of a block over the query blocks in order, a row of dQ over the key blocks in
// order.
template <class T>
void key_blocks(const BackwardParams& p, const RowStats<T>& stats, const PackedKeys<T>& kts, std::int64_t b,
                std::int64_t kh, std::int64_t kb0, std::int64_t kb1, DqPartial<T> dq, BackwardScratch<T>& s) {
  const std::int64_t h0 = kh * p.group(), h1 = h0 + p.group(), ld = s.ldr, query_blocks = (p.Nq + kBr - 1) / kBr;
  const bool copy_q = s.copy_q, copy_do = s.copy_do;
  if (copy_q) s.q_rows.hold(p.q, b, h0, h1, p.Nq, p.dk);
  if (copy_do) s.do_rows.hold(p.dO, b, h0, h1, p.Nq, p.dv);
  struct KeyBlock {
    std::int64_t j0, j1, nk;
    const T *Kt, *Vt;
    Operand kr;
    bool keys_finite;
    T *dk, *dv;
  };
  for (std::int64_t kbs = kb0; kbs < kb1; kbs += kKeyBlocks) {
    KeyBlock blocks[kKeyBlocks];
    const std::int64_t nb = std::min(kKeyBlocks, kb1 - kbs);
    for (std::int64_t x = 0; x < nb; ++x) {
      KeyBlock& kb = blocks[x];
      kb.j0 = (kbs + x) * kBc, kb.j1 = std::min(p.Nkv, kb.j0 + kBc), kb.nk = kb.j1 - kb.j0;
      kb.Kt = kts.at(b, kh, kbs + x);
      T* vt = s.vt.get() + x * s.vt_size;
      pack_keys_transposed<T>(p.v, b, kh, kb.j0, kb.nk, p.dv, 1.0, vt, ld);
      kb.Vt = vt;
      kb.kr = dq.dq ? AlignedRows<T>::tile(p.k, b, kh, kb.j0, kb.nk, p.dk, s.kp.get() + x * s.kp_size, query_blocks)
                    : Operand{nullptr, 0};
      kb.keys_finite = all_finite(kb.Kt, kBc, p.dk, kb.nk) && all_finite(vt, ld, p.dv, kb.nk);
      kb.dk = s.dk_acc.get() + x * s.dk_size, kb.dv = s.dv_acc.get() + x * s.dv_size;
      std::fill_n(kb.dk, s.dk_size, T(0));
      std::fill_n(kb.dv, s.dv_size, T(0));
    }
    for (std::int64_t h = h0; h < h1; ++h)
      for (std::int64_t i0 = 0; i0 < p.Nq; i0 += kBr) {
        const std::int64_t i1 = std::min(p.Nq, i0 + kBr), n = i1 - i0;
        // Key ranges grow with i (causal/window), so the block's union is [lo(i0), hi(i1 - 1)).
        const KeyRange first = key_range(p, i0), last = key_range(p, i1 - 1);
        if (last.hi <= blocks[0].j0 || first.lo >= blocks[nb - 1].j1) continue;
        const RowBlock rb = rows_of(p, b, h, i0, i1);
        const Operand q = copy_q ? Operand{s.q_rows.row(h, i0, p.Nq), s.q_rows.ld}
                                 : rows_operand<T>(p.q, b, h, i0, n, p.dk, s.qr.get());
        const Operand dO = copy_do ? Operand{s.do_rows.row(h, i0, p.Nq), s.do_rows.ld}
                                   : rows_operand<T>(p.dO, b, h, i0, n, p.dv, s.dor.get());
        const T* Q = static_cast<const T*>(q.ptr);
        const T* dOr = static_cast<const T*>(dO.ptr);
        const std::int64_t row = stats.at(p, b, h, i0);
        const bool rows_finite =
            std::all_of(stats.finite.begin() + row, stats.finite.begin() + row + n, [](char f) { return f != 0; });
        for (std::int64_t x = 0; x < nb; ++x) {
          const KeyBlock& kb = blocks[x];
          const std::int64_t j0 = kb.j0, j1 = kb.j1, nk = kb.nk;
          if (last.hi <= j0 || first.lo >= j1) continue;
          const TileKind kind = classify(p, rb, j0, j1);
          if (kind == TileKind::skip) continue;
          // A hidden row's non-finite q or dO must not reach the keys through a zero weight, nor a
          // hidden key's non-finite k the rows' dQ (p_and_ds_rows clears the hidden dS).
          const bool guarded = kind == TileKind::partial && !(kb.keys_finite && rows_finite);
          const GroupRuns* groups = narrowed<T>(p, kind, guarded) ? &rb.groups : nullptr;
          p_and_ds_rows(p, stats, rb, j0, j1, kind, guarded, Q, q.ld, kb.Kt, kb.Vt, dOr, dO.ld, s, groups);
          const T* K = static_cast<const T*>(kb.kr.ptr);
          const T *P = s.st.get(), *dS = s.dpt.get();
          if (guarded && !rows_finite) {
            visible_product(p, rb, j0, nk, P, ld, 1, dOr, dO.ld, p.dv, kb.dv, p.dv, false);
            visible_product(p, rb, j0, nk, dS, ld, 1, Q, q.ld, p.dk, kb.dk, p.dk, false);
          } else if (groups) {  // by strips of keys, over the rows that see them
            groups->each_strip(j0, j1, [&](std::int64_t ja, std::int64_t jb, std::int64_t r0, std::int64_t r1) {
              const std::int64_t x0 = ja - j0, m = jb - ja, rows = std::min(n, r1) - r0;
              Ops<T>::accumulate_tile(m, p.dv, rows, P + r0 * ld + x0, 1, ld, dOr + r0 * dO.ld, dO.ld, kb.dv + x0 * p.dv,
                                      p.dv);
              Ops<T>::accumulate_tile(m, p.dk, rows, dS + r0 * ld + x0, 1, ld, Q + r0 * q.ld, q.ld, kb.dk + x0 * p.dk,
                                      p.dk);
            });
          } else {
            Ops<T>::accumulate_tile(nk, p.dv, n, P, 1, ld, dOr, dO.ld, kb.dv, p.dv);
            Ops<T>::accumulate_tile(nk, p.dk, n, dS, 1, ld, Q, q.ld, kb.dk, p.dk);
          }
          if (!dq.dq) continue;
          T* dQ = dq.rows(p, b, h, i0);
          if (guarded) {
            visible_product(p, rb, j0, nk, dS, ld, 1, K, kb.kr.ld, p.dk, dQ, p.dk, true);
          } else if (groups) {  // by groups of rows, over their keys
            groups->each_group(n, j0, j1, [&](std::int64_t r0, std::int64_t r1, std::int64_t a, std::int64_t e) {
              if (e > a)
                Ops<T>::accumulate_tile(r1 - r0, p.dk, e - a, dS + r0 * ld + (a - j0), ld, 1, K + (a - j0) * kb.kr.ld,
                                        kb.kr.ld, dQ + r0 * p.dk, p.dk);
            });
          } else {
            Ops<T>::accumulate_tile(n, p.dk, nk, dS, ld, 1, K, kb.kr.ld, dQ, p.dk);
          }
        }
      }
    for (std::int64_t x = 0; x < nb; ++x) {
      write_rows(p.dK, b, kh, blocks[x].j0, blocks[x].nk, p.dk, blocks[x].dk);
      write_rows(p.dV, b, kh, blocks[x].j0, blocks[x].nk, p.dv, blocks[x].dv);
    }
  }
}

// Pass 2 of the two-pass backward: dQ of rows [i0, i1) of (b, h). Tiles transposed,
// St[key][query]: the block's Qᵀ and dOᵀ are packed once, the scaled keys come from the packed
// key blocks (read down their columns: the same score bits as the row layout), V is read in place:
//   St = (s·K)·Qᵀ, Pt = e^(St − lse)/σ, dPt = V·dOᵀ, dSt = s·Pt∘(dPt − D);  dQ += dS·K.
template <class T>
void query_block(const BackwardParams& p, const RowStats<T>& stats, const PackedKeys<T>& kts, std::int64_t b,
                 std::int64_t h, std::int64_t i0, std::int64_t i1, BackwardScratch<T>& s) {
  const RowBlock rb = rows_of(p, b, h, i0, i1);
  pack_transposed<T>(p.q, rb, p.dk, 1.0, s.qt.get(), s.ld);
  pack_transposed<T>(p.dO, rb, p.dv, 1.0, s.dot.get(), s.ld);
  const std::int64_t row = stats.at(p, b, h, i0);
  for (std::int64_t r = 0; r < s.ld; ++r) {  // padding columns: P = 0
    s.lse[r] = r < rb.n ? stats.lse[row + r] : std::numeric_limits<T>::infinity();
    s.D[r] = r < rb.n ? stats.D[row + r] : T(0);
    s.mul[r] = r < rb.n ? stats.mul[row + r] : T(0);
  }
  s.dq_acc.fill(T(0));
  for (std::int64_t j0 = rb.lo_min / kBc * kBc; !rb.empty() && j0 < rb.hi_max; j0 += kBc) {
    const std::int64_t j1 = std::min(j0 + kBc, p.Nkv), nk = j1 - j0;  // the packed key blocks
    const TileKind kind = classify(p, rb, j0, j1);
    if (kind == TileKind::skip) continue;
    Ops<T>::gemm(nk, s.ld, p.dk, kts.at(b, rb.kh, j0 / kBc), 1, kBc, s.qt.get(), s.ld, s.st.get(), s.ld,
                 simd::kOverwrite);
    if (p.transforms_scores()) transform_scores(p, rb, j0, nk, s.st.get(), 1, s.ld, s.dcap.get());
    if (kind == TileKind::partial) apply_mask(p, rb, j0, j1, s.st.get(), s.ld);
    Ops<T>::exp2_columns(s.st.get(), s.ld, nk, s.ld, s.lse.get(), s.mul.get());
    const StridedOperand v = strided_operand<T>(p.v, rb.b, rb.kh, j0, nk, p.dv, s.vp.get());
    Ops<T>::gemm(nk, s.ld, p.dv, static_cast<const T*>(v.ptr), v.rs, v.cs, s.dot.get(), s.ld, s.dpt.get(), s.ld,
                 simd::kOverwrite);
    if (p.has_dropout()) apply_dropout(p, rb, j0, nk, s.dpt.get(), 1, s.ld);
    Ops<T>::softmax_grad(s.st.get(), s.dpt.get(), s.ld, nk, s.ld, s.D.get(), static_cast<T>(p.scale));
    const Operand kr = AlignedRows<T>::tile(p.k, b, rb.kh, j0, nk, p.dk, s.kp.get(), 1);  // read by this block alone
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
    Ops<T>::accumulate_tile(rb.n, p.dk, nk, s.dpt.get(), 1, s.ld, static_cast<const T*>(kr.ptr), kr.ld,
                            s.dq_acc.get(), p.dk);
  }
  write_rows(p.dQ, b, h, i0, rb.n, p.dk, s.dq_acc.get());
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
  RowStats<T> stats = row_stats<T>(p, threads);
  if (!p.dBias.empty())  // the key tasks write every pair a tile reaches; the others are 0
    parallel_for(p.B * p.Hq, 1, threads, [&](std::int64_t t0, std::int64_t t1, int) {
      for (std::int64_t bh = t0; bh < t1; ++bh)
        for (std::int64_t i = 0; i < p.Nq; ++i)
          for (std::int64_t j = 0; j < p.Nkv; ++j) put(p.dBias, bh / p.Hq, bh % p.Hq, i, j, 0.0);
    });
  PerThread<BackwardScratch<T>> scratch(threads);
  // The call's memory beyond its inputs and outputs, at most max_partial_bytes (the memory goal's
  // 64 MiB): the dQ partials of several key groups first, then aligned copies of misaligned rows
  // (at most AlignedRows::kBudgetBytes): Q and dO per thread, then a partial for a misaligned dQ.
  std::int64_t spare = std::min(AlignedRows<T>::kBudgetBytes,
                                max_partial_bytes - (one_pass && groups > 1 ? groups * dq_size * std::int64_t{sizeof(T)} : 0));
  const auto [copy_q, copy_do] = copy_query_rows<T>(p, threads, spare);
  auto scratch_of = [&](int t) -> BackwardScratch<T>& {
    BackwardScratch<T>& s = scratch.get(t, p);
    s.copy_q = copy_q;
    s.copy_do = copy_do;
    return s;
  };
  const PackedKeys<T> kts = pack_keys<T>(p, nkb, threads);
  if (std::is_same_v<T, float> && p.lse_covers_keys) {
    parallel_for(query_items, 1, threads, [&](std::int64_t t0, std::int64_t t1, int t) {
      for (std::int64_t item = t0; item < t1; ++item) {
        const std::int64_t qb = nqb - 1 - item % nqb, head = item / nqb;  // costliest (causal) first
        normalisers(p, kts, head / p.Hq, head % p.Hq, qb * kBr, std::min(p.Nq, (qb + 1) * kBr), stats, scratch_of(t));
      }
    });
  }
  if (!p.dSinks.empty()) write_sink_grads(p, stats);
  if (!one_pass) {
    parallel_for(key_items, 1, threads, [&](std::int64_t t0, std::int64_t t1, int t) {
      for (std::int64_t item = t0; item < t1; ++item)
        key_blocks(p, stats, kts, item / nkb / p.Hkv, item / nkb % p.Hkv, item % nkb, item % nkb + 1,
                   DqPartial<T>{}, scratch_of(t));
    });
    parallel_for(query_items, 1, threads, [&](std::int64_t t0, std::int64_t t1, int t) {
      for (std::int64_t item = t0; item < t1; ++item) {
        const std::int64_t qb = nqb - 1 - item % nqb, head = item / nqb;  // costliest (causal) first
        query_block(p, stats, kts, head / p.Hq, head % p.Hq, qb * kBr, std::min(p.Nq, (qb + 1) * kBr), scratch_of(t));
      }
    });
    return;
  }
  // One key group and a dQ laid out as the partial ([B, Hq, Nq, dk] of T, contiguous): the key
  // tasks add into dQ itself (the same sums in the same order), with no partial to fill and copy.
  const TensorView& dQ = p.dQ;
  // A dQ whose rows are off 64-byte boundaries (the C operand of every dS·K, read and written as
  // vectors) is summed in the aligned partial instead, when it fits what the copies left (measured:
  // the smaller part of the misaligned backward's loss).
  const bool dq_rows_ok = !AlignedRows<T>::wanted(dQ, 0) || dq_size * std::int64_t{sizeof(T)} > spare;
  const bool direct = groups == 1 && dQ.dtype == (std::is_same_v<T, float> ? DType::f32 : DType::f64) &&
                      dQ.strides[3] == 1 && dQ.strides[2] == p.dk && dQ.strides[1] == p.Nq * p.dk &&
                      (p.B == 1 || dQ.strides[0] == p.Hq * p.Nq * p.dk) && dq_rows_ok;
  Buffer<T> partials(direct ? 0 : groups * dq_size);
  T* const dq_base = direct ? static_cast<T*>(dQ.data) : partials.get();
  parallel_for(direct ? p.B * p.Hq : groups, 1, threads, [&](std::int64_t t0, std::int64_t t1, int) {
    const std::int64_t size = direct ? p.Nq * p.dk : dq_size;
    std::fill(dq_base + t0 * size, dq_base + t1 * size, T(0));
  });
  parallel_for(key_items, 1, threads, [&](std::int64_t t0, std::int64_t t1, int t) {
    for (std::int64_t item = t0; item < t1; ++item) {
      const std::int64_t g = item % groups, head = item / groups;  // under a causal mask, early keys cost most
      key_blocks(p, stats, kts, head / p.Hkv, head % p.Hkv, g * per, std::min(nkb, (g + 1) * per),
                 DqPartial<T>{dq_base + g * dq_size}, scratch_of(t));
    }
  });
  if (direct) return;
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

void detail::run_backward(const BackwardParams& p, Compute compute) {
  if (runs_as_float(p, compute)) {  // bf16 products widened anyway: the float32 kernels (bf16_as_float.h)
    std::vector<Tensor> copies;
    return backward_all<float>(float_params(p, copies));
  }
  switch (p.dtype) {
    case DType::f32:
    case DType::bf16:
      // bf16 products for bfloat16 inputs and on request, as the forward; else (or for what the
      // bf16 path leaves to it) float32, bfloat16 inputs converted on load.
      if ((compute == Compute::bf16 || p.dtype == DType::bf16) && bfdot::backward_handles(p))
        return bfdot::backward(p);
      return backward_all<float>(p);
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
  detail::run_backward(detail::make_backward_params(q, k, v, out, lse, dout, grads, options, detail::Kernel::fast),
                       options.compute);
}

}  // namespace attnscale
