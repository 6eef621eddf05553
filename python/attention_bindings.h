// Registers attention, attention_backward, self_attention and multi_head_attention on the module.
#pragma once
#include <pybind11/pybind11.h>

namespace attnscale::python {
void add_attention(pybind11::module_& m);
}  // namespace attnscale::python
