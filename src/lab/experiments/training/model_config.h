// The training experiment's model as configured (model.h builds it), and its scaling rules,
// without libtorch: the lab checks a sweep's --scaling with them before any run loads the
// libtorch module.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace attnscale::lab::training {

// How the logits of a head are scaled (d = d_head):
//   none     s = 1
//   sqrt     s = 1/√d                                 (the Transformer paper)
//   linear   s = 1/d                                  (μP)
//   qk-norm  LayerNorm on q and k (per head), then s = 1/√d
//   folded   s = 1, W_q's initialisation divided by √d (T5): the same logits at step 0 as sqrt,
//            but the factor is not re-applied as W_q trains
//   learned  s = e^{τ_h}/√d with one learned τ_h per head, τ_h = 0 at start: a temperature the
//            optimiser may move away from 1/√d, so a run shows whether training wants another scale
//   additive e_ij = v_aᵀ tanh(W_a q_i + U_a k_j) (Bahdanau et al.), no scale
const std::vector<std::string>& scaling_rules();
// The factor s given to the attention op (additive: unused).
double scaling_factor(const std::string& rule, std::int64_t d_head);

struct ModelConfig {
  std::int64_t vocab = 0, seq_len = 64, d_model = 64, n_layers = 2, n_heads = 2, d_head = 64;
  std::string scaling = "sqrt";
  std::string attention = "attnscale";  // or "torch"
  std::string positions = "learned";    // or "rotary" (RoPE on q and k; needs an even d_head)
  int threads = 1;                      // attnscale kernel threads
};

}  // namespace attnscale::lab::training
