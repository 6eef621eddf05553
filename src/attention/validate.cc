// Validation of every public argument, and its translation into Params.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "attention/params.h"
#include "attnscale/error.h"
#include "common/number_text.h"
#include "common/parallel.h"

namespace attnscale::detail {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw Error(msg); }

std::string dims(const std::int64_t* a, int n) {  // "[a, b, c]", as TensorView::shape_str writes a shape
  TensorView v;
  v.rank = n;
  std::copy_n(a, n, v.shape.begin());
  return v.shape_str();
}
std::string dims(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  const std::int64_t x[4] = {a, b, c, d};
  return dims(x, 4);
}

// Left-pads `t` to `rank` with size-1, stride-0 dimensions.
TensorView pad_rank(TensorView t, int rank) {
  const int missing = rank - t.rank;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.shape[d + missing] = t.shape[d];
    t.strides[d + missing] = t.strides[d];
  }
  for (int d = 0; d < missing; ++d) {
    t.shape[d] = 1;
    t.strides[d] = 0;
  }
  t.rank = rank;
  return t;
}

// The rank rule of q, k, v and dout (also behind output_shapes()).
void require_operand_rank(std::string_view name, const TensorView& t) {
  if (t.rank < 2 || t.rank > 4)
    fail(std::string(name) + ": expected rank 2, 3 or 4 ([N, d], [H, N, d] or [B, H, N, d]), got rank " +
         std::to_string(t.rank) + " " + t.shape_str());
}

// The dtypes forward and backward compute in and write (float16 and the integer types are for KV
// caches and masks only).
bool computable(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16; }

// q, k, v, dout: rank 2..4, positive dimensions, a float dtype.
TensorView operand(const char* name, const TensorView& t) {
  if (t.data == nullptr) fail(std::string(name) + ": missing (null data pointer)");
  require_operand_rank(name, t);
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] <= 0)
      fail(std::string(name) + ": every dimension must be positive, got shape " + t.shape_str());
  if (!computable(t.dtype))
    fail(std::string(name) + ": dtype must be float32, float64 or bfloat16, got " +
         std::string(dtype_name(t.dtype)));
  return pad_rank(t, 4);
}

// An output view of shape `want` (after left-padding), with an allowed dtype. The shapes are
// formatted for a message only (this runs on every call).
TensorView output(const char* name, const TensorView& t, int rank, const std::int64_t* want, bool any_float,
                  DType must) {
  if (t.data == nullptr) fail(std::string(name) + ": missing (null data pointer)");
  if (t.rank < 1 || t.rank > rank)
    fail(std::string(name) + ": expected shape " + dims(want, rank) + ", got rank " + std::to_string(t.rank) + " " +
         t.shape_str());
  TensorView p = pad_rank(t, rank);
  for (int d = 0; d < rank; ++d)
    if (p.shape[d] != want[d]) {
      // The expected shape at the caller's rank where the dimensions it leaves out are 1 (a [5, 3]
      // dout for [N, d] operands is told [5, 4], not [1, 1, 5, 4]).
      const bool ones = std::all_of(want, want + rank - t.rank, [](std::int64_t x) { return x == 1; });
      const int skip = ones ? rank - t.rank : 0;
      fail(std::string(name) + ": expected shape " + dims(want + skip, rank - skip) + ", got " + t.shape_str());
    }
  if (any_float ? !computable(t.dtype) : t.dtype != must)
    fail(std::string(name) + ": dtype must be " +
         (any_float ? std::string("float32, float64 or bfloat16") : std::string(dtype_name(must))) + ", got " +
         std::string(dtype_name(t.dtype)));
  return p;
}

}  // namespace

// The outputs a call writes, each by the name a message gives it: none may write two results to one
// place (a dimension of size > 1 and stride 0) nor share memory with another. Two views whose
// elements fill their byte ranges (no gaps) overlap exactly when the ranges meet; views with gaps
// (dq, dk and dv interleaved in one packed buffer) are compared by their first element only.
void require_disjoint(std::initializer_list<Written> outputs) {
  struct Range {
    std::uintptr_t lo, hi;  // [lo, hi)
    bool dense;
  };
  const auto range = [](const TensorView& t) {
    const std::int64_t size = static_cast<std::int64_t>(dtype_size(t.dtype));
    std::int64_t lo = 0, hi = 0, n = 1;
    for (int d = 0; d < t.rank; ++d) {
      const std::int64_t reach = t.strides[d] * (t.shape[d] - 1);
      (reach < 0 ? lo : hi) += reach;
      n *= t.shape[d];
    }
    const auto base = reinterpret_cast<std::uintptr_t>(t.data);
    return Range{base + static_cast<std::uintptr_t>(lo * size), base + static_cast<std::uintptr_t>((hi + 1) * size),
                 (hi - lo + 1) == n};
  };
  for (const Written& w : outputs) {
    if (w.t->data == nullptr) continue;
    for (int d = 0; d < w.t->rank; ++d)
      if (w.t->strides[d] == 0 && w.t->shape[d] > 1)
        fail(std::string(w.name) + ": dimension " + std::to_string(d) +
             " has stride 0, so several results would be written to one place (shape " + w.t->shape_str() + ")");
  }
  for (auto a = outputs.begin(); a != outputs.end(); ++a)
    for (auto b = a + 1; b != outputs.end(); ++b) {
      if (a->t->data == nullptr || b->t->data == nullptr) continue;
      const Range ra = range(*a->t), rb = range(*b->t);
      const bool overlap = a->t->data == b->t->data || (ra.dense && rb.dense && ra.lo < rb.hi && rb.lo < ra.hi);
      if (overlap) fail(std::string(a->name) + ", " + b->name + ": outputs share memory (each needs its own)");
    }
}

namespace {

void fill_shapes(Params& p, const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& q0, const TensorView& k0, const TensorView& v0) {
  p.B = q.shape[0];
  p.Hq = q.shape[1];
  p.Nq = q.shape[2];
  p.dk = q.shape[3];
  p.Hkv = k.shape[1];
  p.Nkv = k.shape[2];
  p.dv = v.shape[3];
  // The shapes as the messages name them, formatted only for a message (an ostringstream each: a
  // few hundred nanoseconds a call otherwise).
  const auto qs = [&] { return "q " + q0.shape_str(); };
  const auto ks = [&] { return "k " + k0.shape_str(); };
  const auto vs = [&] { return "v " + v0.shape_str(); };
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    fail("q, k, v: dtypes differ (q " + std::string(dtype_name(q.dtype)) + ", k " +
         std::string(dtype_name(k.dtype)) + ", v " + std::string(dtype_name(v.dtype)) + ")");
  if (k.shape[0] != p.B || v.shape[0] != p.B)
    fail("k, v: batch must match q's (" + qs() + ", " + ks() + ", " + vs() + ")");
  if (k.shape[3] != p.dk)
    fail("k: last dimension dk = " + std::to_string(k.shape[3]) + " must equal q's dk = " +
         std::to_string(p.dk) + " (" + qs() + ", " + ks() + ")");
  if (v.shape[1] != p.Hkv || v.shape[2] != p.Nkv)
    fail("v: heads and keys must match k's (" + ks() + ", " + vs() + ")");
  if (p.Hq % p.Hkv != 0)
    fail("k: query heads Hq = " + std::to_string(p.Hq) + " must be a multiple of key/value heads Hkv = " +
         std::to_string(p.Hkv) + " (" + qs() + ", " + ks() + ")");
}

// A float vector argument of shape [n] (stride kept), or [rows, n] when rows > 0 is allowed,
// with finite values.
}  // namespace

TensorView check_per_head(const char* name, const TensorView& t, std::int64_t n, std::int64_t rows) {
  const auto want = [&] {  // for a message only
    return rows > 0 ? std::string("[") + std::to_string(n) + "] or [" + std::to_string(rows) + ", " +
                          std::to_string(n) + "]"
                    : std::string("[") + std::to_string(n) + "]";
  };
  if (t.dtype != DType::f32 && t.dtype != DType::f64)
    fail(std::string(name) + ": dtype must be float32 or float64, got " + std::string(dtype_name(t.dtype)));
  const bool ok = (t.rank == 1 && t.shape[0] == n) || (rows > 0 && t.rank == 2 && t.shape[0] == rows && t.shape[1] == n);
  if (!ok) fail(std::string(name) + ": expected shape " + want() + ", got " + t.shape_str());
  for (std::int64_t e = 0; e < t.numel(); ++e) {
    const std::int64_t r = t.rank == 2 ? e / n : 0, c = e % n;
    const char* at = static_cast<const char*>(t.data) +
                     (r * (t.rank == 2 ? t.strides[0] : 0) + c * t.strides[t.rank - 1]) *
                         static_cast<std::int64_t>(dtype_size(t.dtype));
    if (!std::isfinite(load(t, at)))
      fail(std::string(name) + ": values must be finite, got " + number_text(load(t, at)) + " at index " +
           std::to_string(e));
  }
  return t;
}

namespace {

void fill_transforms(Params& p, const Options& options) {
  if (!(options.softcap >= 0.0) || !std::isfinite(options.softcap))
    fail("softcap: must be a finite number >= 0 (0: off), got " + number_text(options.softcap));
  p.softcap = options.softcap;
  if (options.alibi_slopes.data) {
    TensorView a = check_per_head("alibi_slopes", options.alibi_slopes, p.Hq, p.B);
    if (a.rank == 1) a = pad_rank(a, 2);  // [Hq] → [1 (stride 0), Hq]
    a.shape[0] = p.B;
    p.alibi = a;
  }
  if (options.sinks.data) p.sinks = check_per_head("sinks", options.sinks, p.Hq, 0);
  const Dropout& d = options.dropout;
  if (!(d.p >= 0.0 && d.p < 1.0)) fail("dropout: p must be in [0, 1), got " + number_text(d.p));
  p.dropout_p = d.p;
  p.dropout_seed = d.seed;
  p.dropout_offset = d.offset;
}

void fill_options(Params& p, const Options& options) {
  p.scale = options.scale.resolve(p.dk);
  if (!std::isfinite(p.scale)) fail("scale: must be finite, got " + number_text(p.scale));
  const Mask& m = options.mask;
  p.causal = m.causal;
  p.align = m.align;
  if (m.window_left < -1 || m.window_right < -1)
    fail("window: sizes must be >= 0 (or -1 for unbounded), got (" + std::to_string(m.window_left) +
         ", " + std::to_string(m.window_right) + ")");
  p.window_left = m.window_left;
  p.window_right = m.window_right;
  if (options.threads < 0) fail("threads: must be >= 0, got " + std::to_string(options.threads));
  p.threads = resolve_threads(options.threads);
  fill_transforms(p, options);
  const TensorView& mk = m.explicit_mask;
  if (mk.data == nullptr) return;
  const auto want = [&] {  // for a message only
    return std::string("[") + std::to_string(p.Nq) + ", " + std::to_string(p.Nkv) + "] or [" +
           std::to_string(p.B) + "|1, " + std::to_string(p.Hq) + "|1, " + std::to_string(p.Nq) + ", " +
           std::to_string(p.Nkv) + "]";
  };
  if (mk.rank < 2 || mk.rank > 4)
    fail("mask: expected shape " + want() + ", got rank " + std::to_string(mk.rank) + " " + mk.shape_str());
  if (mk.dtype != DType::u8 && mk.dtype != DType::f32 && mk.dtype != DType::f64)
    fail("mask: dtype must be bool/uint8, float32 or float64, got " + std::string(dtype_name(mk.dtype)));
  TensorView t = pad_rank(mk, 4);
  const std::int64_t full[4] = {p.B, p.Hq, p.Nq, p.Nkv};
  for (int d = 0; d < 4; ++d) {
    const bool broadcast = d < 2 && t.shape[d] == 1;
    if (!broadcast && t.shape[d] != full[d])
      fail("mask: shape " + mk.shape_str() + " does not broadcast to " + dims(p.B, p.Hq, p.Nq, p.Nkv) +
           " (expected " + want() + ")");
    if (broadcast) t.strides[d] = 0;
  }
  t.shape = {p.B, p.Hq, p.Nq, p.Nkv};
  p.mask = t;
}

// The checks and fields shared by forward and backward: q, k, v and the options.
void fill_inputs(Params& p, const TensorView& q0, const TensorView& k0, const TensorView& v0,
                 const Options& options) {
  const TensorView q = operand("q", q0), k = operand("k", k0), v = operand("v", v0);
  fill_shapes(p, q, k, v, q0, k0, v0);
  p.dtype = q.dtype;
  p.q = q;
  p.k = k;
  p.v = v;
  fill_options(p, options);
}

}  // namespace

Params make_forward_params(const TensorView& q0, const TensorView& k0, const TensorView& v0,
                           const Outputs& outputs, const Options& options, Kernel kernel) {
  if (options.dlse.data) fail("dlse: the gradient w.r.t. lse is an input of backward(), not of forward()");
  Params p;
  fill_inputs(p, q0, k0, v0, options);
  const std::int64_t out_shape[4] = {p.B, p.Hq, p.Nq, p.dv};
  p.out = output("out", outputs.out, 4, out_shape, kernel == Kernel::reference, p.dtype);
  if (outputs.lse.data) {
    const std::int64_t s[3] = {p.B, p.Hq, p.Nq};
    p.lse = output("lse", outputs.lse, 3, s, true, p.dtype);
  }
  if (outputs.probs.data) {
    const std::int64_t s[4] = {p.B, p.Hq, p.Nq, p.Nkv};
    p.probs = output("probs", outputs.probs, 4, s, true, p.dtype);
  }
  require_disjoint({{"out", &outputs.out}, {"lse", &outputs.lse}, {"probs", &outputs.probs}});
  return p;
}

BackwardParams make_backward_params(const TensorView& q0, const TensorView& k0, const TensorView& v0,
                                    const TensorView& out, const TensorView& lse,
                                    const TensorView& dout, const Gradients& grads,
                                    const Options& options, Kernel kernel) {
  BackwardParams p;
  fill_inputs(p, q0, k0, v0, options);
  p.lse_covers_keys = options.lse_covers_keys;
  const bool any = kernel == Kernel::reference;
  const std::int64_t o_shape[4] = {p.B, p.Hq, p.Nq, p.dv};
  p.dO = output("dout", dout, 4, o_shape, any, p.dtype);
  if (kernel == Kernel::fast) {
    p.out = output("out", out, 4, o_shape, false, p.dtype);
    const std::int64_t s[3] = {p.B, p.Hq, p.Nq};
    p.lse = output("lse", lse, 3, s, true, p.dtype);
  }
  if (options.dlse.data) {
    const std::int64_t s[3] = {p.B, p.Hq, p.Nq};
    p.dLse = output("dlse", options.dlse, 3, s, true, p.dtype);
  }
  const std::int64_t q_shape[4] = {p.B, p.Hq, p.Nq, p.dk};
  const std::int64_t k_shape[4] = {p.B, p.Hkv, p.Nkv, p.dk};
  const std::int64_t v_shape[4] = {p.B, p.Hkv, p.Nkv, p.dv};
  p.dQ = output("dq", grads.dq, 4, q_shape, any, p.dtype);
  p.dK = output("dk", grads.dk, 4, k_shape, any, p.dtype);
  p.dV = output("dv", grads.dv, 4, v_shape, any, p.dtype);
  if (grads.dsinks.data) {
    if (p.sinks.empty()) fail("dsinks: given without sinks");
    const std::int64_t s[1] = {p.Hq};
    p.dSinks = output("dsinks", grads.dsinks, 1, s, true, p.dtype);
  }
  if (grads.dbias.data) {
    if (p.mask.empty() || p.mask.dtype == DType::u8) fail("dbias: given without an additive float mask");
    const std::int64_t s[4] = {p.B, p.Hq, p.Nq, p.Nkv};
    p.dBias = output("dbias", grads.dbias, 4, s, true, p.dtype);
  }
  require_disjoint({{"dq", &grads.dq}, {"dk", &grads.dk}, {"dv", &grads.dv}, {"dsinks", &grads.dsinks},
                    {"dbias", &grads.dbias}});
  return p;
}

}  // namespace attnscale::detail

namespace attnscale {

OutputShapes output_shapes(const TensorView& q, const TensorView& k, const TensorView& v,
                           const std::array<std::string_view, 3>& names) {
  detail::require_operand_rank(names[0], q);
  detail::require_operand_rank(names[1], k);
  detail::require_operand_rank(names[2], v);
  OutputShapes s;
  s.lse.assign(q.shape.begin(), q.shape.begin() + q.rank - 1);
  s.out = s.probs = s.lse;
  s.out.push_back(v.shape[v.rank - 1]);
  s.probs.push_back(k.shape[k.rank - 2]);
  return s;
}

}  // namespace attnscale
