// Params: the plain struct that crosses from validation (public API) into the kernels.
//
// Every view here is normalised to full rank (q/k/v/out/probs/mask rank 4, lse rank 3); a
// broadcast or missing leading dimension has size 1 and stride 0. Kernels trust these fields:
// all checks happen once, in validate.cc.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "attnscale/attention.h"
#include "attnscale/tensor.h"
#include "common/elements.h"

namespace attnscale::detail {

struct Params {
  DType dtype = DType::f32;  // of q, k, v (and out)
  std::int64_t B = 0, Hq = 0, Hkv = 0, Nq = 0, Nkv = 0, dk = 0, dv = 0;
  double scale = 1.0;
  TensorView q, k, v;
  TensorView out, lse, probs;  // lse/probs may be empty
  // Mask.
  bool causal = false;
  Align align = Align::top_left;
  std::int64_t window_left = -1, window_right = -1;
  TensorView mask;  // empty, or rank 4 with stride 0 on broadcast dimensions
  int threads = 1;
  // Score transforms and extras (Options; score_transforms.h applies them).
  double softcap = 0.0;   // 0: off
  TensorView alibi;       // empty, or rank 2 [B, Hq] (stride 0 over B when given as [Hq])
  TensorView sinks;       // empty, or rank 1 [Hq]
  double dropout_p = 0.0;  // 0: off
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  std::int64_t batch_base = 0;  // packed sequences: the sequence index of batch entry 0

  bool transforms_scores() const { return softcap > 0.0 || !alibi.empty(); }
  // Whether the explicit mask only keeps or hides pairs (none, or bool), adding nothing to a score.
  bool mask_only_hides() const { return mask.empty() || mask.dtype == DType::u8; }
  // Whether a score's float32 multiply by the scale may wait until e^x reads it, after the mask:
  // no score transforms, a mask that adds nothing, and a positive scale other than 1 (a hidden
  // pair's -inf times it stays -inf). The bf16 forward and backward then have their score products
  // store tiles in place, not through a scaling pass (bf16_forward.cc): the same t = x·s.
  bool scale_when_exp_reads() const {
    const float s = static_cast<float>(scale);
    return s > 0.0f && s != 1.0f && !transforms_scores() && mask_only_hides();
  }
  bool has_dropout() const { return dropout_p > 0.0; }

  std::int64_t group() const { return Hq / Hkv; }
  std::int64_t kv_head(std::int64_t h) const { return h / group(); }
  // diag(i) = i + diag_offset(): the key on query i's diagonal.
  std::int64_t diag_offset() const { return align == Align::bottom_right ? Nkv - Nq : 0; }
};

struct BackwardParams : Params {
  bool lse_covers_keys = true;  // Options::lse_covers_keys
  TensorView dO;          // gradient of the loss w.r.t. out, [B, Hq, Nq, dv]
  TensorView dLse;        // empty, or the gradient w.r.t. lse, rank 3 [B, Hq, Nq] (Options::dlse)
  TensorView dQ, dK, dV;  // outputs, shapes of q, k, v
  TensorView dSinks;      // empty, or rank 1 [Hq]
  TensorView dBias;       // empty, or rank 4 [B, Hq, Nq, Nkv]
};

// Keys [lo, hi) allowed for query i by the causal and window parts of the mask (the explicit
// mask may hide more inside it). Empty when lo >= hi.
struct KeyRange {
  std::int64_t lo, hi;
};
inline KeyRange key_range(const Params& p, std::int64_t i) {
  const std::int64_t diag = i + p.diag_offset();
  std::int64_t lo = 0, hi = p.Nkv;
  if (p.causal) hi = std::min(hi, diag + 1);
  if (p.window_left >= 0) lo = std::max(lo, diag - p.window_left);
  if (p.window_right >= 0) hi = std::min(hi, diag + 1 + p.window_right);
  lo = std::clamp<std::int64_t>(lo, 0, p.Nkv);
  hi = std::clamp<std::int64_t>(hi, lo, p.Nkv);
  return {lo, hi};
}

// Element access, one family for every kernel: at<T>() is the typed pointer of element
// (a, b, c, d) of a rank-4 view; value<T>() reads any float dtype converted to T and put()
// writes one (float32, the common case, without the dtype switch); load()/store() convert
// through double at a byte pointer from element().
template <class T>
inline T* at(const TensorView& t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d = 0) {
  return static_cast<T*>(t.data) + a * t.strides[0] + b * t.strides[1] + c * t.strides[2] +
         d * t.strides[3];
}
inline void* element(const TensorView& t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  return static_cast<char*>(t.data) +
         (a * t.strides[0] + b * t.strides[1] + c * t.strides[2] + d * t.strides[3]) *
             static_cast<std::int64_t>(dtype_size(t.dtype));
}
inline double load(const TensorView& t, const void* ptr) { return load_element(t.dtype, ptr); }
inline void store(const TensorView& t, void* ptr, double x) { store_element(t.dtype, ptr, x); }
template <class T>
inline T value(const TensorView& t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  if (t.dtype == DType::f32) return static_cast<T>(*at<const float>(t, a, b, c, d));
  return static_cast<T>(load(t, element(t, a, b, c, d)));
}
template <class T>
inline void put(const TensorView& t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d, T x) {
  if (t.dtype == DType::f32) *at<float>(t, a, b, c, d) = static_cast<float>(x);
  else store(t, element(t, a, b, c, d), static_cast<double>(x));
}

// The explicit mask's contribution to score (b, h, i, j): 0 to keep, -inf to hide, or the
// additive value. Returns 0 when there is no explicit mask.
inline double mask_bias(const Params& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  if (p.mask.empty()) return 0.0;
  switch (p.mask.dtype) {
    case DType::u8: return *at<const std::uint8_t>(p.mask, b, h, i, j) ? 0.0 : -INFINITY;
    case DType::f32: return *at<const float>(p.mask, b, h, i, j);
    case DType::f64: return *at<const double>(p.mask, b, h, i, j);
    default: return 0.0;
  }
}

// Element i of a rank-1 view.
inline void* element1(const TensorView& t, std::int64_t i) {
  return static_cast<char*>(t.data) + i * t.strides[0] * static_cast<std::int64_t>(dtype_size(t.dtype));
}

enum class Kernel { fast, reference };

// Options::alibi_slopes / sinks: shape [n], or [rows, n] when rows > 0; float32/float64, finite.
// Throws Error naming `name`.
TensorView check_per_head(const char* name, const TensorView& t, std::int64_t n, std::int64_t rows);

// The outputs a call writes (null views skipped): each writes every result to a place of its own
// (no dimension of size > 1 with stride 0) and shares no memory with another. Throws Error naming
// them.
struct Written {
  const char* name;
  const TensorView* t;
};
void require_disjoint(std::initializer_list<Written> outputs);

// Validation at the public boundary. Throws Error naming the argument and shapes.
Params make_forward_params(const TensorView& q, const TensorView& k, const TensorView& v,
                           const Outputs& outputs, const Options& options, Kernel kernel);
BackwardParams make_backward_params(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const TensorView& lse,
                                    const TensorView& dout, const Gradients& grads,
                                    const Options& options, Kernel kernel);

// The dQ partials the one-pass backward may allocate (backward.cc) before it falls back to two
// passes; returns the previous budget. For tests, which reach both paths on small shapes.
std::int64_t set_backward_partial_budget(std::int64_t bytes);

}  // namespace attnscale::detail
