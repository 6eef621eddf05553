// NumPy .npy reading and writing. The header format is described in npy_header.h.
#include "attnscale/npy.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "attnscale/error.h"
#include "io/npy_header.h"
#include "io/output_file.h"

namespace attnscale {
namespace detail {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw Error(path + ": " + what); }

// A strict reader of the header dict: {'key': value, ...} with string, True/False and
// tuple-of-integers values, an optional trailing comma, then spaces/newline padding.
class DictReader {
 public:
  DictReader(const std::string& path, std::string_view text) : path_(path), t_(text) {}

  struct Entry {
    std::string key;
    std::string str;                  // string value (unquoted)
    int boolean = -1;                 // 0/1 for False/True, -1 otherwise
    bool is_tuple = false;
    bool is_list = false;             // a [...] value (structured dtypes), kept only as text
    std::vector<std::int64_t> tuple;  // tuple value
    std::string raw;                  // the value's text, for messages
  };

  std::vector<Entry> entries() {
    std::vector<Entry> out;
    space();
    if (!eat('{')) fail(path_, "malformed header (no dict)");
    space();
    while (!eat('}')) {
      Entry e;
      e.key = quoted("a quoted key");
      space();
      if (!eat(':')) malformed("expected ':' after '" + e.key + "'");
      space();
      value(e);
      out.push_back(std::move(e));
      if (!next_item('}', "expected ',' or '}'")) break;
    }
    for (; pos_ < t_.size(); ++pos_)
      if (t_[pos_] != ' ' && t_[pos_] != '\n' && t_[pos_] != '\t' && t_[pos_] != '\r' && t_[pos_] != '\0')
        malformed("unexpected text after the dict");
    return out;
  }

 private:
  [[noreturn]] void malformed(const std::string& what) {
    fail(path_, "malformed header: " + what + " at byte " + std::to_string(pos_));
  }
  bool eat(char c) {
    if (pos_ < t_.size() && t_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void space() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\t' || t_[pos_] == '\n' || t_[pos_] == '\r'))
      ++pos_;
  }
  // After an item of a dict or tuple: true at ',' (the next item, or `close`, follows), false once
  // `close` ends the list; anything else is malformed (`expected` says what was wanted).
  bool next_item(char close, const char* expected) {
    space();
    if (eat(',')) {
      space();
      return true;
    }
    if (!eat(close)) malformed(expected);
    return false;
  }
  std::string quoted(const char* what) {
    if (pos_ >= t_.size() || (t_[pos_] != '\'' && t_[pos_] != '"')) malformed(std::string("expected ") + what);
    const char q = t_[pos_++];
    const std::size_t end = t_.find(q, pos_);
    if (end == std::string_view::npos) malformed("unterminated string");
    std::string s(t_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  void value(Entry& e) {
    const std::size_t begin = pos_;
    if (pos_ < t_.size() && (t_[pos_] == '\'' || t_[pos_] == '"')) {
      e.str = quoted("a string");
    } else if (t_.substr(pos_, 4) == "True") {
      e.boolean = 1;
      pos_ += 4;
    } else if (t_.substr(pos_, 5) == "False") {
      e.boolean = 0;
      pos_ += 5;
    } else if (eat('(')) {
      e.is_tuple = true;
      space();
      while (!eat(')')) {
        const std::size_t d0 = pos_;
        while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') ++pos_;
        // 15 digits bound every dimension below 10^15, so the products below cannot overflow
        // before the size check stops them.
        if (pos_ == d0 || pos_ - d0 > 15) malformed("expected a non-negative integer of at most 15 digits in the tuple");
        e.tuple.push_back(std::stoll(std::string(t_.substr(d0, pos_ - d0))));
        if (e.tuple.size() > 32) malformed("tuple too long");
        if (!next_item(')', "expected ',' or ')' in the tuple")) break;
      }
    } else if (t_.substr(pos_, 1) == "[") {  // a structured dtype's field list: skipped, then refused
      skip_brackets();
      e.is_list = true;
    } else {
      malformed("expected a string, True, False or a tuple");
    }
    e.raw = std::string(t_.substr(begin, pos_ - begin));
  }

  // Skips a bracketed group, nested brackets and quoted strings included (iteratively: no
  // recursion, so no input can exhaust the stack).
  void skip_brackets() {
    std::size_t depth = 0;
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if (c == '\'' || c == '"') {
        quoted("a string");
        continue;
      }
      ++pos_;
      if (c == '[' || c == '(') ++depth;
      if ((c == ']' || c == ')') && --depth == 0) return;
    }
    malformed("unterminated list");
  }

  const std::string& path_;
  std::string_view t_;
  std::size_t pos_ = 0;
};

// `text` with every byte outside printable ASCII as \xNN, so that a message quoting a header
// string shows all of it (a NUL would end the line at the terminal).
std::string printable(const std::string& text) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

DType parse_descr(const std::string& path, const std::string& d) {
  if (d == "<f4") return DType::f32;
  if (d == "<f8") return DType::f64;
  if (d == "|b1" || d == "|u1" || d == "<u1" || d == ">u1" || d == "b1" || d == "u1") return DType::u8;
  // The little-endian spelling of the same type ('>f8' -> '<f8', never a narrower one), offered only
  // where that spelling is read: '>u2' -> '<u2' would only be refused next.
  if (d == ">f4" || d == ">f8")
    fail(path, "big-endian data ('" + printable(d) + "') is not supported; save it little-endian (arr.astype('<" +
                   printable(d.substr(1)) + "'))");
  throw NpyDtypeError(path + ": unsupported dtype '" + printable(d) + "' (expected float32 '<f4', float64 '<f8', bool or uint8)",
                      printable(d));
}

// The tensor a header describes; an allocation refused by Tensor names the file too.
Tensor allocate(const std::string& path, const NpyHeader& h) {
  try {
    return Tensor(h.dtype, h.shape.data(), static_cast<int>(h.shape.size()));
  } catch (const Error& e) {
    fail(path, e.what());
  }
}

}  // namespace

NpyPreamble parse_npy_preamble(const std::string& path, std::string_view first, std::int64_t file_size) {
  if (file_size == 0) fail(path, "empty file, not a .npy array");
  if (first.size() < 10 || first.substr(0, 6) != std::string_view("\x93NUMPY", 6))
    fail(path, "not a .npy file (bad magic string)");
  const auto byte = [&](std::size_t i) { return static_cast<std::int64_t>(static_cast<unsigned char>(first[i])); };
  NpyPreamble p;
  // numpy writes versions 1.0, 2.0 and 3.0 and reads no others: a minor number past 0 is a format
  // this reader cannot know to be the same.
  if (byte(7) != 0 || byte(6) < 1 || byte(6) > 3)
    fail(path, "unsupported .npy format version " + std::to_string(byte(6)) + "." + std::to_string(byte(7)));
  if (byte(6) == 1) {
    p.header_len = byte(8) | (byte(9) << 8);
    p.header_offset = 10;
  } else {  // 2.0 and 3.0: a 4-byte header length
    if (first.size() < 12) fail(path, "truncated header");
    p.header_len = byte(8) | (byte(9) << 8) | (byte(10) << 16) | (byte(11) << 24);
    p.header_offset = 12;
  }
  if (p.header_offset + p.header_len > file_size) fail(path, "truncated header");
  return p;
}

NpyHeader parse_npy_header(const std::string& path, std::string_view dict, const NpyPreamble& pre,
                           std::int64_t file_size) {
  std::string descr, shape_text;
  int fortran = -1;
  bool have_descr = false, have_shape = false;
  NpyHeader h;
  for (const auto& e : DictReader(path, dict).entries()) {
    if (e.key == "descr") {
      if (have_descr) fail(path, "malformed header: 'descr' given twice");
      if (e.is_list) fail(path, "unsupported dtype: structured arrays (record fields) are not supported");
      if (e.is_tuple || e.boolean >= 0) fail(path, "unsupported dtype " + e.raw);
      descr = e.str;
      have_descr = true;
    } else if (e.key == "fortran_order") {
      if (fortran >= 0) fail(path, "malformed header: 'fortran_order' given twice");
      if (e.boolean < 0) fail(path, "malformed header: 'fortran_order' must be True or False, got " + e.raw);
      fortran = e.boolean;
    } else if (e.key == "shape") {
      if (have_shape) fail(path, "malformed header: 'shape' given twice");
      if (!e.is_tuple) fail(path, "malformed 'shape' in header: " + e.raw);
      h.shape = e.tuple;
      shape_text = e.raw;
      have_shape = true;
    } else {
      fail(path, "malformed header: unexpected key '" + e.key + "'");
    }
  }
  if (!have_descr) fail(path, "missing or malformed 'descr' in header");
  h.dtype = parse_descr(path, descr);
  if (fortran == 1) fail(path, "Fortran-order arrays are not supported; save with np.ascontiguousarray");
  if (fortran < 0) fail(path, "missing 'fortran_order' in header");
  if (!have_shape) fail(path, "missing 'shape' in header");
  if (h.shape.empty() || h.shape.size() > 4) fail(path, "arrays of rank 1..4 are supported, got shape " + shape_text);
  std::int64_t numel = 1;
  for (auto d : h.shape) {
    if (d != 0 && numel > (std::int64_t{1} << 50) / d) fail(path, "shape too large: " + shape_text);
    numel *= d;
  }
  h.data_offset = pre.header_offset + pre.header_len;
  h.data_bytes = numel * static_cast<std::int64_t>(dtype_size(h.dtype));
  const std::int64_t have = file_size - h.data_offset;
  if (have != h.data_bytes)
    fail(path, "header promises " + std::to_string(h.data_bytes) + " data bytes but the file holds " +
                   std::to_string(have) + (have < h.data_bytes ? " (truncated)" : ""));
  return h;
}

Tensor read_npy_bytes(const std::string& name, std::string_view bytes) {
  const auto size = static_cast<std::int64_t>(bytes.size());
  const NpyPreamble pre = parse_npy_preamble(name, bytes.substr(0, kNpyPreambleBytes), size);
  const NpyHeader h = parse_npy_header(name, bytes.substr(pre.header_offset, pre.header_len), pre, size);
  Tensor t = allocate(name, h);
  if (h.data_bytes > 0) std::memcpy(t.data(), bytes.data() + h.data_offset, h.data_bytes);
  return t;
}

namespace {

// The descr of each dtype write_npy writes as it is (bfloat16 is widened to float32 first).
const char* descr_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return "<f4";
    case DType::f64: return "<f8";
    case DType::u8: return "|u1";
    case DType::i8: return "|i1";
    case DType::i32: return "<i4";
    case DType::f16: return "<f2";
    case DType::bf16: break;  // .npy has no bfloat16
  }
  return nullptr;
}

}  // namespace

std::string npy_header_bytes(DType dtype, const std::int64_t* shape, int rank) {
  const char* descr = descr_of(dtype);
  // Checked before `shape` is read: a view's shape holds kMaxRank dimensions.
  if (rank < 1 || rank > kMaxRank)
    throw Error("cannot write an array of rank " + std::to_string(rank) + " (ranks 1 to " +
                std::to_string(kMaxRank) + " are written)");
  if (descr == nullptr) throw Error("cannot write dtype " + std::string(dtype_name(dtype)) + " to .npy");
  std::string text = "(";
  for (int d = 0; d < rank; ++d) text += std::to_string(shape[d]) + (rank == 1 || d + 1 < rank ? "," : "");
  text += ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + text + ", }";
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(header.size() & 0xff),
                                 static_cast<unsigned char>(header.size() >> 8)};
  return std::string(reinterpret_cast<const char*>(pre), 10) + header;
}

std::string npy_file_bytes(const TensorView& view) {
  if (view.data == nullptr) throw Error("nothing to write (null data pointer)");
  const DType dtype = view.dtype == DType::bf16 ? DType::f32 : view.dtype;  // .npy has no bfloat16
  std::string bytes = npy_header_bytes(dtype, view.shape.data(), view.rank);  // checks rank and dtype

  // Gather the (possibly strided) elements in C order.
  const std::size_t esize = dtype_size(dtype), at = bytes.size();
  bytes.resize(at + static_cast<std::size_t>(view.numel()) * esize);
  char* data = bytes.data() + at;
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
  return bytes;
}

namespace {

// Opens `path` into `in` and reads its header; `in` is left at the first data byte.
NpyHeader read_header(const std::string& path, std::ifstream& in) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory, not a .npy file");
  in.open(path, std::ios::binary);
  if (!in) fail(path, "cannot open file (" + std::string(std::strerror(errno)) + ")");
  in.seekg(0, std::ios::end);
  const std::int64_t file_size = static_cast<std::int64_t>(in.tellg());
  if (file_size < 0) fail(path, "cannot read file size (not a regular file?)");
  in.seekg(0);
  std::string first(static_cast<std::size_t>(std::min(file_size, kNpyPreambleBytes)), '\0');
  if (!in.read(first.data(), static_cast<std::streamsize>(first.size()))) fail(path, "read error");
  const NpyPreamble pre = parse_npy_preamble(path, first, file_size);
  std::string dict(static_cast<std::size_t>(pre.header_len), '\0');
  in.seekg(pre.header_offset);
  if (!in.read(dict.data(), pre.header_len)) fail(path, "truncated header");
  NpyHeader h = parse_npy_header(path, dict, pre, file_size);
  in.seekg(h.data_offset);
  return h;
}

}  // namespace

NpyHeader read_npy_header(const std::string& path) {
  std::ifstream in;
  return read_header(path, in);
}

}  // namespace detail

Tensor read_npy(const std::string& path) {
  using namespace detail;
  std::ifstream in;
  const NpyHeader h = read_header(path, in);
  Tensor t = allocate(path, h);
  if (h.data_bytes > 0 && !in.read(static_cast<char*>(t.data()), h.data_bytes)) fail(path, "read error");
  return t;
}

void write_npy(const std::string& path, const TensorView& view) {
  std::string bytes;
  try {
    bytes = detail::npy_file_bytes(view);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
  detail::OutputFile(path, std::move(bytes)).place();
}

}  // namespace attnscale
