// The training experiment's model: a small pre-LN decoder-only Transformer (GPT-2's block order)
// built from libtorch modules, whose attention is attnscale's fused op or PyTorch's math.
//
// Shapes: tokens [B, N] (int64) → logits [B, N, V]. Inside a block, x [B, N, D];
// q, k, v [B, H, N, d_head] (views of the qkv projection [B, N, 3, H, d_head]).
//
//   x = tok_emb[tokens] + pos_emb[:N]                 (learned positions; rotary: tok_emb only)
//   per block:  x += W_o · attention(LN(x))           (causal; the scaling rule below; rotary
//                                                      positions rotate q and k first)
//               x += W_2 · GELU(W_1 · LN(x))
//   logits = W_head · LN(x)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lab/experiments/training/attention_function.h"
#include "lab/experiments/training/model_config.h"

namespace attnscale::lab::training {

// Rotary positions (Su et al., RoFormer; the half split of GPT-NeoX): in x [B, H, N, d], the pair
// of dimensions (i, i + d/2) at position p is rotated by the angle p·θ_i, θ_i = 10000^(−2i/d).
// A rotation by p·θ and one by r·θ leave the dot product depending on p − r only, so q_p·k_r sees
// relative position. d must be even.
torch::Tensor rotary(const torch::Tensor& x);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& c);
  torch::Tensor forward(const torch::Tensor& x, AttentionProbe* probe);
  // The projection output [B, N, 3, H, d_head] of the last forward: its .grad() after backward
  // holds the gradient reaching Q (index 0 of dim 2) and K (index 1), when it was retained.
  torch::Tensor qkv;
  bool retain_qkv_grad = false;

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr}, q_norm{nullptr}, k_norm{nullptr};
  torch::nn::Linear w_qkv{nullptr}, w_o{nullptr}, w_1{nullptr}, w_2{nullptr}, w_a{nullptr}, u_a{nullptr};
  torch::Tensor log_temperature, v_a;

 private:
  ModelConfig c_;
};
TORCH_MODULE(Block);

class DecoderImpl : public torch::nn::Module {
 public:
  explicit DecoderImpl(const ModelConfig& c);
  // probes: empty, or one per layer.
  torch::Tensor forward(const torch::Tensor& tokens, std::vector<AttentionProbe>* probes = nullptr);
  // Every parameter drawn again from `generator` (see model.cc for the distributions).
  void initialise(at::Generator& generator);
  const ModelConfig& config() const { return c_; }

  torch::nn::Embedding tok_emb{nullptr};
  torch::Tensor pos_emb;
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  ModelConfig c_;
};
TORCH_MODULE(Decoder);

}  // namespace attnscale::lab::training
