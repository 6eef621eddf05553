// Python keyword arguments -> attnscale::Options (scale, causal, align, window, mask, threads).
//
//   scale:  None (1/sqrt(dk)) | 'none' | 'sqrt' | 'linear' | a finite number
//   causal: None/False | True (top-left unless align says otherwise) | 'top-left' | 'bottom-right'
//   align:  None | 'top-left' | 'bottom-right' — the diagonal of window when causal is not given
//   window: None | (left, right), each an int >= 0 or None (unbounded)
//   mask:   None | array [Nq, Nkv] or [B|1, H|1, Nq, Nkv]; bool/uint8 keep, float32/float64 added
// Wrong Python types raise TypeError; wrong values raise ValueError with the library's message.
#pragma once
#include <pybind11/pybind11.h>

#include "array_view.h"
#include "attnscale/attention.h"

namespace attnscale::python {

struct MaskedOptions {
  Options options;
  ArrayView mask;  // keeps the mask array alive while options.mask.explicit_mask points into it
  ArrayView alibi_slopes, sinks;  // likewise for Options::alibi_slopes and Options::sinks
};

// The score transforms, dropout and packed sequences of attention / attention_backward:
//   softcap:       0 (off) | c > 0, scores become c·tanh(score / c)
//   alibi_slopes:  None | array [Hq] or [B, Hq] (packed: [S, Hq]), float32/float64
//   sinks:         None | array [Hq], float32/float64: one logit per head in every row's softmax
//   dropout_p, dropout_seed, dropout_offset: dropout on the probabilities (0: off)
//   cu_seqlens_q, cu_seqlens_k: None | integer sequences [S + 1] (packed sequences)
struct Extras {
  double softcap = 0.0;
  py::handle alibi_slopes, sinks;
  double dropout_p = 0.0;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  py::handle cu_seqlens_q, cu_seqlens_k;
};
void add_extras(MaskedOptions& m, const Extras& e);

MaskedOptions make_options(py::handle scale, py::handle causal, py::handle window, py::handle align,
                           py::handle mask, int threads);

// compute: None or 'native' (Compute::native) | 'bf16'.
Compute parse_compute(py::handle compute);

}  // namespace attnscale::python
