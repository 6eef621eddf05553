// The .npy header parser, shared by read_npy (files) and read_npy_bytes (memory: tests, fuzzing).
//
// Layout: "\x93NUMPY", major, minor, header length (uint16 for 1.0, uint32 for 2.0/3.0, little
// endian), then a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// padded with spaces and ended by '\n'; then the raw data. The dict is parsed by a small strict
// recursive-descent reader, never a regex: its cost is linear in the header and its stack depth
// constant, whatever bytes the file holds.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnscale/error.h"
#include "attnscale/tensor.h"

namespace attnscale::detail {

// The Error read_npy throws for a dtype it does not read ('<f2', '<i8', '|O'): its message lists
// read_npy's dtypes; a caller that takes fewer of them names its own from `descr`
// (cli/input_files.cc).
class NpyDtypeError : public Error {
 public:
  NpyDtypeError(const std::string& what, std::string descr) : Error(what), descr(std::move(descr)) {}
  std::string descr;  // the header's spelling, bytes outside printable ASCII as \xNN
};

inline constexpr std::int64_t kNpyPreambleBytes = 12;  // enough for every format version

struct NpyPreamble {
  std::int64_t header_offset = 0;  // where the dict text starts (10 or 12)
  std::int64_t header_len = 0;
};

struct NpyHeader {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::int64_t data_offset = 0;  // first data byte
  std::int64_t data_bytes = 0;   // numel × element size, checked against the file size
};

// `first` holds the file's first min(file_size, kNpyPreambleBytes) bytes. Throws Error naming `name`.
NpyPreamble parse_npy_preamble(const std::string& name, std::string_view first, std::int64_t file_size);

// `dict` is the header text that follows the preamble. Checks the data size against `file_size`,
// so a header promising more (or fewer) bytes than the file holds fails before any allocation.
NpyHeader parse_npy_header(const std::string& name, std::string_view dict, const NpyPreamble& pre,
                           std::int64_t file_size);

// The preamble and header of a version 1.0 .npy file of C-order data (write_npy's, and the
// shared output file of `attend --context-parallel`, whose ranks each write their own rows).
// Throws Error for bfloat16 (which .npy lacks) and for a rank outside 1..4.
std::string npy_header_bytes(DType dtype, const std::int64_t* shape, int rank);

// The whole .npy file of a view (any strides, C order; bfloat16 widened to float32): what
// write_npy writes. Throws Error, not naming a file, for a null view or a rank outside 1..4.
std::string npy_file_bytes(const TensorView& view);

// The header of the .npy file `path`, its data not read: what read_npy would allocate, known
// before it does (a command checks what its inputs and outputs need together first). Throws the
// Errors read_npy throws for the file and its header, naming `path`.
NpyHeader read_npy_header(const std::string& path);

// A whole .npy file held in memory.
Tensor read_npy_bytes(const std::string& name, std::string_view bytes);

}  // namespace attnscale::detail
