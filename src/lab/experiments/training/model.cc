#include "lab/experiments/training/model.h"

#include <cmath>

#include "attnscale/error.h"

namespace attnscale::lab::training {

torch::Tensor rotary(const torch::Tensor& x) {
  const std::int64_t n = x.size(2), half = x.size(3) / 2;
  const torch::Tensor theta = torch::pow(10000.0, torch::arange(half, torch::kFloat64) * (-2.0 / static_cast<double>(x.size(3))));
  const torch::Tensor angle = torch::arange(n, torch::kFloat64).unsqueeze(1) * theta.unsqueeze(0);  // [N, d/2]
  const torch::Tensor cos = angle.cos().to(x.scalar_type()), sin = angle.sin().to(x.scalar_type());
  const torch::Tensor x1 = x.narrow(3, 0, half), x2 = x.narrow(3, half, half);
  return torch::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, 3);
}

BlockImpl::BlockImpl(const ModelConfig& c) : c_(c) {
  const std::int64_t inner = c.n_heads * c.d_head;
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  w_qkv = register_module("w_qkv", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, 3 * inner).bias(false)));
  w_o = register_module("w_o", torch::nn::Linear(torch::nn::LinearOptions(inner, c.d_model).bias(false)));
  w_1 = register_module("w_1", torch::nn::Linear(c.d_model, 4 * c.d_model));
  w_2 = register_module("w_2", torch::nn::Linear(4 * c.d_model, c.d_model));
  if (c.scaling == "qk-norm") {
    q_norm = register_module("q_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_head})));
    k_norm = register_module("k_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_head})));
  }
  if (c.scaling == "learned") log_temperature = register_parameter("log_temperature", torch::zeros({c.n_heads}));
  if (c.scaling == "additive") {
    w_a = register_module("w_a", torch::nn::Linear(torch::nn::LinearOptions(c.d_head, c.d_head).bias(false)));
    u_a = register_module("u_a", torch::nn::Linear(torch::nn::LinearOptions(c.d_head, c.d_head).bias(false)));
    v_a = register_parameter("v_a", torch::zeros({c.d_head}));
  }
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, AttentionProbe* probe) {
  const auto b = x.size(0), n = x.size(1);
  qkv = w_qkv(ln1(x)).view({b, n, 3, c_.n_heads, c_.d_head});
  if (retain_qkv_grad && qkv.requires_grad()) qkv.retain_grad();
  // [B, N, H, d] slices viewed as [B, H, N, d]: strided views of qkv, no copy.
  torch::Tensor q = qkv.select(2, 0).permute({0, 2, 1, 3});
  torch::Tensor k = qkv.select(2, 1).permute({0, 2, 1, 3});
  const torch::Tensor v = qkv.select(2, 2).permute({0, 2, 1, 3});
  if (q_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  if (c_.positions == "rotary") {
    q = rotary(q);
    k = rotary(k);
  }
  if (log_temperature.defined()) q = q * log_temperature.exp().view({1, c_.n_heads, 1, 1});
  torch::Tensor a;
  if (c_.scaling == "additive") {
    // e_ij = v_aᵀ tanh(W_a q_i + U_a k_j): [B, H, N, 1, d] + [B, H, 1, N, d] → tanh → · v_a.
    const torch::Tensor e = torch::tanh(w_a(q).unsqueeze(3) + u_a(k).unsqueeze(2)).matmul(v_a);
    a = softmax_attention(e, v, true, probe);
  } else {
    const double s = scaling_factor(c_.scaling, c_.d_head);
    a = c_.attention == "torch" ? torch_attention(q, k, v, s, true, probe)
                                : attnscale_attention(q, k, v, s, true, c_.threads, probe);
  }
  torch::Tensor y = x + w_o(a.transpose(1, 2).reshape({b, n, c_.n_heads * c_.d_head}));
  return y + w_2(torch::gelu(w_1(ln2(y))));
}

DecoderImpl::DecoderImpl(const ModelConfig& c) : c_(c) {
  if (c.attention != "attnscale" && c.attention != "torch")
    throw Error("--attention: expected attnscale or torch, got '" + c.attention + "'");
  scaling_factor(c.scaling, c.d_head);  // validates the rule
  if (c.positions != "learned" && c.positions != "rotary")
    throw Error("--positions: expected learned or rotary, got '" + c.positions + "'");
  if (c.positions == "rotary" && c.d_head % 2 != 0)
    throw Error("--positions: rotary needs an even head dimension, got d_head " + std::to_string(c.d_head));
  tok_emb = register_module("tok_emb", torch::nn::Embedding(c.vocab, c.d_model));
  if (c.positions == "learned") pos_emb = register_parameter("pos_emb", torch::zeros({c.seq_len, c.d_model}));
  for (std::int64_t l = 0; l < c.n_layers; ++l)
    blocks.push_back(register_module("block" + std::to_string(l), Block(c)));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)));
}

torch::Tensor DecoderImpl::forward(const torch::Tensor& tokens, std::vector<AttentionProbe>* probes) {
  const auto n = tokens.size(1);
  torch::Tensor x = tok_emb(tokens);
  if (pos_emb.defined()) x = x + pos_emb.slice(0, 0, n);
  for (std::size_t l = 0; l < blocks.size(); ++l)
    x = blocks[l]->forward(x, probes != nullptr ? &(*probes)[l] : nullptr);
  return head(ln_f(x));
}

// Initialisation, every tensor from `generator` (a per-run generator: runs on other threads never
// share it):
//   weights of a linear map  N(0, 1/fan_in), so each output has the variance of one input
//                            component (q·k then has variance d_head at LayerNorm'd inputs, the
//                            setting of the derivation), except
//     W_q under `folded`     N(0, 1/(fan_in·d_head)): the 1/√d_head folded into W_q
//     W_o, W_2               N(0, 1/(fan_in·2L)): the residual stream's variance stays O(1) over L
//     the output head        N(0, 0.01/fan_in): logits of sd 0.1, so every run starts within
//                            0.5% of ln V, and gradients reach every layer from step 0
//   embeddings               tokens N(0, 1), positions N(0, 0.01)
//   biases, LayerNorm        0 and 1; log-temperatures 0; v_a N(0, 1/d_head)
void DecoderImpl::initialise(at::Generator& generator) {
  torch::NoGradGuard no_grad;
  auto normal = [&](torch::Tensor& t, double variance) { t.normal_(0, std::sqrt(variance), generator); };
  normal(tok_emb->weight, 1);
  if (pos_emb.defined()) normal(pos_emb, 0.01);
  const double layers2 = 2.0 * static_cast<double>(c_.n_layers);
  const std::int64_t inner = c_.n_heads * c_.d_head;
  for (auto& blk : blocks) {
    normal(blk->w_qkv->weight, 1.0 / c_.d_model);
    if (c_.scaling == "folded") blk->w_qkv->weight.slice(0, 0, inner).div_(std::sqrt(static_cast<double>(c_.d_head)));
    normal(blk->w_o->weight, 1.0 / (inner * layers2));
    normal(blk->w_1->weight, 1.0 / c_.d_model);
    normal(blk->w_2->weight, 1.0 / (4 * c_.d_model * layers2));
    blk->w_1->bias.zero_();
    blk->w_2->bias.zero_();
    if (blk->w_a) {
      normal(blk->w_a->weight, 1.0 / c_.d_head);
      normal(blk->u_a->weight, 1.0 / c_.d_head);
      normal(blk->v_a, 1.0 / c_.d_head);
    }
  }
  normal(head->weight, 0.01 / c_.d_model);
}

}  // namespace attnscale::lab::training
