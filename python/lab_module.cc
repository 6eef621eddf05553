// The extension module attnscale._lab: the lab's experiments (attnscale.lab imports it).
#include <pybind11/pybind11.h>

#include "lab_bindings.h"

PYBIND11_MODULE(_lab, m) {
  pybind11::options options;
  options.disable_function_signatures();
  m.doc() = "attnscale's lab: the experiments behind the report (see attnscale.lab).";
  attnscale::python::add_lab(m);
}
