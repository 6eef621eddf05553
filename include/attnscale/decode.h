// attnscale/decode.h: combining attention computed over separate chunks of keys.
//
// Attention over keys K = K_1 ∪ ... ∪ K_C (disjoint) follows from each chunk's output and LSE:
//   lse = log Σ_c exp(lse_c),   out = Σ_c exp(lse_c − lse) · out_c.
// forward() does this itself for long-key decode (few queries); merge_partials lets a caller do
// it over KV chunks it holds separately (paged caches, several devices, streaming).
//
// Example:
//   forward(q, k_first_half, v_first_half, {o1, l1});  forward(q, k_second_half, v_second_half, {o2, l2});
//   attnscale::merge_partials({o1, o2}, {l1, l2}, out, lse);  // == forward over all keys
#pragma once
#include <vector>

#include "attnscale/tensor.h"

namespace attnscale {

// outs[c]: each of out's shape (any rank <= 4, [..., dv]); lses[c]: each of lse's shape (out's
// without the last dimension), natural log. A chunk with lse_c = -inf (it showed the row no key)
// contributes nothing; a row no chunk showed anything gets out = 0, lse = -inf. Float32 or
// float64 views, any strides; `out` may alias nothing in the inputs. Throws Error on mismatch.
void merge_partials(const std::vector<TensorView>& outs, const std::vector<TensorView>& lses,
                    const TensorView& out, const TensorView& lse);

}  // namespace attnscale
