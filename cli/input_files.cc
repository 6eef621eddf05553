#include "input_files.h"

#include "attnscale/error.h"
#include "attnscale/npy.h"

namespace attnscale::cli {
namespace {

// The kind letter of a .npy descr ('<f2' -> 'f', 'u1' -> 'u'), or 0 for one it cannot tell.
char kind_of(const std::string& descr) {
  const std::size_t at = !descr.empty() && (descr[0] == '<' || descr[0] == '>' || descr[0] == '|' || descr[0] == '=');
  return at < descr.size() ? descr[at] : 0;
}

// How to turn an array of this dtype into one the flag takes, or "" where no conversion keeps the
// values (complex, strings, objects, dates). A bool or uint8 file given to --q, --k or --v is most
// likely a keep mask given to the wrong flag: that is said first.
std::string advice(const std::string& flag, const std::string& descr, InputDtypes accepted) {
  const char kind = descr == "bool/uint8" ? 'u' : kind_of(descr);
  const bool real = kind == 'f', integer = kind == 'i' || kind == 'u' || kind == 'b';
  if (accepted == InputDtypes::mask && integer)
    return "; save a keep mask as bool (arr.astype(bool)) or an additive one as float32 (arr.astype('<f4'))";
  if (descr == "bool/uint8" && (flag == "--q" || flag == "--k" || flag == "--v"))
    return "; this looks like a mask: pass it as --mask, or save it as float32 (arr.astype('<f4'))";
  if (real || integer) return "; save it as float32 (arr.astype('<f4'))";
  return "";
}

}  // namespace

void refuse_dtype(const std::string& flag, const std::string& path, const std::string& descr, InputDtypes accepted) {
  const char* takes = accepted == InputDtypes::mask ? "bool '|b1', uint8 '|u1', float32 '<f4' or float64 '<f8'"
                                                    : "float32 '<f4' or float64 '<f8'";
  const std::string shown = descr == "bool/uint8" ? descr : "'" + descr + "'";
  throw Error(flag + ": " + path + ": unsupported dtype " + shown + " (expected " + takes + ")" +
              advice(flag, descr, accepted));
}

void require_accepted(const std::string& flag, const std::string& path, DType dtype, InputDtypes accepted) {
  if (accepted == InputDtypes::floats && dtype == DType::u8) refuse_dtype(flag, path, "bool/uint8", accepted);
}

Tensor read_input(const std::string& flag, const std::string& path, InputDtypes accepted) {
  Tensor t = naming_input_errors(flag, path, accepted, [&] { return read_npy(path); });
  require_accepted(flag, path, t.dtype(), accepted);
  return t;
}

detail::NpyHeader read_input_header(const std::string& flag, const std::string& path, InputDtypes accepted) {
  detail::NpyHeader h = naming_input_errors(flag, path, accepted, [&] { return detail::read_npy_header(path); });
  require_accepted(flag, path, h.dtype, accepted);
  return h;
}

}  // namespace attnscale::cli
