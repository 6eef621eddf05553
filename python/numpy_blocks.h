// numpy arrays whose memory comes from the library's blocks (src/common/memory.h).
//
// numpy takes an array's memory from malloc: 16 bytes past a page for large arrays, and, for the
// few MiB of a call's outputs, fresh pages again and again: once the outputs of the call before are
// freed, glibc gives the heap's top back to the kernel, and the next call's outputs fault their
// pages in one 4 KiB page at a time (about 1000 faults a float32 backward call at N = 512-2048,
// H = 8, d = 128, three gradients of 2-8 MiB; docs/performance.md). allocate_block's blocks are
// 64-byte aligned (the kernels' own rows: a dQ written in place, not through a partial) and, from
// 2 MiB on, huge pages kept after release for the next request.
//
// numpy (1.22 on, NEP 49) lets a caller name the allocator of the arrays it creates next; each
// array keeps it for its lifetime, so it owns its data as any numpy array does (flags.owndata,
// resize) and numpy hands it back to release_block whenever it is dropped, on any thread.
#pragma once
#include <pybind11/pybind11.h>

namespace attnscale::python {

// While one lives (the GIL held), the numpy arrays created on this thread take their memory from
// allocate_block; the allocator before it is restored by its destructor.
class BlockArrays {
 public:
  BlockArrays();
  ~BlockArrays();
  BlockArrays(const BlockArrays&) = delete;
  BlockArrays& operator=(const BlockArrays&) = delete;

 private:
  PyObject* previous_;
};

}  // namespace attnscale::python
