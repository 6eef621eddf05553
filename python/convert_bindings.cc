// _convert(src, dst): attnscale::convert between numpy arrays (float32, float64, attnscale.bfloat16,
// float16), dst written in place. torch 1.13 converts float16 on the CPU element by element (about
// 0.1 GB/s); this is the conversion instructions' rate (docs/performance.md).
#include "convert_bindings.h"

#include <fmt/format.h>
#include <pybind11/numpy.h>

#include "array_view.h"
#include "attnscale/error.h"
#include "attnscale/tensor.h"

namespace py = pybind11;

namespace attnscale::python {
namespace {

void convert_py(py::handle src_obj, py::handle dst_obj) {
  if (!py::isinstance<py::array>(dst_obj)) throw py::type_error("dst: expected a numpy array, got " + type_name(dst_obj));
  const auto dst_array = py::reinterpret_borrow<py::array>(dst_obj);
  if (!dst_array.writeable()) throw py::value_error("dst: the array is read-only");
  const ArrayView src = as_view("src", src_obj, ArrayKind::convertible);
  const ArrayView dst = as_view("dst", dst_obj, ArrayKind::convertible);
  if (!dst.array.is(dst_array)) throw py::value_error("dst: must be an aligned array of native byte order (it is written in place)");
  try {
    py::gil_scoped_release unlocked;
    convert(src.view, dst.view);
  } catch (const Error& e) {
    throw py::value_error(e.what());
  }
}

}  // namespace

void add_convert(py::module_& m) {
  m.def("_convert", &convert_py, "_convert(src, dst): dst[...] = src, float32 / float64 / bfloat16 / float16",
        py::arg("src"), py::arg("dst"));
}

}  // namespace attnscale::python
