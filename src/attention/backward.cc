// backward(): gradients by recomputation from q, k, v, out, lse and dO, as FlashAttention-2 does.
//
// Forward (per row i):  t_ij = log2(e)·(s·q_i·k_j + bias_ij);  P_ij = 2^(t_ij − log2(e)·lse_i);
//                       o_i = Σ_j P_ij v_j.
// Backward:  dV_j = Σ_i P_ij dO_i;  dP_ij = dO_i·v_j;  D_i = Σ_j P_ij dP_ij = dO_i·o_i;
//            dS_ij = s·P_ij (dP_ij − D_i);  dQ_i = Σ_j dS_ij k_j;  dK_j = Σ_i dS_ij q_i.
// P is recomputed tile by tile from the stored lse: nothing N x N is kept.
//
// Deterministic by construction, with no atomics: pass 1 gives each task one (batch, KV head,
// key block) and it alone writes that block of dK and dV, summing over the group's query heads
// and query blocks in a fixed order; pass 2 gives each task one (batch, head, query block) and it
// alone writes that block of dQ, summing over key tiles in order. The partition depends on the
// shape only, so every thread count gives the same bits. (Pass 2 recomputes P and dP once more:
// 7 tile products instead of 5, the price of needing neither atomics nor an N x d buffer per
// thread.)
#include <memory>
#include <string>
#include <vector>

#include "attention/params.h"
#include "attention/tiles.h"
#include "attnscale/error.h"
#include "common/parallel.h"

namespace attnscale {
namespace detail {
namespace {

template <class T>
struct BackwardScratch {
  static constexpr std::int64_t ld = kBr;
  Buffer<T> qt, dot, qr, dor, st, dpt, kp, vp, lse2, D, one, dk_acc, dv_acc, dq_acc;
  explicit BackwardScratch(const Params& p)
      : qt(p.dk * ld), dot(p.dv * ld), qr(ld * p.dk), dor(ld * p.dv), st(kBc * ld), dpt(kBc * ld), kp(kBc * p.dk),
        vp(kBc * p.dv), lse2(ld), D(ld), one(ld), dk_acc(kBc * p.dk), dv_acc(kBc * p.dv), dq_acc(ld * p.dk) {
    one.fill(T(1));
  }
};

// Rows [i0, i1) of head h, with what every key tile needs from them: Qᵀ·s·log2(e), dOᵀ,
// lse in base 2 and D_i = dO_i·o_i.
template <class T>
struct QueryBlock {
  RowBlock rb;
  Operand q, dO;  // row-major rows [n x dk], [n x dv]
};
template <class T>
QueryBlock<T> prepare(const BackwardParams& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t i1,
                      BackwardScratch<T>& s) {
  QueryBlock<T> qb;
  qb.rb.b = b;
  qb.rb.kh = p.kv_head(h);
  for (std::int64_t i = i0; i < i1; ++i) qb.rb.add(p, h, i);
  const RowBlock& rb = qb.rb;
  pack_transposed<T>(p.q, rb, p.dk, p.scale * kLog2e, s.qt.get(), s.ld);
  pack_transposed<T>(p.dO, rb, p.dv, 1.0, s.dot.get(), s.ld);
  qb.q = rows_operand<T>(p.q, b, h, i0, rb.n, p.dk, s.qr.get());
  qb.dO = rows_operand<T>(p.dO, b, h, i0, rb.n, p.dv, s.dor.get());
  for (std::int64_t r = 0; r < s.ld; ++r) {
    if (r >= rb.n) {  // padding columns: P = 0
      s.lse2[r] = std::numeric_limits<T>::infinity();
      s.D[r] = 0;
      continue;
    }
    const double lse = load(p.lse, element(p.lse, b, h, rb.i[r], 0));
    // A fully masked row (lse = -inf) must give P = 0: subtracting +inf gives 2^(-inf) = 0 for
    // every score, where subtracting -inf would give 2^(+inf) or NaN.
    s.lse2[r] = lse == -INFINITY ? std::numeric_limits<T>::infinity() : static_cast<T>(lse * kLog2e);
    T d = 0;
    for (std::int64_t c = 0; c < p.dv; ++c)
      d += value<T>(p.dO, b, h, rb.i[r], c) * value<T>(p.out, b, h, rb.i[r], c);
    s.D[r] = d;
  }
  return qb;
}

// For keys [j0, j1) against a prepared block: Pt = P tile in s.st, dSt = dS tile in s.dpt.
template <class T>
void gradient_tile(const BackwardParams& p, const RowBlock& rb, std::int64_t j0, std::int64_t j1, TileKind kind,
                   BackwardScratch<T>& s) {
  const std::int64_t nk = j1 - j0;
  const StridedOperand k = strided_operand<T>(p.k, rb.b, rb.kh, j0, nk, p.dk, s.kp.get());
  Ops<T>::gemm(nk, s.ld, p.dk, static_cast<const T*>(k.ptr), k.rs, k.cs, s.qt.get(), s.ld, s.st.get(), s.ld,
               simd::kOverwrite);
  if (kind == TileKind::partial) apply_mask(p, rb, j0, j1, s.st.get(), s.ld);
  Ops<T>::exp2_columns(s.st.get(), s.ld, nk, s.ld, s.lse2.get(), s.one.get());
  const StridedOperand v = strided_operand<T>(p.v, rb.b, rb.kh, j0, nk, p.dv, s.vp.get());
  Ops<T>::gemm(nk, s.ld, p.dv, static_cast<const T*>(v.ptr), v.rs, v.cs, s.dot.get(), s.ld, s.dpt.get(), s.ld,
               simd::kOverwrite);
  Ops<T>::softmax_grad(s.st.get(), s.dpt.get(), s.ld, nk, s.ld, s.D.get(), static_cast<T>(p.scale));
}

template <class T>
void write_rows(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t n,
                std::int64_t d, const T* x) {
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t c = 0; c < d; ++c) {
      if (t.dtype == DType::f32) *at<float>(t, b, h, i0 + r, c) = static_cast<float>(x[r * d + c]);
      else store(t, element(t, b, h, i0 + r, c), static_cast<double>(x[r * d + c]));
    }
}

// Pass 1: dK and dV of keys [j0, j1) of (b, kh).
template <class T>
void key_block(const BackwardParams& p, std::int64_t b, std::int64_t kh, std::int64_t j0, std::int64_t j1,
               BackwardScratch<T>& s) {
  const std::int64_t nk = j1 - j0;
  s.dk_acc.fill(T(0));
  s.dv_acc.fill(T(0));
  for (std::int64_t h = kh * p.group(); h < (kh + 1) * p.group(); ++h)
    for (std::int64_t i0 = 0; i0 < p.Nq; i0 += kBr) {
      const std::int64_t i1 = std::min(p.Nq, i0 + kBr);
      // Key ranges grow with i (causal/window), so the block's union is [lo(i0), hi(i1 - 1)).
      const KeyRange first = key_range(p, i0), last = key_range(p, i1 - 1);
      if (last.hi <= j0 || first.lo >= j1) continue;
      const QueryBlock<T> qb = prepare(p, b, h, i0, i1, s);
      const TileKind kind = classify(p, qb.rb, j0, j1);
      if (kind == TileKind::skip) continue;
      gradient_tile(p, qb.rb, j0, j1, kind, s);
      const std::int64_t n = qb.rb.n;
      Ops<T>::gemm(nk, p.dv, n, s.st.get(), s.ld, 1, static_cast<const T*>(qb.dO.ptr), qb.dO.ld, s.dv_acc.get(),
                   p.dv, simd::kAccumulate);
      Ops<T>::gemm(nk, p.dk, n, s.dpt.get(), s.ld, 1, static_cast<const T*>(qb.q.ptr), qb.q.ld, s.dk_acc.get(),
                   p.dk, simd::kAccumulate);
    }
  write_rows(p.dK, b, kh, j0, nk, p.dk, s.dk_acc.get());
  write_rows(p.dV, b, kh, j0, nk, p.dv, s.dv_acc.get());
}

// Pass 2: dQ of rows [i0, i1) of (b, h).
template <class T>
void query_block(const BackwardParams& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t i1,
                 BackwardScratch<T>& s) {
  const QueryBlock<T> qb = prepare(p, b, h, i0, i1, s);
  const RowBlock& rb = qb.rb;
  s.dq_acc.fill(T(0));
  for (std::int64_t j0 = rb.lo_min; !rb.empty() && j0 < rb.hi_max; j0 += kBc) {
    const std::int64_t j1 = std::min(j0 + kBc, rb.hi_max), nk = j1 - j0;
    const TileKind kind = classify(p, rb, j0, j1);
    if (kind == TileKind::skip) continue;
    gradient_tile(p, rb, j0, j1, kind, s);
    const Operand k = rows_operand<T>(p.k, b, rb.kh, j0, nk, p.dk, s.kp.get());
    Ops<T>::gemm(rb.n, p.dk, nk, s.dpt.get(), 1, s.ld, static_cast<const T*>(k.ptr), k.ld, s.dq_acc.get(), p.dk,
                 simd::kAccumulate);
  }
  write_rows(p.dQ, b, h, i0, rb.n, p.dk, s.dq_acc.get());
}

template <class T>
void backward_all(const BackwardParams& p) {
  const std::int64_t nkb = (p.Nkv + kBc - 1) / kBc, nqb = (p.Nq + kBr - 1) / kBr;
  const std::int64_t key_items = p.B * p.Hkv * nkb, query_items = p.B * p.Hq * nqb;
  const int threads = resolve_threads(p.threads, std::max(key_items, query_items));
  std::vector<std::unique_ptr<BackwardScratch<T>>> scratch(threads);
  auto scratch_of = [&](int t) -> BackwardScratch<T>& {
    if (!scratch[t]) scratch[t] = std::make_unique<BackwardScratch<T>>(p);
    return *scratch[t];
  };
  parallel_for(key_items, 1, threads, [&](std::int64_t t0, std::int64_t t1, int t) {
    for (std::int64_t item = t0; item < t1; ++item) {
      const std::int64_t kb = item % nkb, head = item / nkb;
      key_block(p, head / p.Hkv, head % p.Hkv, kb * kBc, std::min(p.Nkv, (kb + 1) * kBc), scratch_of(t));
    }
  });
  parallel_for(query_items, 1, threads, [&](std::int64_t t0, std::int64_t t1, int t) {
    for (std::int64_t item = t0; item < t1; ++item) {
      const std::int64_t qb = nqb - 1 - item % nqb, head = item / nqb;  // costliest (causal) first
      query_block(p, head / p.Hq, head % p.Hq, qb * kBr, std::min(p.Nq, (qb + 1) * kBr), scratch_of(t));
    }
  });
}

}  // namespace
}  // namespace detail

void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& lse, const TensorView& dout, const Gradients& grads,
              const Options& options) {
  const auto p = detail::make_backward_params(q, k, v, out, lse, dout, grads, options, detail::Kernel::fast);
  detail::simd::init_target_from_env();
  switch (p.dtype) {
    case DType::f32:
    case DType::bf16: return detail::backward_all<float>(p);  // bf16: converted to float32 on load
    case DType::f64: return detail::backward_all<double>(p);
    default: throw Error("q: dtype " + std::string(dtype_name(p.dtype)) + " is not supported by backward");
  }
}

}  // namespace attnscale
