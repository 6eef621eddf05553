// attnscale/self_attention.h: attention over projections of one input X, as in Chuang (2023)
// (Q = X W_q, K = X W_k, V = X W_v) and multi-head attention with an output projection W_o.
//
//   X [N, dx]  W_q, W_k [dx, H·dk]  W_v [dx, H·dv]  W_o [H·dv, d_out]  →  Y [N, d_out]
// Head h uses columns h·dk .. (h+1)·dk of Q and K, and h·dv .. of V; the heads' outputs are
// concatenated along columns (a strided view, no copy) before W_o. Single-head self-attention is
// H = 1 with no W_o. All matrices must share one dtype, float32 or float64.
#pragma once
#include <cstdint>

#include "attnscale/attention.h"
#include "attnscale/tensor.h"

namespace attnscale {

// softmax(X W_q (X W_k)ᵀ · s + mask) X W_v  →  [N, dv]
Tensor self_attention(const TensorView& x, const TensorView& w_q, const TensorView& w_k,
                      const TensorView& w_v, const Options& options = {});

// concat_h(attention_h) W_o  →  [N, d_out]; e.g. 8 heads × 64 = 512 as in the original paper.
Tensor multi_head_attention(const TensorView& x, const TensorView& w_q, const TensorView& w_k,
                            const TensorView& w_v, const TensorView& w_o, std::int64_t heads,
                            const Options& options = {});

}  // namespace attnscale
