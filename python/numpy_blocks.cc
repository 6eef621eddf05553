#include "numpy_blocks.h"

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <algorithm>
#include <cstring>

#include "common/memory.h"

namespace attnscale::python {
namespace {

namespace py = pybind11;

void* block_malloc(void*, std::size_t bytes) { return detail::allocate_block(bytes); }

void* block_calloc(void*, std::size_t count, std::size_t item) {
  if (item != 0 && count > SIZE_MAX / item) return nullptr;
  void* p = detail::allocate_block(count * item);
  if (p) std::memset(p, 0, count * item);
  return p;
}

void block_free(void*, void* p, std::size_t) { detail::release_block(p); }

// numpy's realloc (ndarray.resize) gives only the new size: the copy takes what the old block
// holds, up to the new size.
void* block_realloc(void*, void* p, std::size_t bytes) {
  if (!p) return detail::allocate_block(bytes);
  void* q = detail::allocate_block(bytes);
  if (!q) return nullptr;  // p stays valid, as realloc leaves it
  std::memcpy(q, p, std::min(detail::block_capacity(p), bytes));
  detail::release_block(p);
  return q;
}

PyDataMem_Handler handler = {"attnscale_blocks", 1, {nullptr, block_malloc, block_calloc, block_realloc, block_free}};

// The handler as numpy takes it (a capsule named "mem_handler"), made once, the numpy C API
// imported with it.
PyObject* handler_capsule() {
  static PyObject* capsule = [] {
    if (_import_array() < 0) throw py::error_already_set();
    PyObject* c = PyCapsule_New(&handler, "mem_handler", nullptr);
    if (!c) throw py::error_already_set();
    return c;
  }();
  return capsule;
}

}  // namespace

BlockArrays::BlockArrays() {
  PyObject* ours = handler_capsule();  // first: it imports the API the call below goes through
  previous_ = PyDataMem_SetHandler(ours);
  if (!previous_) throw py::error_already_set();
}

BlockArrays::~BlockArrays() {
  PyObject* ours = PyDataMem_SetHandler(previous_);
  if (ours) Py_DECREF(ours);
  else PyErr_Clear();  // cannot happen: previous_ is the handler numpy gave
  Py_DECREF(previous_);
}

}  // namespace attnscale::python
