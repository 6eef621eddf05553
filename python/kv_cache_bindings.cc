// attnscale.decode and attnscale.quantize_q8 (include/attnscale/kv_cache.h), zero-copy over numpy.
#include "kv_cache_bindings.h"

#include <pybind11/numpy.h>

#include <string>
#include <vector>

#include "array_view.h"
#include "attnscale/kv_cache.h"
#include "options.h"

namespace attnscale::python {
namespace {

namespace py = pybind11;

ArrayView optional(const char* name, py::handle obj, ArrayKind kind) {
  return obj.is_none() ? ArrayView{} : as_view(name, obj, kind);
}

py::object decode_py(py::handle q_obj, py::handle k_obj, py::handle v_obj, py::handle k_scales, py::handle v_scales,
                     py::handle block_table, py::handle seq_lens, py::handle seq_starts, py::handle scale, std::int64_t window_left,
                     bool causal, std::int64_t window_right, double softcap, py::handle alibi_slopes, int threads, bool return_lse,
                     py::handle compute) {
  const ArrayView q = as_view("q", q_obj, ArrayKind::single);
  const ArrayView k = as_view("k", k_obj, ArrayKind::cache), v = as_view("v", v_obj, ArrayKind::cache);
  const ArrayView ks = optional("k_scales", k_scales, ArrayKind::single),
                  vs = optional("v_scales", v_scales, ArrayKind::single),
                  table = optional("block_table", block_table, ArrayKind::index),
                  lens = optional("seq_lens", seq_lens, ArrayKind::index),
                  starts = optional("seq_starts", seq_starts, ArrayKind::index),
                  slopes = optional("alibi_slopes", alibi_slopes, ArrayKind::real);
  DecodeOptions o;
  o.scale = make_options(scale, py::none(), py::none(), py::none(), py::none(), threads).options.scale;
  o.window_left = window_left;
  o.causal = causal;
  o.window_right = window_right;
  o.softcap = softcap;
  o.alibi_slopes = slopes.view;
  o.threads = threads;
  o.compute = parse_compute(compute);
  const KVCache cache{k.view, v.view, ks.view, vs.view, table.view, lens.view, starts.view};
  ArrayView out, lse;
  if (q.view.rank == 3 && v.view.rank == 4) {  // otherwise the library names the argument
    out = new_array(DType::f32, {q.view.shape[0], q.view.shape[1], v.view.shape[3]});
    if (return_lse) lse = new_array(DType::f32, {q.view.shape[0], q.view.shape[1]});
  } else if (q.view.rank == 4 && v.view.rank == 4) {  // several new tokens a sequence
    out = new_array(DType::f32, {q.view.shape[0], q.view.shape[1], q.view.shape[2], v.view.shape[3]});
    if (return_lse) lse = new_array(DType::f32, {q.view.shape[0], q.view.shape[1], q.view.shape[2]});
  }
  {
    py::gil_scoped_release unlocked;
    decode(q.view, cache, out.view, lse.view, o);
  }
  if (!return_lse) return out.array;
  return py::make_tuple(out.array, lse.array);
}

py::tuple quantize_q8_py(py::handle x_obj) {
  const ArrayView x = as_view("x", x_obj, ArrayKind::single);
  std::vector<std::int64_t> shape(x.view.shape.begin(), x.view.shape.begin() + x.view.rank);
  ArrayView q = new_array(DType::i8, shape);
  if (!shape.empty()) shape.back() /= 32;
  ArrayView s = new_array(DType::f32, shape);
  {
    py::gil_scoped_release unlocked;
    quantize_q8(x.view, q.view, s.view);
  }
  return py::make_tuple(q.array, s.array);
}

constexpr const char* kDecodeDoc = R"(decode(q, k, v, *, k_scales=None, v_scales=None, block_table=None, seq_lens=None, seq_starts=None, scale=None, window_left=-1, causal=True, window_right=-1, softcap=0.0, alibi_slopes=None, threads=0, return_lse=False, compute=None)

Attention of the new tokens of each sequence over a KV cache, read as stored (no conversion pass):
q [B, Hq, dk] float32 (one token, at the sequence's last key) or [B, Hq, Nq, dk] (Nq tokens, the
sequence's last Nq keys, token i seeing keys up to its own when causal, else all; the cache read
once for all rows); k, v float32, attnscale.bfloat16, float16 or int8 (then k_scales, v_scales:
float32, one per 32 values, from quantize_q8). Contiguous: k [B, Hkv, Nkv, dk], seq_lens [B] int32
optional. Paged (vLLM / FlashAttention layout): k [num_blocks, block_size, Hkv, dk],
block_table [B, max_blocks] int32, seq_lens [B] int32. seq_starts [B] int32, optional: sequence b's
keys are [seq_starts[b], seq_lens[b]) (a batch padded on the left; FlashAttention's cache_leftpad).
GQA when Hq % Hkv == 0. softcap c > 0 and alibi_slopes ([Hq] or [B, Hq]) transform token i's score
of key j to c·tanh(s·q·k_j / c) − slope·|p_i − j|, p_i = len − Nq + i its own key (FlashAttention's).
window_left: a token sees only the window_left + 1 keys up to its own; window_right (causal=False):
at most window_right keys after its own. Returns out [B, Hq, dv] or [B, Hq, Nq, dv] float32
(and lse [B, Hq] or [B, Hq, Nq] with return_lse=True). Paged and contiguous caches holding the
same values give the same bits. compute='bf16' over a bfloat16 cache lets GQA groups (2 or more
query heads a KV head, dk % 8 == 0, dv % 32 == 0) round q and the probabilities to bfloat16 for
the products, summed in float32, on CPUs with AMX, or AVX-512 BF16 on AMD's cores (errors within
about 1e-2 of float64's);
None or 'native': float32 products.

Example:
    >>> import numpy as np, attnscale
    >>> k = np.random.rand(1, 2, 100, 64).astype(np.float32); v = k.copy()
    >>> kq, ks = attnscale.quantize_q8(k); vq, vs = attnscale.quantize_q8(v)
    >>> q = np.random.rand(1, 4, 64).astype(np.float32)
    >>> attnscale.decode(q, kq, vq, k_scales=ks, v_scales=vs).shape
    (1, 4, 64)
)";

constexpr const char* kQuantizeDoc = R"(quantize_q8(x) -> (q, scales)

int8 blocks of 32 values with one float32 scale each (as ggml's q8_0): for every block of x's last
dimension (a multiple of 32), scale = max|x| / 127 and q = round(x / scale). x float32 [..., d];
returns q int8 [..., d] and scales float32 [..., d/32].
)";

}  // namespace

void add_kv_cache(py::module_& m) {
  const py::object none = py::none();
  m.def("decode", &decode_py, kDecodeDoc, py::arg("q"), py::arg("k"), py::arg("v"), py::kw_only(),
        py::arg("k_scales") = none, py::arg("v_scales") = none, py::arg("block_table") = none,
        py::arg("seq_lens") = none, py::arg("seq_starts") = none, py::arg("scale") = none, py::arg("window_left") = -1, py::arg("causal") = true,
        py::arg("window_right") = -1, py::arg("softcap") = 0.0,
        py::arg("alibi_slopes") = none, py::arg("threads") = 0,
        py::arg("return_lse") = false, py::arg("compute") = none);
  m.def("quantize_q8", &quantize_q8_py, kQuantizeDoc, py::arg("x"));
}

}  // namespace attnscale::python
