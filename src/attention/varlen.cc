// Packed sequences: see varlen.h.
#include "attention/varlen.h"

#include <cmath>
#include <string>
#include <vector>

#include "attention/score_transforms.h"
#include "attnscale/error.h"

namespace attnscale::detail {
namespace {

// cu_seqlens: starts at 0, never decreases, ends at the packed length.
void check_offsets(const char* name, const std::vector<std::int64_t>& cu, std::int64_t total, std::size_t size) {
  if (cu.size() < 2) throw Error(std::string(name) + ": expected at least 2 offsets [0, ..., total], got " + std::to_string(cu.size()));
  if (cu.size() != size)
    throw Error(std::string(name) + ": " + std::to_string(cu.size()) + " offsets, but cu_seqlens_q has " +
                std::to_string(size) + " (one more than the number of sequences each)");
  if (cu.front() != 0) throw Error(std::string(name) + ": must start at 0, got " + std::to_string(cu.front()));
  for (std::size_t s = 1; s < cu.size(); ++s)
    if (cu[s] < cu[s - 1])
      throw Error(std::string(name) + ": offsets must not decrease, got " + std::to_string(cu[s - 1]) + " then " +
                  std::to_string(cu[s]) + " at index " + std::to_string(s));
  if (cu.back() != total)
    throw Error(std::string(name) + ": must end at the packed length " + std::to_string(total) + ", got " +
                std::to_string(cu.back()));
}

// The packed problem as one sequence (B = 1): the shapes and outputs validated once, with the
// options that do not depend on the sequence.
Options packed_options(const TensorView& q, const Options& options) {
  if (q.rank == 4 && q.shape[0] != 1)
    throw Error("q: packed sequences (cu_seqlens_q) take q as [Hq, total_q, dk] or [1, Hq, total_q, dk], got " +
                q.shape_str());
  if (q.rank < 3)
    throw Error("q: packed sequences (cu_seqlens_q) take q as [Hq, total_q, dk], got " + q.shape_str());
  if (!options.mask.explicit_mask.empty()) throw Error("mask: not accepted with packed sequences (cu_seqlens_q)");
  Options o = options;
  o.cu_seqlens_q.clear();
  o.cu_seqlens_k.clear();
  o.alibi_slopes = {};  // [S, Hq] is checked per sequence below
  return o;
}

// Rows [start, start + n) along dimension `dim` of a normalised view.
TensorView slice(TensorView t, int dim, std::int64_t start, std::int64_t n) {
  if (t.empty()) return t;
  t.data = static_cast<char*>(t.data) + start * t.strides[dim] * static_cast<std::int64_t>(dtype_size(t.dtype));
  t.shape[dim] = n;
  return t;
}

// Sequence s's view of the whole problem's params: its rows, its keys, its ALiBi row, b = s.
template <class P>
P sequence(const P& whole, const Options& options, std::int64_t s) {
  P p = whole;
  const std::int64_t q0 = options.cu_seqlens_q[s], k0 = options.cu_seqlens_k[s];
  p.Nq = options.cu_seqlens_q[s + 1] - q0;
  p.Nkv = options.cu_seqlens_k[s + 1] - k0;
  p.q = slice(p.q, 2, q0, p.Nq);
  p.out = slice(p.out, 2, q0, p.Nq);
  p.lse = slice(p.lse, 2, q0, p.Nq);
  p.probs = slice(slice(p.probs, 2, q0, p.Nq), 3, k0, p.Nkv);  // the sequence's diagonal block
  p.k = slice(p.k, 2, k0, p.Nkv);
  p.v = slice(p.v, 2, k0, p.Nkv);
  p.batch_base = s;
  if (!options.alibi_slopes.empty()) {
    const TensorView& a = options.alibi_slopes;
    TensorView row = a.rank == 2 ? slice(a, 0, s, 1) : a;
    if (row.rank == 1) {
      row.rank = 2;
      row.shape = {1, a.shape[0], 0, 0};
      row.strides = {0, a.strides[0], 0, 0};
    }
    p.alibi = row;
  }
  return p;
}

// ALiBi slopes of packed sequences: [Hq], or [S, Hq] with one row per sequence.
void check_alibi(const Options& options, std::int64_t S, std::int64_t Hq) {
  if (!options.alibi_slopes.empty()) check_per_head("alibi_slopes", options.alibi_slopes, Hq, S);
}

// Rows [0, n) x [0, d) of (0, h, ·, ·) of a normalised view set to x.
void fill_rows(const TensorView& t, std::int64_t heads, std::int64_t n, std::int64_t d, double x) {
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t c = 0; c < d; ++c) store(t, element(t, 0, h, i, c), x);
}

}  // namespace

void varlen_forward(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outputs,
                    const Options& options, Kernel kernel) {
  const Params whole = make_forward_params(q, k, v, outputs, packed_options(q, options), kernel);
  check_offsets("cu_seqlens_q", options.cu_seqlens_q, whole.Nq, options.cu_seqlens_q.size());
  check_offsets("cu_seqlens_k", options.cu_seqlens_k, whole.Nkv, options.cu_seqlens_q.size());
  const std::int64_t S = static_cast<std::int64_t>(options.cu_seqlens_q.size()) - 1;
  check_alibi(options, S, whole.Hq);
  // probs [Hq, total_q, total_k]: each sequence writes its diagonal block; pairs of two
  // sequences never attend each other, so everything else is 0.
  if (!whole.probs.empty())
    fill_rows(whole.probs, whole.Hq, whole.Nq, whole.Nkv, 0.0);
  for (std::int64_t s = 0; s < S; ++s) {
    const Params p = sequence(whole, options, s);
    if (p.Nq == 0) continue;
    if (p.Nkv == 0) {  // no key: out = 0, lse = the sink (or -inf)
      fill_rows(p.out, p.Hq, p.Nq, p.dv, 0.0);
      if (!p.lse.empty())
        for (std::int64_t h = 0; h < p.Hq; ++h)
          for (std::int64_t i = 0; i < p.Nq; ++i) store(p.lse, element(p.lse, 0, h, i, 0), sink_logit(p, h));
      continue;
    }
    if (kernel == Kernel::fast) run_forward(p, options.compute);
    else run_reference_forward(p);
  }
}

void varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                     const TensorView& lse, const TensorView& dout, const Gradients& grads, const Options& options,
                     Kernel kernel) {
  const BackwardParams whole = make_backward_params(q, k, v, out, lse, dout, grads, packed_options(q, options), kernel);
  check_offsets("cu_seqlens_q", options.cu_seqlens_q, whole.Nq, options.cu_seqlens_q.size());
  check_offsets("cu_seqlens_k", options.cu_seqlens_k, whole.Nkv, options.cu_seqlens_q.size());
  const std::int64_t S = static_cast<std::int64_t>(options.cu_seqlens_q.size()) - 1;
  check_alibi(options, S, whole.Hq);
  // dsinks sums over every sequence: each writes its own part, added here in sequence order.
  std::vector<double> dsinks(whole.Hq, 0.0), part(whole.Hq, 0.0);
  const TensorView part_view = TensorView::contiguous(part.data(), DType::f64, {whole.Hq});
  for (std::int64_t s = 0; s < S; ++s) {
    BackwardParams p = sequence(whole, options, s);
    const std::int64_t q0 = options.cu_seqlens_q[s], k0 = options.cu_seqlens_k[s];
    p.dO = slice(p.dO, 2, q0, p.Nq);
    p.dLse = slice(p.dLse, 2, q0, p.Nq);
    p.dQ = slice(p.dQ, 2, q0, p.Nq);
    p.dK = slice(p.dK, 2, k0, p.Nkv);
    p.dV = slice(p.dV, 2, k0, p.Nkv);
    if (p.Nq == 0 || p.Nkv == 0) {  // nothing attends: zero gradients
      fill_rows(p.dQ, p.Hq, p.Nq, p.dk, 0.0);
      fill_rows(p.dK, p.Hkv, p.Nkv, p.dk, 0.0);
      fill_rows(p.dV, p.Hkv, p.Nkv, p.dv, 0.0);
      // dsinks: lse_i = sink_h over no key (P_sink = 1), so dsink_h = −Σ_i (D_i − dlse_i) with
      // D = dO·0 = 0, the sum of the rows' dlse.
      if (!p.dSinks.empty() && !p.dLse.empty())
        for (std::int64_t h = 0; h < p.Hq; ++h)
          for (std::int64_t i = 0; i < p.Nq; ++i) dsinks[h] += value<double>(p.dLse, 0, h, i, 0);
      continue;
    }
    if (!p.dSinks.empty()) p.dSinks = part_view;
    if (kernel == Kernel::fast) run_backward(p, options.compute);
    else run_reference_backward(p);
    for (std::int64_t h = 0; h < whole.Hq && !whole.dSinks.empty(); ++h) dsinks[h] += part[h];
  }
  if (!whole.dSinks.empty())
    for (std::int64_t h = 0; h < whole.Hq; ++h) store(whole.dSinks, element1(whole.dSinks, h), dsinks[h]);
}

}  // namespace attnscale::detail
