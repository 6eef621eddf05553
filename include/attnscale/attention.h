// attnscale/attention.h: scaled dot-product attention, softmax(Q Kᵀ · s + mask) V.
//
// Shapes (strides are free, see tensor.h; rank-2 [N, d] and rank-3 [H, N, d] views are read as
// [1, 1, N, d] and [1, H, N, d]):
//   q [B, Hq, Nq, dk]   k [B, Hkv, Nkv, dk]   v [B, Hkv, Nkv, dv]
//   out [B, Hq, Nq, dv] lse [B, Hq, Nq] (natural log)   probs [B, Hq, Nq, Nkv]
// Hq % Hkv == 0: query head h reads KV head h / (Hq / Hkv) (grouped-query attention, no copy).
//
// Example:
//   attnscale::Outputs o{out.view()};
//   attnscale::Options opt;  opt.mask.causal = true;
//   attnscale::forward(q.view(), k.view(), v.view(), o, opt);
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "attnscale/tensor.h"

namespace attnscale {

enum class ScaleRule { none, sqrt, linear };  // s = 1, 1/√dk, 1/dk

// The factor s multiplying Q Kᵀ. Default: 1/√dk.
class Scale {
 public:
  Scale() = default;
  static Scale rule(ScaleRule r);
  static Scale value(double s);               // throws Error unless finite
  static Scale parse(std::string_view text);  // "none" | "sqrt" | "linear" | a finite number
  double resolve(std::int64_t dk) const;
  std::string describe() const;  // "sqrt (1/sqrt(dk))", "0.125"

 private:
  bool is_rule_ = true;
  ScaleRule rule_ = ScaleRule::sqrt;
  double value_ = 0.0;
};

// Where the diagonal of causal and windowed masks lies when Nq != Nkv.
//   top_left:     query i's diagonal key is j = i
//   bottom_right: query i's diagonal key is j = i + Nkv - Nq (the last query sees every key)
enum class Align { top_left, bottom_right };

// Every part is optional; a key is visible when every part present allows it.
struct Mask {
  bool causal = false;           // key j visible when j <= diag(i)
  Align align = Align::top_left;  // diagonal for both causal and window
  std::int64_t window_left = -1;  // key j visible when diag(i) - left <= j   (-1: unbounded)
  std::int64_t window_right = -1;  //             and when j <= diag(i) + right (-1: unbounded)
  // Explicit mask, shape [Nq, Nkv] or [B|1, H|1, Nq, Nkv] (H is Hq):
  //   DType::u8  — boolean, nonzero = keep;  DType::f32/f64 — added to the scaled scores.
  TensorView explicit_mask;

  bool has_window() const { return window_left >= 0 || window_right >= 0; }
};

// Arithmetic of the forward products. native: the inputs' dtype (float64 stays float64).
// bf16: Q·Kᵀ and P·V with bfloat16 operands and float32 accumulation (AMX tiles or AVX-512 BF16
// where the CPU has them); bfloat16 inputs always use it, float32 inputs are rounded on the fly.
enum class Compute { native, bf16 };

struct Options {
  Scale scale;
  Mask mask;
  int threads = 0;  // 0: $ATTNSCALE_THREADS, else every hardware thread
  Compute compute = Compute::native;
  // backward() only: true when lse is the log-normaliser over exactly the keys passed (the
  // forward's own lse); the backward then rescales each row's recomputed probabilities to sum to
  // 1, which removes the float32 rounding of lse from the gradients. false when lse also counts
  // keys not passed (one shard of the keys, as ring attention passes): P = e^(t − lse) as given.
  bool lse_covers_keys = true;
};

// Outputs of the forward pass. `out` is required and has q's dtype; `lse` and `probs` are
// optional (leave empty) and may be float32 or float64.
struct Outputs {
  TensorView out;
  TensorView lse;
  TensorView probs;
};

// Gradients of the backward pass, each with the dtype of its input.
struct Gradients {
  TensorView dq;
  TensorView dk;
  TensorView dv;
};

// Forward attention. Validates every argument first (throws Error naming the argument and the
// shapes; nothing is written then). Rows whose keys are all masked give out = 0, lse = -inf.
void forward(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outputs,
             const Options& options = {});

// Backward by recomputation from q, k, v, out, lse and dout (the gradient of the loss w.r.t. out).
void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& lse, const TensorView& dout, const Gradients& grads,
              const Options& options = {});

// The float64 ground truth: naive, materialises each head's score matrix, accepts any input dtype
// and writes outputs of any float dtype. Same validation and conventions as forward/backward.
namespace reference {
void forward(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outputs,
             const Options& options = {});
void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
              const Gradients& grads, const Options& options = {});
}  // namespace reference

}  // namespace attnscale
