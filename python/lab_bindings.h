// Registers lab_experiments and lab_run (the lab's registry) on the module.
#pragma once
#include <pybind11/pybind11.h>

namespace attnscale::python {
void add_lab(pybind11::module_& m);
}  // namespace attnscale::python
