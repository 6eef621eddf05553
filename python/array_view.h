// NumPy arrays <-> attnscale::TensorView, without copies.
//
// A numpy array is (pointer, shape, strides in bytes). TensorView takes strides in elements, so
// an input is viewed in place whenever every byte stride is a multiple of the item size — which
// covers C- and Fortran-ordered arrays, slices, transposes ([B, N, H, d] seen as [B, H, N, d]),
// negative steps and broadcast (stride 0) dimensions. Only an array with a stride that is not a
// multiple of its item size (a field of a structured array), a data pointer that is not a
// multiple of it (a byte-offset view of a buffer), or a non-native byte order is copied first;
// copy_count() counts those copies so tests can check that nothing else is copied.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

#include "attnscale/tensor.h"

namespace attnscale::python {

namespace py = pybind11;

// What an argument may hold: exactly the dtypes the library takes there, which a wrong dtype's
// TypeError lists ("q: dtype must be float32, float64 or attnscale.bfloat16, got int64").
enum class ArrayKind {
  floating,     // attention's and attention_backward's q, k, v, out, lse, dout: float32, float64 or bfloat16
  real,         // alibi_slopes, sinks, self_attention's matrices, merge_partials', ring attention's: float32 or float64
  single,       // decode's q and scales, quantize_q8's x: float32 only
  mask,         // bool/uint8 (keep) or float32/float64 (additive)
  cache,        // decode's k and v: float32, bfloat16, float16 or int8
  convertible,  // _convert's src and dst: float32, float64, bfloat16 or float16
  index,        // block tables and lengths: int32
};

// A TensorView over a numpy array, with the array (or its copy) kept alive beside it.
struct ArrayView {
  TensorView view;
  py::array array;
};

// Views `obj` (a numpy array or anything np.asarray accepts) as a TensorView. Raises TypeError
// naming `name` for a dtype of the wrong kind or a torch tensor numpy cannot read (one that
// requires grad: the message points to attnscale.torch), ValueError for more than 4 dimensions.
ArrayView as_view(const char* name, py::handle obj, ArrayKind kind);

// The name of obj's Python type, for messages ("list", "Tensor").
std::string type_name(py::handle obj);

// numpy has no bfloat16: attnscale reads and writes it as int16 storage under this dtype, an int16
// tagged with metadata {"attnscale": "bfloat16"} (attnscale.bfloat16; a torch.bfloat16 tensor t is
// t.view(torch.int16).numpy().view(attnscale.bfloat16), without a copy).
py::dtype bfloat16_dtype();

// A new C-ordered array of `dtype` (float32, float64, bfloat16 or int8) and its view, its memory
// from the library's blocks (numpy_blocks.h).
ArrayView new_array(DType dtype, const std::vector<std::int64_t>& shape);

// A numpy array sharing the owning Tensor's storage (no copy).
py::array to_numpy(Tensor t);

// How many inputs were copied because they could not be viewed in place (see above).
std::int64_t copy_count();

}  // namespace attnscale::python
