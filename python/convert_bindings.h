// Registers _convert (one array into another of another float dtype, attnscale::convert) on the
// module: the torch wrappers' float16 <-> float32 conversions.
#pragma once
#include <pybind11/pybind11.h>

namespace attnscale::python {
void add_convert(pybind11::module_& m);
}  // namespace attnscale::python
