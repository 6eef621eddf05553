// attnscale/npy.h: reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0).
//
// Accepted: little-endian (or byte-order-free) C-order arrays of float32, float64, bool and uint8,
// rank 1..4. Everything else — truncated data, wrong magic, big-endian, Fortran order, other
// dtypes, a header whose shape disagrees with the file size — throws Error naming the file.
// write_npy writes views of rank 1..4 of every dtype but bfloat16 as it is (int32 '<i4', int8
// '|i1', float16 '<f2', ...) and bfloat16 widened to float32; another rank is an Error.
//   Tensor q = attnscale::read_npy("q.npy");
//   attnscale::write_npy("o.npy", out.view());  // atomic: temporary file, then rename
#pragma once
#include <string>

#include "attnscale/tensor.h"

namespace attnscale {

Tensor read_npy(const std::string& path);

// Writes a view (any strides) as a C-order .npy. The file appears complete or not at all: a
// temporary beside it, renamed onto it. A symbolic link is followed (the link stays); an existing
// FIFO or device is written in place, never replaced (io/output_file.h).
void write_npy(const std::string& path, const TensorView& view);

}  // namespace attnscale
