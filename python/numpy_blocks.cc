#include "numpy_blocks.h"

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "common/memory.h"

namespace attnscale::python {
namespace {

namespace py = pybind11;

// The size of every live block this allocator handed out: numpy's realloc (ndarray.resize) gives
// only the new size, and the copy needs the old one.
struct Sizes {
  std::mutex mutex;
  std::unordered_map<void*, std::size_t> of;
};
Sizes& sizes() {
  static Sizes* s = new Sizes;  // never destroyed: arrays may outlive static destruction
  return *s;
}

void* block_malloc(void*, std::size_t bytes) {
  void* p = detail::allocate_block(bytes);
  if (p) {
    std::lock_guard<std::mutex> lock(sizes().mutex);
    sizes().of[p] = bytes;
  }
  return p;
}

void* block_calloc(void* ctx, std::size_t count, std::size_t item) {
  if (item != 0 && count > SIZE_MAX / item) return nullptr;
  void* p = block_malloc(ctx, count * item);
  if (p) std::memset(p, 0, count * item);
  return p;
}

void block_free(void*, void* p, std::size_t) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(sizes().mutex);
    sizes().of.erase(p);
  }
  detail::release_block(p);
}

void* block_realloc(void* ctx, void* p, std::size_t bytes) {
  if (!p) return block_malloc(ctx, bytes);
  std::size_t old = 0;
  {
    std::lock_guard<std::mutex> lock(sizes().mutex);
    old = sizes().of.at(p);
  }
  void* q = block_malloc(ctx, bytes);
  if (!q) return nullptr;  // p stays valid, as realloc leaves it
  std::memcpy(q, p, std::min(old, bytes));
  block_free(ctx, p, old);
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
