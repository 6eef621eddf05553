// attnscale._attnscale._ring_attention / _ring_attention_backward / _shard: context-parallel
// attention over an MPI communicator (attnscale/distributed.h), for attnscale.distributed. The
// communicator arrives as its Fortran handle (mpi4py's comm.py2f()), so the module needs no mpi4py
// headers. Present only in builds with MPI; has_mpi() says which.
#pragma once
#include <pybind11/pybind11.h>

namespace attnscale::python {

void add_distributed(pybind11::module_& m);

}  // namespace attnscale::python
