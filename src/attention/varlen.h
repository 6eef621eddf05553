// Packed sequences (Options::cu_seqlens_q/k, FlashAttention's varlen layout): the packed problem
// is validated once as one sequence, then each sequence runs as a batch entry of its own, on views
// of its rows and keys (no copy). Shared by the fast path and the float64 reference.
#pragma once
#include "attention/params.h"

namespace attnscale::detail {

inline bool is_varlen(const Options& o) { return !o.cu_seqlens_q.empty() || !o.cu_seqlens_k.empty(); }

void varlen_forward(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outputs,
                    const Options& options, Kernel kernel);
void varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                     const TensorView& lse, const TensorView& dout, const Gradients& grads, const Options& options,
                     Kernel kernel);

// The kernels over validated params (forward.cc, backward.cc, reference.cc).
void run_forward(const Params& p, Compute compute);
void run_backward(const BackwardParams& p, Compute compute);
void run_reference_forward(const Params& p);
void run_reference_backward(const BackwardParams& p);

}  // namespace attnscale::detail
