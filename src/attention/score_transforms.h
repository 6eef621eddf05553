// The score transforms of Options, in one place for every path (forward, bf16 forward, decode,
// backward; the float64 reference applies the same formulas through the scalar functions here):
//   soft-capping and ALiBi on the scores   t = cap(x) − slope·|diag(i) − j|  (+ the mask's bias)
//   dropout on the probabilities          P_ij → Z_ij·P_ij / (1 − p)
//   the sink in each row's normaliser      l → l + exp(sink − m)
// Each is off unless its option is given; the kernels test one flag per tile (Params::
// transforms_scores, has_dropout, sinks.empty()) and call these only then, so a feature that is
// off costs nothing in the loop.
//
// Tiles are addressed as X(r, j) = X[r·rs + j·cs] for the block's row r and key j0 + j, which
// covers the row layout S[r][j] (rs = ld, cs = 1) and the transposed St[j][r] (rs = 1, cs = ld).
#pragma once
#include <Random123/philox.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "attention/alibi.h"
#include "attention/params.h"
#include "attention/tiles.h"

namespace attnscale::detail {

// ALiBi slope of (batch b, query head h), or 0 without ALiBi.
inline double alibi_slope(const Params& p, std::int64_t b, std::int64_t h) {
  if (p.alibi.empty()) return 0.0;
  return load(p.alibi, static_cast<const char*>(p.alibi.data) +
                           (b * p.alibi.strides[0] + h * p.alibi.strides[1]) *
                               static_cast<std::int64_t>(dtype_size(p.alibi.dtype)));
}

// Soft-capping and ALiBi on a tile of scores x = s·q·k (natural units):
//   x → c·tanh(x / c) − slope·|diag(i) − j|.
// Derivation of the backward's factor: d/dx [c·tanh(x/c)] = 1 − tanh²(x/c), so dcap(r, j) =
// 1 − tanh²(x/c) multiplies dS (w.r.t. the capped score) into the gradient w.r.t. x. dcap (same
// layout as S) is written when given, for the backward. The cap goes over the tile's contiguous
// runs (a row of S, or one key's rows of the transposed St) in Ops<T>::softcap: a vector tanh in
// float32 (simd::softcap), std::tanh in float64.
template <class T>
void transform_scores(const Params& p, const RowBlock& rb, std::int64_t j0, std::int64_t nk, T* S, std::int64_t rs,
                      std::int64_t cs, T* dcap = nullptr) {
  if (p.softcap > 0) {
    const bool rows = cs == 1;  // else rs == 1: runs along r, one per key
    const std::int64_t runs = rows ? rb.n : nk, run = rows ? nk : rb.n, step = rows ? rs : cs;
    for (std::int64_t u = 0; u < runs; ++u)
      Ops<T>::softcap(S + u * step, run, static_cast<T>(p.softcap), dcap ? dcap + u * step : nullptr);
  }
  if (p.alibi.empty()) return;
  for (std::int64_t r = 0; r < rb.n; ++r) {
    const T slope = static_cast<T>(alibi_slope(p, rb.b, rb.h[r]));
    subtract_alibi(S + r * rs, nk, cs, slope, rb.i[r] + p.diag_offset() - j0);
  }
}

// dS ∘= dcap over a tile (the soft-capping factor of transform_scores).
template <class T>
void scale_by_cap(const RowBlock& rb, std::int64_t nk, T* dS, const T* dcap, std::int64_t rs, std::int64_t cs) {
  for (std::int64_t r = 0; r < rb.n; ++r)
    for (std::int64_t j = 0; j < nk; ++j) dS[r * rs + j * cs] *= dcap[r * rs + j * cs];
}

// The dropout mask. Pair (b, h, i, j) reads 32-bit word j mod 8 of Philox4x64-10 with key
// (seed, offset) and counter (j / 8, i, h, b): a pure function of its coordinates, one block per 8
// keys. The pair is kept when the word is at least floor(p·2^32), i.e. with probability
// 1 − floor(p·2^32)/2^32, which is 1 − p to within 2^-32.
class DropoutMask {
 public:
  explicit DropoutMask(const Params& p)
      : key_{{p.dropout_seed, p.dropout_offset}},
        threshold_(static_cast<std::uint32_t>(std::min(std::ldexp(p.dropout_p, 32), 4294967295.0))),
        keep_scale_(1.0 / (1.0 - p.dropout_p)),
        base_(p.batch_base) {}
  // The 8 keep bits of keys [8·c, 8·c + 8) of row (b, h, i), bit j mod 8.
  std::uint32_t bits(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t c) const {
    const r123::Philox4x64::ctr_type ctr = {{static_cast<std::uint64_t>(c), static_cast<std::uint64_t>(i),
                                             static_cast<std::uint64_t>(h), static_cast<std::uint64_t>(base_ + b)}};
    const auto w = r123::Philox4x64()(ctr, key_);
    std::uint32_t out = 0;
    for (int k = 0; k < 8; ++k) {
      const auto word = static_cast<std::uint32_t>(w[k / 2] >> (32 * (k % 2)));
      out |= static_cast<std::uint32_t>(word >= threshold_) << k;
    }
    return out;
  }
  bool keep(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return (bits(b, h, i, j / 8) >> (j % 8)) & 1u;
  }
  double keep_scale() const { return keep_scale_; }

 private:
  r123::Philox4x64::key_type key_;
  std::uint32_t threshold_;
  double keep_scale_;
  std::int64_t base_;
};

// P(r, j) → Z·P / (1 − p) over a tile of keys [j0, j0 + nk).
template <class T>
void apply_dropout(const Params& p, const RowBlock& rb, std::int64_t j0, std::int64_t nk, T* P, std::int64_t rs,
                   std::int64_t cs) {
  const DropoutMask mask(p);
  const T scale = static_cast<T>(mask.keep_scale());
  for (std::int64_t r = 0; r < rb.n; ++r) {
    std::uint32_t bits = 0;
    for (std::int64_t j = 0; j < nk; ++j) {
      const std::int64_t key = j0 + j;
      if (j == 0 || key % 8 == 0) bits = mask.bits(rb.b, rb.h[r], rb.i[r], key / 8);
      T& x = P[r * rs + j * cs];
      x = (bits >> (key % 8)) & 1u ? x * scale : T(0);
    }
  }
}

// The probs output under dropout (FlashAttention's S_dmask convention): a pair the mask drops is
// written as −P_ij, a kept one as P_ij, so the sign carries the mask and the magnitude the softmax
// before dropout. Runs after the row block's probs are written.
template <class T>
void mark_dropped_probs(const Params& p, const RowBlock& rb) {
  const DropoutMask mask(p);
  for (std::int64_t r = 0; r < rb.n; ++r) {
    std::uint32_t bits = 0;
    for (std::int64_t j = 0; j < p.Nkv; ++j) {
      if (j % 8 == 0) bits = mask.bits(rb.b, rb.h[r], rb.i[r], j / 8);
      if (!((bits >> (j % 8)) & 1u)) put<T>(p.probs, rb.b, rb.h[r], rb.i[r], j, -value<T>(p.probs, rb.b, rb.h[r], rb.i[r], j));
    }
  }
}

// Sink logit of query head h, or -inf without sinks.
inline double sink_logit(const Params& p, std::int64_t h) {
  if (p.sinks.empty()) return -INFINITY;
  return load(p.sinks, element1(p.sinks, h));
}

// Folds each row's sink into its online-softmax state (l = Σ_j e^(t_j − m), o = Σ_j
// e^(t_j − m)·v_j). The sink σ adds e^(σ − m) to l; with M = max(m, σ):
//   l' = e^(m − M)·l + e^(σ − M),  o' = e^(m − M)·o,  m' = M,
// so out = o'/l' and lse = m' + ln l' include it. A row that saw no key (m = −inf,
// l = 0) gets l' = 1, m' = σ: out = 0 and lse = sink.
template <class T>
void fold_sinks(const Params& p, const RowBlock& rb, T* o, T* m, T* l) {
  for (std::int64_t r = 0; r < rb.n; ++r) {
    const T s = static_cast<T>(sink_logit(p, rb.h[r]));
    const T M = std::max(m[r], s);
    const T a = l[r] == T(0) ? T(0) : std::exp(m[r] - M);
    for (std::int64_t c = 0; c < p.dv; ++c) o[r * p.dv + c] *= a;
    l[r] = a * l[r] + std::exp(s - M);
    m[r] = M;
  }
}

}  // namespace attnscale::detail
