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
};

MaskedOptions make_options(py::handle scale, py::handle causal, py::handle window, py::handle align,
                           py::handle mask, int threads);

}  // namespace attnscale::python
