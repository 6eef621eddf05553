// NumPy .npy reading and writing.
//
// Layout: "\x93NUMPY", major, minor, header length (uint16 for 1.0, uint32 for 2.0/3.0, little
// endian), then a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// padded with spaces to a multiple of 64 bytes and ended by '\n'; then the raw data.
#include "attnscale/npy.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "attnscale/error.h"

namespace attnscale {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw Error(path + ": " + what); }

// The value text of `key` in the header dict, or "" when absent.
std::string dict_value(const std::string& header, const std::string& key) {
  const std::regex re("['\"]" + key + "['\"]\\s*:\\s*('[^']*'|\"[^\"]*\"|True|False|\\([^)]*\\))");
  std::smatch m;
  return std::regex_search(header, m, re) ? m[1].str() : std::string();
}

DType parse_descr(const std::string& path, std::string d) {
  if (d.size() < 2) fail(path, "missing or malformed 'descr' in header");
  d = d.substr(1, d.size() - 2);
  if (d == "<f4") return DType::f32;
  if (d == "<f8") return DType::f64;
  if (d == "|b1" || d == "|u1" || d == "<u1" || d == ">u1" || d == "b1" || d == "u1") return DType::u8;
  if (!d.empty() && d[0] == '>')
    fail(path, "big-endian data ('" + d + "') is not supported; save it little-endian (arr.astype('<f4'))");
  fail(path, "unsupported dtype '" + d + "' (expected float32 '<f4', float64 '<f8', bool or uint8)");
}

std::vector<std::int64_t> parse_shape(const std::string& path, const std::string& s) {
  if (s.empty()) fail(path, "missing 'shape' in header");
  std::vector<std::int64_t> shape;
  const std::string inner = s.substr(1, s.size() - 2);
  std::size_t pos = 0;
  while (pos < inner.size()) {
    while (pos < inner.size() && (inner[pos] == ' ' || inner[pos] == ',')) ++pos;
    if (pos >= inner.size()) break;
    std::size_t end = pos;
    while (end < inner.size() && inner[end] >= '0' && inner[end] <= '9') ++end;
    if (end == pos || end - pos > 15) fail(path, "malformed 'shape' in header: " + s);
    shape.push_back(std::stoll(inner.substr(pos, end - pos)));
    pos = end;
    while (pos < inner.size() && inner[pos] == ' ') ++pos;
    if (pos < inner.size() && inner[pos] != ',') fail(path, "malformed 'shape' in header: " + s);
  }
  if (shape.empty() || shape.size() > 4)
    fail(path, "arrays of rank 1..4 are supported, got shape " + s);
  return shape;
}

}  // namespace

Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open file (" + std::string(std::strerror(errno)) + ")");
  in.seekg(0, std::ios::end);
  const std::int64_t file_size = static_cast<std::int64_t>(in.tellg());
  in.seekg(0);
  unsigned char pre[10] = {};
  if (file_size < 10 || !in.read(reinterpret_cast<char*>(pre), 10) ||
      std::memcmp(pre, "\x93NUMPY", 6) != 0)
    fail(path, file_size == 0 ? "empty file, not a .npy array" : "not a .npy file (bad magic string)");
  std::int64_t header_len = 0, offset = 0;
  if (pre[6] == 1) {
    header_len = pre[8] | (pre[9] << 8);
    offset = 10;
  } else if (pre[6] == 2 || pre[6] == 3) {
    unsigned char extra[2];
    if (!in.read(reinterpret_cast<char*>(extra), 2)) fail(path, "truncated header");
    header_len = pre[8] | (pre[9] << 8) | (extra[0] << 16) | (static_cast<std::int64_t>(extra[1]) << 24);
    offset = 12;
  } else {
    fail(path, "unsupported .npy format version " + std::to_string(pre[6]) + "." + std::to_string(pre[7]));
  }
  if (offset + header_len > file_size) fail(path, "truncated header");
  std::string header(static_cast<std::size_t>(header_len), '\0');
  in.read(header.data(), header_len);
  if (header.find('{') == std::string::npos || header.find('}') == std::string::npos)
    fail(path, "malformed header (no dict)");
  const DType dtype = parse_descr(path, dict_value(header, "descr"));
  const std::string fortran = dict_value(header, "fortran_order");
  if (fortran == "True") fail(path, "Fortran-order arrays are not supported; save with np.ascontiguousarray");
  if (fortran != "False") fail(path, "missing 'fortran_order' in header");
  const std::vector<std::int64_t> shape = parse_shape(path, dict_value(header, "shape"));
  std::int64_t numel = 1;
  for (auto d : shape) {
    if (d != 0 && numel > (std::int64_t{1} << 50) / d) fail(path, "shape too large");
    numel *= d;
  }
  const std::int64_t want = numel * static_cast<std::int64_t>(dtype_size(dtype));
  const std::int64_t have = file_size - offset - header_len;
  if (have != want)
    fail(path, "header promises " + std::to_string(want) + " data bytes but the file holds " +
                   std::to_string(have) + (have < want ? " (truncated)" : ""));
  Tensor t(dtype, shape.data(), static_cast<int>(shape.size()));
  if (want > 0 && !in.read(static_cast<char*>(t.data()), want)) fail(path, "read error");
  return t;
}

void write_npy(const std::string& path, const TensorView& view) {
  if (view.data == nullptr) throw Error(path + ": nothing to write (null data pointer)");
  const DType dtype = view.dtype == DType::bf16 ? DType::f32 : view.dtype;  // .npy has no bfloat16
  const char* descr = dtype == DType::f32 ? "<f4" : dtype == DType::f64 ? "<f8" : "|u1";
  std::string shape = "(";
  for (int d = 0; d < view.rank; ++d) shape += std::to_string(view.shape[d]) + (view.rank == 1 || d + 1 < view.rank ? "," : "");
  shape += ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';

  // Gather the (possibly strided) elements in C order.
  const std::size_t esize = dtype_size(dtype);
  std::vector<char> data(static_cast<std::size_t>(view.numel()) * esize);
  std::array<std::int64_t, kMaxRank> idx{};
  for (std::int64_t n = 0; n < view.numel(); ++n) {
    std::int64_t off = 0;
    for (int d = 0; d < view.rank; ++d) off += idx[d] * view.strides[d];
    const char* src = static_cast<const char*>(view.data) + off * static_cast<std::int64_t>(dtype_size(view.dtype));
    if (view.dtype == DType::bf16) {
      const float f = from_bf16(*reinterpret_cast<const bf16*>(src));
      std::memcpy(&data[n * esize], &f, 4);
    } else {
      std::memcpy(&data[n * esize], src, esize);
    }
    for (int d = view.rank - 1; d >= 0 && ++idx[d] == view.shape[d]; --d) idx[d] = 0;
  }

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(path + ": cannot write (" + std::string(std::strerror(errno)) + ")");
    const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                   static_cast<unsigned char>(header.size() & 0xff),
                                   static_cast<unsigned char>(header.size() >> 8)};
    out.write(reinterpret_cast<const char*>(pre), 10);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error(path + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(path + ": cannot rename temporary file into place (" + std::string(std::strerror(errno)) + ")");
  }
}

}  // namespace attnscale
