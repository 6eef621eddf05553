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
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attnscale/tensor.h"

namespace attnscale {

enum class ScaleRule { none, sqrt, linear };  // s = 1, 1/√dk, 1/dk

// The factor s multiplying Q Kᵀ. Default: 1/√dk.
class Scale {
 public:
  Scale() = default;
  static Scale rule(ScaleRule r);
  static Scale value(double s);               // throws Error unless finite
  static Scale parse(std::string_view text);  // "none" | "sqrt" | "linear" | a finite number (spaces around ignored)
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

// "top-left" or "bottom-right" → Align; anything else throws Error naming `arg` (the flag or
// keyword the text came from: "--causal", "align"). The command line and Python read it here.
Align parse_align(std::string_view text, std::string_view arg);

// Every part is optional; a key is visible when every part present allows it.
struct Mask {
  bool causal = false;           // key j visible when j <= diag(i)
  Align align = Align::top_left;  // diagonal for both causal and window
  std::int64_t window_left = -1;  // key j visible when diag(i) - left <= j   (-1: unbounded)
  std::int64_t window_right = -1;  //             and when j <= diag(i) + right (-1: unbounded)
  // Explicit mask, shape [Nq, Nkv] or [B|1, H|1, Nq, Nkv] (H is Hq):
  //   DType::u8  — boolean, nonzero = keep;  DType::f32/f64 — added to the scaled scores.
  TensorView explicit_mask{};

  bool has_window() const { return window_left >= 0 || window_right >= 0; }
};

// Arithmetic of the tile products. native: the inputs' dtype (float64 stays float64).
// bf16: bfloat16 operands and float32 accumulation (AMX tiles where the CPU has them, AVX-512 BF16
// on AMD's cores, else bf16 pairs widened to float32 in registers) for the forward's Q·Kᵀ and P·V
// and the backward's five products (gradients within about 1e-2 of float64's); bfloat16 inputs
// always use it, float32 inputs are rounded on the fly. The backward of a call that asks for dbias,
// or whose q, k, v or dout hold a non-finite value, runs in float32 instead. Where the products
// would be widened to float32 (Intel's cores without AMX, AVX2 machines), calls of at least 64
// query rows (backward: 16; forward: 16 over short keys) run the float32 kernels on the bfloat16
// values of q, k, v (and dout) widened to float32 (copies made once a call, or, for forwards of up
// to 8 query blocks a KV head, each tile widened as it is packed): the products of the same values, with P and the backward's dS left
// in float32 instead of rounded to bfloat16 (closer to float64), in about the float32 call's time.
enum class Compute { native, bf16 };

// Dropout on the attention probabilities, as FlashAttention applies it: P_ij is kept with
// probability 1 − p and then divided by 1 − p, else zeroed, so out = (Z ∘ P / (1 − p))·V while lse
// stays the softmax's. The keep bit Z of pair (b, h, i, j) is a pure function of (seed, offset, b,
// h, i, j) (Philox4x64-10): the backward regenerates it, and any thread count gives the same mask.
// Calls with the same seed and different offsets draw independent masks.
struct Dropout {
  double p = 0.0;  // in [0, 1); 0: off
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
};

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
  // backward() only: the gradient of the loss w.r.t. lse, of lse's shape, any float dtype; empty: 0
  // (a loss that reads out alone). Since ∂lse_i/∂t_ij = P_ij, it adds dlse_i·P_ij to each score's
  // gradient: dS = P ∘ (dP − (D − dlse)) with D_i = dO_i·o_i, and dsinks, dbias follow. forward()
  // refuses it.
  TensorView dlse{};

  // Score transforms, all off by default. The score of pair (b, h, i, j) is
  //   t = cap(s·q_i·k_j) − slope_bh·|diag(i) − j| + bias_ij,   cap(x) = c·tanh(x / c)
  // with diag(i) the mask's diagonal (Mask::align; FlashAttention's ALiBi is bottom-right).
  double softcap = 0.0;       // c > 0 (Gemma 2 uses 50 for attention); 0: no capping
  TensorView alibi_slopes{};  // [Hq] or [B, Hq], float32/float64; empty: no ALiBi
  // Attention sinks (gpt-oss): one logit per query head that joins every row's softmax without a
  // value, P_ij = exp(t_ij) / (exp(sink_h) + Σ_j exp(t_ij)); lse includes it, so a row that sees
  // no key has out = 0 and lse = sink_h. [Hq], float32/float64; empty: none.
  TensorView sinks{};
  Dropout dropout;
  // Packed sequences (FlashAttention's varlen layout): when cu_seqlens_q is given, q is
  // [Hq, total_q, dk] (or [1, Hq, total_q, dk]), k and v are [Hkv, total_k, d], and sequence s
  // owns query rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) and keys [cu_seqlens_k[s],
  // cu_seqlens_k[s+1]). Both start at 0, never decrease, have the same length S + 1 and end at
  // total_q and total_k. Masks, ALiBi ([Hq] or [S, Hq]) and dropout (b = s, i and j counted from
  // the sequence's start) apply per sequence, as if each were a batch entry of its own; an
  // explicit mask is not accepted. Empty: one sequence per batch entry, as usual.
  std::vector<std::int64_t> cu_seqlens_q{}, cu_seqlens_k{};
};

// Outputs of the forward pass. `out` is required and has q's dtype; `lse` and `probs` are
// optional (leave empty) and may be float32 or float64. probs holds the softmax P (before dropout);
// under dropout a pair the mask drops is written as −P_ij (FlashAttention's S_dmask convention: the
// sign carries the mask). With packed sequences probs is [Hq, total_q, total_k] (or [1, Hq, ...]):
// sequence s fills its diagonal block, rows cu_seqlens_q[s].. by keys cu_seqlens_k[s].., the rest is 0.
struct Outputs {
  TensorView out{};
  TensorView lse{};
  TensorView probs{};
};

// Gradients of the backward pass, each with the dtype of its input. dsinks and dbias are
// optional (leave empty), float32 or float64:
//   dsinks [Hq]: the gradient w.r.t. Options::sinks, −Σ_{b,i} exp(sink_h − lse_bhi)·(dO·o)_bhi;
//   dbias [B, Hq, Nq, Nkv] (or [Nq, Nkv] when B = Hq = 1): the gradient w.r.t. an additive float
//     mask, dS = P ∘ (dP − rowsum(P ∘ dP)), zero where the mask hides the pair. A mask that
//     broadcasts over B or H gets the sum of dbias over those dimensions.
struct Gradients {
  TensorView dq{};
  TensorView dk{};
  TensorView dv{};
  TensorView dsinks{};
  TensorView dbias{};
};

// The shapes of forward()'s outputs for q [..., Nq, dk], k [..., Nkv, dk], v [..., Nkv, dv]: q's
// leading dimensions, then out [..., Nq, dv], lse [..., Nq], probs [..., Nq, Nkv]. Throws Error,
// with forward()'s own rank rule and message, when q, k or v is not of rank 2 to 4; `names` name
// them in the message (the command line says "--q", Python "q").
struct OutputShapes {
  std::vector<std::int64_t> out{}, lse{}, probs{};
};
OutputShapes output_shapes(const TensorView& q, const TensorView& k, const TensorView& v,
                           const std::array<std::string_view, 3>& names = {"q", "k", "v"});

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
