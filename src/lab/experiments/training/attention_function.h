// Attention inside the training models (src/lab/training): attnscale's fused forward and backward
// as a torch autograd function, PyTorch's own math as the reference, and the softmax over given
// scores that additive attention uses.
//
// Shapes: q, k [B, H, N, d], v [B, H, N, dv] with any strides (a head-interleaved projection
// output, viewed as [B, H, N, d] without a copy); out [B, H, N, dv]; lse [B, H, N].
#pragma once
#include <torch/torch.h>

namespace attnscale::lab::training {

// What a logged step records about one layer's attention, read from that layer's softmax (the
// kernel's LSE and probabilities for attnscale, torch's for the reference):
//   max_logit = max_i (lse_i + log max_j p_ij) = max_ij s·q_i·k_j   (exact: max_j p_ij ≥ 1/N)
//   entropy   = mean_i −Σ_j p_ij ln p_ij                             (nats; 0·ln 0 = 0)
struct AttentionProbe {
  bool active = false;  // set by the training loop on logged steps only (P costs N² per head)
  double max_logit = 0, entropy = 0;
};

// softmax(scale · q kᵀ + causal mask) v through attnscale::forward / attnscale::backward (the LSE
// is saved for the backward, which recomputes P). float32 or float64; `threads` for the kernel.
torch::Tensor attnscale_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  double scale, bool causal, int threads, AttentionProbe* probe);

// The same function with torch ops (matmul, masked softmax, matmul), differentiated by autograd.
torch::Tensor torch_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              double scale, bool causal, AttentionProbe* probe);

// softmax(scores + causal mask) v for scores [B, H, N, N] made by the caller (additive attention).
torch::Tensor softmax_attention(const torch::Tensor& scores, const torch::Tensor& v, bool causal,
                                AttentionProbe* probe);

}  // namespace attnscale::lab::training
