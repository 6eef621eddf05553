// The extension module attnscale._distributed: ring attention over an mpi4py communicator
// (attnscale.distributed imports it).
#include <pybind11/pybind11.h>

#include "distributed_bindings.h"

PYBIND11_MODULE(_distributed, m) {
  pybind11::options options;
  options.disable_function_signatures();
  m.doc() = "attnscale's context-parallel (ring) attention over MPI (see attnscale.distributed).";
  attnscale::python::add_distributed(m);
}
