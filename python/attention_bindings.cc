// attnscale.attention / attention_backward / self_attention / multi_head_attention.
//
// Shapes (numpy, rank 2, 3 or 4; leading dimensions missing from k/v read as size 1):
//   q [B, Hq, Nq, dk]   k [B, Hkv, Nkv, dk]   v [B, Hkv, Nkv, dv]   (Hq % Hkv == 0: GQA)
//   out [..q.., Nq, dv]  lse [..q.., Nq]  probs [..q.., Nq, Nkv]  — q's leading dimensions
// Inputs are read in place (array_view.h); outputs are new C-ordered arrays of q's dtype. The
// GIL is released while the library computes; validation errors raise ValueError with the
// library's message before anything is computed.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "array_view.h"
#include "attention_bindings.h"
#include "attnscale/attention.h"
#include "attnscale/decode.h"
#include "attnscale/self_attention.h"
#include "options.h"

namespace attnscale::python {
namespace {

std::vector<std::int64_t> shape_of(const TensorView& t) {
  return std::vector<std::int64_t>(t.shape.begin(), t.shape.begin() + t.rank);
}

// lse and probs of bfloat16 inputs are float32: the backward recomputes P = exp(s - lse), and an
// lse rounded to bfloat16 (8 bits) would move every P of the row by up to |lse| * 2^-9.
DType statistics_dtype(DType inputs) { return inputs == DType::bf16 ? DType::f32 : inputs; }

py::object attention(py::handle q_obj, py::handle k_obj, py::handle v_obj, py::handle scale,
                     py::handle causal, py::handle window, py::handle align, py::handle mask,
                     bool return_lse, bool return_probs, int threads, bool reference, py::handle compute,
                     double softcap, py::handle alibi_slopes, py::handle sinks, double dropout_p,
                     std::uint64_t dropout_seed, std::uint64_t dropout_offset, py::handle cu_seqlens_q,
                     py::handle cu_seqlens_k) {
  const ArrayView q = as_view("q", q_obj, ArrayKind::floating);
  const ArrayView k = as_view("k", k_obj, ArrayKind::floating);
  const ArrayView v = as_view("v", v_obj, ArrayKind::floating);
  MaskedOptions opt = make_options(scale, causal, window, align, mask, threads);
  opt.options.compute = parse_compute(compute);
  add_extras(opt, {softcap, alibi_slopes, sinks, dropout_p, dropout_seed, dropout_offset, cu_seqlens_q, cu_seqlens_k});
  Outputs outputs;
  ArrayView out, lse, probs;
  const OutputShapes shapes = output_shapes(q.view, k.view, v.view);  // a bad rank: Error naming it
  out = new_array(q.view.dtype, shapes.out);
  outputs.out = out.view;
  const DType stats = statistics_dtype(q.view.dtype);
  if (return_lse) outputs.lse = (lse = new_array(stats, shapes.lse)).view;
  if (return_probs) outputs.probs = (probs = new_array(stats, shapes.probs)).view;
  {
    py::gil_scoped_release unlocked;
    if (reference)
      reference::forward(q.view, k.view, v.view, outputs, opt.options);
    else
      forward(q.view, k.view, v.view, outputs, opt.options);
  }
  if (!return_lse && !return_probs) return out.array;
  py::list result;
  result.append(out.array);
  if (return_lse) result.append(lse.array);
  if (return_probs) result.append(probs.array);
  return py::tuple(result);
}

py::tuple attention_backward(py::handle q_obj, py::handle k_obj, py::handle v_obj, py::handle out_obj,
                             py::handle lse_obj, py::handle dout_obj, py::handle scale, py::handle causal,
                             py::handle window, py::handle align, py::handle mask, int threads,
                             bool reference, double softcap, py::handle alibi_slopes, py::handle sinks,
                             double dropout_p, std::uint64_t dropout_seed, std::uint64_t dropout_offset,
                             py::handle cu_seqlens_q, py::handle cu_seqlens_k, bool return_dsinks,
                             bool return_dbias, py::handle compute, py::handle dlse_obj) {
  const ArrayView q = as_view("q", q_obj, ArrayKind::floating);
  const ArrayView k = as_view("k", k_obj, ArrayKind::floating);
  const ArrayView v = as_view("v", v_obj, ArrayKind::floating);
  // out and lse are not needed by the reference (it recomputes them); None passes nothing.
  const ArrayView out = out_obj.is_none() ? ArrayView{} : as_view("out", out_obj, ArrayKind::floating);
  const ArrayView lse = lse_obj.is_none() ? ArrayView{} : as_view("lse", lse_obj, ArrayKind::floating);
  const ArrayView dout = as_view("dout", dout_obj, ArrayKind::floating);
  const ArrayView dlse = dlse_obj.is_none() ? ArrayView{} : as_view("dlse", dlse_obj, ArrayKind::floating);
  if (!reference && (out_obj.is_none() || lse_obj.is_none()))
    throw py::value_error(std::string(out_obj.is_none() ? "out" : "lse") +
                          ": required (the forward's output; only reference=True recomputes it)");
  MaskedOptions opt = make_options(scale, causal, window, align, mask, threads);
  add_extras(opt, {softcap, alibi_slopes, sinks, dropout_p, dropout_seed, dropout_offset, cu_seqlens_q, cu_seqlens_k});
  opt.options.compute = parse_compute(compute);
  opt.options.dlse = dlse.view;
  if (return_dsinks && opt.sinks.view.empty()) throw py::value_error("return_dsinks: requires sinks");
  if (return_dbias && (opt.mask.view.empty() || opt.mask.view.dtype == DType::u8))
    throw py::value_error("return_dbias: requires a float (additive) mask");
  ArrayView dq, dk, dv, dsinks, dbias;
  Gradients grads;
  const OutputShapes shapes = output_shapes(q.view, k.view, v.view);  // a bad rank: Error naming it
  grads.dq = (dq = new_array(q.view.dtype, shape_of(q.view))).view;
  grads.dk = (dk = new_array(q.view.dtype, shape_of(k.view))).view;
  grads.dv = (dv = new_array(q.view.dtype, shape_of(v.view))).view;
  if (return_dsinks) grads.dsinks = (dsinks = new_array(q.view.dtype, shape_of(opt.sinks.view))).view;
  // dbias: [..q.., Nq, Nkv], q's leading dimensions (which the mask broadcasts to), as probs.
  if (return_dbias) grads.dbias = (dbias = new_array(q.view.dtype, shapes.probs)).view;
  {
    py::gil_scoped_release unlocked;
    if (reference)
      reference::backward(q.view, k.view, v.view, dout.view, grads, opt.options);
    else
      backward(q.view, k.view, v.view, out.view, lse.view, dout.view, grads, opt.options);
  }
  py::list result;
  result.append(dq.array);
  result.append(dk.array);
  result.append(dv.array);
  if (return_dsinks) result.append(dsinks.array);
  if (return_dbias) result.append(dbias.array);
  return py::tuple(result);
}

py::array self_attention_py(py::handle x_obj, py::handle wq_obj, py::handle wk_obj, py::handle wv_obj,
                            py::handle scale, py::handle causal, py::handle window, py::handle align,
                            py::handle mask, int threads) {
  const ArrayView x = as_view("x", x_obj, ArrayKind::real);
  const ArrayView wq = as_view("w_q", wq_obj, ArrayKind::real);
  const ArrayView wk = as_view("w_k", wk_obj, ArrayKind::real);
  const ArrayView wv = as_view("w_v", wv_obj, ArrayKind::real);
  const MaskedOptions opt = make_options(scale, causal, window, align, mask, threads);
  Tensor y;
  {
    py::gil_scoped_release unlocked;
    y = self_attention(x.view, wq.view, wk.view, wv.view, opt.options);
  }
  return to_numpy(std::move(y));
}

py::array multi_head_attention_py(py::handle x_obj, py::handle wq_obj, py::handle wk_obj,
                                  py::handle wv_obj, py::handle wo_obj, std::int64_t heads,
                                  py::handle scale, py::handle causal, py::handle window,
                                  py::handle align, py::handle mask, int threads) {
  const ArrayView x = as_view("x", x_obj, ArrayKind::real);
  const ArrayView wq = as_view("w_q", wq_obj, ArrayKind::real);
  const ArrayView wk = as_view("w_k", wk_obj, ArrayKind::real);
  const ArrayView wv = as_view("w_v", wv_obj, ArrayKind::real);
  const ArrayView wo = as_view("w_o", wo_obj, ArrayKind::real);
  const MaskedOptions opt = make_options(scale, causal, window, align, mask, threads);
  Tensor y;
  {
    py::gil_scoped_release unlocked;
    y = multi_head_attention(x.view, wq.view, wk.view, wv.view, wo.view, heads, opt.options);
  }
  return to_numpy(std::move(y));
}

// merge_partials(outs, lses) -> (out, lse): attention over disjoint key chunks combined.
py::tuple merge_partials_py(const std::vector<py::object>& outs_obj, const std::vector<py::object>& lses_obj) {
  std::vector<ArrayView> outs, lses;
  std::vector<TensorView> out_views, lse_views;
  for (std::size_t c = 0; c < outs_obj.size(); ++c) {
    outs.push_back(as_view(fmt::format("outs[{}]", c).c_str(), outs_obj[c], ArrayKind::real));
    out_views.push_back(outs.back().view);
  }
  for (std::size_t c = 0; c < lses_obj.size(); ++c) {
    lses.push_back(as_view(fmt::format("lses[{}]", c).c_str(), lses_obj[c], ArrayKind::real));
    lse_views.push_back(lses.back().view);
  }
  ArrayView out, lse;
  if (!outs.empty() && !lses.empty()) {
    out = new_array(outs[0].view.dtype, shape_of(outs[0].view));
    lse = new_array(outs[0].view.dtype, shape_of(lses[0].view));
  }
  {
    py::gil_scoped_release unlocked;
    merge_partials(out_views, lse_views, out.view, lse.view);
  }
  return py::make_tuple(out.array, lse.array);
}

constexpr const char* kMergeDoc = R"(merge_partials(outs, lses)

Combines attention computed over disjoint chunks of the keys into attention over all of them:
lse = log sum_c exp(lse_c), out = sum_c exp(lse_c - lse) * out_c. outs[c] has out's shape
[..., dv], lses[c] lse's [...]; a chunk with lse_c = -inf contributes nothing. Returns (out, lse).

Example:
    >>> import numpy as np, attnscale
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((4, 8)), rng.standard_normal((10, 8)), rng.standard_normal((10, 8))
    >>> parts = [attnscale.attention(q, k[s], v[s], return_lse=True) for s in (slice(0, 6), slice(6, 10))]
    >>> out, lse = attnscale.merge_partials([p[0] for p in parts], [p[1] for p in parts])
    >>> bool(np.allclose(out, attnscale.attention(q, k, v)))
    True
)";

constexpr const char* kOptionsDoc = R"(
    scale:   None (1/sqrt(dk)), 'none' (1), 'sqrt' (1/sqrt(dk)), 'linear' (1/dk) or a finite number.
    causal:  None/False, True (top-left), 'top-left' (key j visible when j <= i) or
             'bottom-right' (when j <= i + Nkv - Nq).
    window:  (left, right): keys diag-left .. diag+right are visible; None on a side: unbounded.
    align:   'top-left' or 'bottom-right': the diagonal of `window` when `causal` is not given.
    mask:    array [Nq, Nkv] or [B|1, H|1, Nq, Nkv]; bool/uint8 (True = keep) or float32/float64
             (added to the scaled scores).
    threads: worker threads; 0: $ATTNSCALE_THREADS, else every core.)";

const char* const kExtrasDoc = R"(    softcap:      0 (off) or c > 0: each scaled score x becomes c * tanh(x / c) (Gemma 2).
    alibi_slopes: None or [Hq] / [B, Hq] float array: -slope * |diag(i) - j| is added to
                  score (i, j), diag(i) the mask's diagonal (align='bottom-right' as
                  FlashAttention).
    sinks:        None or [Hq] float array: one logit per head that joins every row's softmax
                  without a value (gpt-oss); lse includes it.
    dropout_p, dropout_seed, dropout_offset: dropout on the probabilities, kept ones scaled by
                  1 / (1 - p); the mask is a pure function of (seed, offset, b, h, i, j).
    cu_seqlens_q, cu_seqlens_k: None, or integer offsets [S + 1] of packed sequences: q is
                  [Hq, total_q, dk], k and v [Hkv, total_k, d]; sequence s owns rows
                  cu_seqlens_q[s]:cu_seqlens_q[s+1] and keys cu_seqlens_k[s]:cu_seqlens_k[s+1].
)";

const std::string kAttentionDoc = std::string(R"(attention(q, k, v, *, scale=None, causal=None, window=None, align=None, mask=None, return_lse=False, return_probs=False, threads=0, reference=False, compute=None, softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0, dropout_seed=0, dropout_offset=0, cu_seqlens_q=None, cu_seqlens_k=None)

Scaled dot-product attention softmax(q k^T * scale + mask) v on numpy arrays.

    q [..., H, Nq, dk], k [..., Hkv, Nkv, dk], v [..., Hkv, Nkv, dv]: [N, d], [H, N, d],
    [B, H, N, d] or more leading dimensions, which broadcast as in PyTorch; all float32, all
    float64 or all attnscale.bfloat16. k and v may have fewer heads than q (grouped-query
    attention: query head h reads kv head h // (Hq // Hkv)). Inputs are read in place whatever
    their strides (no copy); the GIL is released while computing. Nkv = 0 gives out 0, lse -inf.
    For attention and attention_backward the mask may be any shape that broadcasts to
    [..., H, Nq, Nkv] (a [B, 1, 1, Nkv] padding mask is read with stride 0, not copied).
)") + kOptionsDoc + R"(
    return_lse:   also return the natural-log log-sum-exp of each row, [..., Nq].
    return_probs: also return the attention probabilities, [..., Nq, Nkv].
    reference:    use the naive float64 reference instead of the fast kernel.
    compute:      None or 'native' (products in the inputs' dtype), or 'bf16': float32 inputs
                  rounded to bfloat16 for Q K^T and P V, float32 accumulation (AMX where
                  the CPU has it, AVX-512 BF16 on AMD's cores, else pairs widened to float32;
                  there, from 64 query rows on (16 over short keys), the float32 kernels on
                  the bfloat16 values widened, P not rounded); float64 inputs ignore it.
)" + kExtrasDoc + R"(
Returns out [..., Nq, dv] (q's dtype), or a tuple (out[, lse][, probs]). A row whose keys are
all masked gives out = 0 and lse = -inf. Bad shapes or options raise ValueError, wrong types
TypeError, with a message naming the argument.

Example:
    >>> import numpy as np, attnscale
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((2, 8, 16, 64), dtype=np.float32)   # [B, Hq, N, d]
    >>> kv = rng.standard_normal((2, 2, 16, 64), dtype=np.float32)  # 2 kv heads (GQA)
    >>> out, lse = attnscale.attention(q, kv, kv, causal=True, return_lse=True)
    >>> out.shape, lse.shape
    ((2, 8, 16, 64), (2, 8, 16))
)";

const std::string kBackwardDoc = std::string(R"(attention_backward(q, k, v, out, lse, dout, *, scale=None, causal=None, window=None, align=None, mask=None, threads=0, reference=False, softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0, dropout_seed=0, dropout_offset=0, cu_seqlens_q=None, cu_seqlens_k=None, return_dsinks=False, return_dbias=False, compute=None, dlse=None)

Gradients (dq, dk, dv) of attention, given the forward's out and lse and dout = dLoss/dout
(and dlse = dLoss/dlse when the loss reads lse too).

    out and lse come from attention(q, k, v, ..., return_lse=True) with the same options;
    dq, dk, dv have the shapes of q, k and v (for GQA, dk and dv sum over the query heads that
    share a kv head). With reference=True the float64 reference recomputes the forward and
    out/lse may be None. The options below must be those of the forward (the dropout mask is
    regenerated from its seed and offset).
)") + kOptionsDoc + "\n" + kExtrasDoc + R"(
    dlse:          None, or dLoss/dlse of lse's shape (a loss that reads lse as well as out,
                   e.g. one that merges partial results by their lse): it adds dlse_i * P_ij
                   to each score's gradient (d lse_i / d s_ij = P_ij). None: no gradient
                   through lse.
    return_dsinks: also return dsinks [Hq], the gradient w.r.t. sinks.
    return_dbias:  also return dbias [..q.., Nq, Nkv], the gradient w.r.t. a float mask (sum it
                   over the dimensions the mask broadcasts).
    compute:       None or 'native', or 'bf16': the five tile products with bfloat16 operands and
                   float32 accumulation (AMX, AVX-512 BF16 on AMD's cores, else widened: there,
                   from 16 query rows on, the float32 kernels on float32 copies of the bfloat16
                   values, P and dS not rounded), within about
                   1e-2 of the float64 gradients; bfloat16 inputs always use it (except with
                   return_dbias or non-finite inputs, which take the float32 path); float64
                   inputs ignore it.
Returns (dq, dk, dv[, dsinks][, dbias]).

Example:
    >>> import numpy as np, attnscale
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((4, 10, 32)) for _ in range(3))
    >>> out, lse = attnscale.attention(q, k, v, causal=True, return_lse=True)
    >>> dq, dk, dv = attnscale.attention_backward(q, k, v, out, lse, np.ones_like(out), causal=True)
    >>> dq.shape == q.shape and dk.shape == k.shape
    True
)";

const std::string kSelfDoc = std::string(R"(self_attention(x, w_q, w_k, w_v, *, scale=None, causal=None, window=None, align=None, mask=None, threads=0)

softmax(x w_q (x w_k)^T * scale + mask) x w_v for x [N, dx], w_q and w_k [dx, dk], w_v [dx, dv]
(all float32 or all float64); returns [N, dv].
)") + kOptionsDoc + R"(

Example:
    >>> import numpy as np, attnscale
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((5, 8)); w = rng.standard_normal((8, 4))
    >>> attnscale.self_attention(x, w, w, w).shape
    (5, 4)
)";

const std::string kMultiHeadDoc = std::string(R"(multi_head_attention(x, w_q, w_k, w_v, w_o, heads, *, scale=None, causal=None, window=None, align=None, mask=None, threads=0)

Multi-head self-attention: x [N, dx], w_q and w_k [dx, heads*dk], w_v [dx, heads*dv],
w_o [heads*dv, d_out]. Head h uses columns h*dk .. (h+1)*dk of x w_q and x w_k; the heads'
outputs are concatenated and multiplied by w_o. Returns [N, d_out].
)") + kOptionsDoc + R"(

Example:
    >>> import numpy as np, attnscale
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((6, 16))
    >>> w = [rng.standard_normal((16, 16)) for _ in range(4)]
    >>> attnscale.multi_head_attention(x, *w, heads=4).shape
    (6, 16)
)";

}  // namespace

void add_attention(py::module_& m) {
  const auto none = py::none();
  m.def("attention", &attention, kAttentionDoc.c_str(), py::arg("q"), py::arg("k"), py::arg("v"),
        py::kw_only(), py::arg("scale") = none, py::arg("causal") = none, py::arg("window") = none,
        py::arg("align") = none, py::arg("mask") = none, py::arg("return_lse") = false,
        py::arg("return_probs") = false, py::arg("threads") = 0, py::arg("reference") = false,
        py::arg("compute") = none, py::arg("softcap") = 0.0, py::arg("alibi_slopes") = none, py::arg("sinks") = none,
        py::arg("dropout_p") = 0.0, py::arg("dropout_seed") = 0, py::arg("dropout_offset") = 0,
        py::arg("cu_seqlens_q") = none, py::arg("cu_seqlens_k") = none);
  m.def("merge_partials", &merge_partials_py, kMergeDoc, py::arg("outs"), py::arg("lses"));
  m.def("attention_backward", &attention_backward, kBackwardDoc.c_str(), py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("dout"), py::kw_only(),
        py::arg("scale") = none, py::arg("causal") = none, py::arg("window") = none,
        py::arg("align") = none, py::arg("mask") = none, py::arg("threads") = 0,
        py::arg("reference") = false, py::arg("softcap") = 0.0, py::arg("alibi_slopes") = none,
        py::arg("sinks") = none, py::arg("dropout_p") = 0.0, py::arg("dropout_seed") = 0,
        py::arg("dropout_offset") = 0, py::arg("cu_seqlens_q") = none, py::arg("cu_seqlens_k") = none,
        py::arg("return_dsinks") = false, py::arg("return_dbias") = false, py::arg("compute") = none,
        py::arg("dlse") = none);
  m.def("self_attention", &self_attention_py, kSelfDoc.c_str(), py::arg("x"), py::arg("w_q"),
        py::arg("w_k"), py::arg("w_v"), py::kw_only(), py::arg("scale") = none, py::arg("causal") = none,
        py::arg("window") = none, py::arg("align") = none, py::arg("mask") = none, py::arg("threads") = 0);
  m.def("multi_head_attention", &multi_head_attention_py, kMultiHeadDoc.c_str(), py::arg("x"),
        py::arg("w_q"), py::arg("w_k"), py::arg("w_v"), py::arg("w_o"), py::arg("heads"), py::kw_only(),
        py::arg("scale") = none, py::arg("causal") = none, py::arg("window") = none,
        py::arg("align") = none, py::arg("mask") = none, py::arg("threads") = 0);
}

}  // namespace attnscale::python
