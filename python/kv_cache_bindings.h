// Registers decode (attention over an inference KV cache) and quantize_q8 on the module.
#pragma once
#include <pybind11/pybind11.h>

namespace attnscale::python {
void add_kv_cache(pybind11::module_& m);
}  // namespace attnscale::python
