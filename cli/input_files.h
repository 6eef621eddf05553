// Reading a .npy input named by a flag: every error says which flag's file it is, and a dtype the
// flag does not take is told with what the flag takes and how to convert the file.
//
// read_npy() knows only the path, so its messages start with it ("k.npy: unsupported dtype ...").
// Given on the command line, the same file can be behind several flags (--k and --v), and a user
// who typed --q x.npy looks for --q in the message; context-parallel attend already says
// "--q: x.npy: ...". Every subcommand reads its input files here.
#pragma once
#include <string>

#include "attnscale/error.h"
#include "attnscale/tensor.h"
#include "io/npy_header.h"

namespace attnscale::cli {

// The dtypes a flag's file may hold (.npy has no bfloat16).
enum class InputDtypes {
  floats,  // float32 or float64: --q, --k, --v, --alibi-slopes, --sinks
  mask,    // bool, uint8 (keep where nonzero) or float32, float64 (added to the scores): --mask
};

// read_npy(path); an Error it throws comes back as Error("<flag>: <its message>"), and a dtype
// outside `accepted` as
//   --q: h.npy: unsupported dtype '<f2' (expected float32 '<f4' or float64 '<f8'); save it as float32 (arr.astype('<f4'))
// (the advice only for float and integer dtypes, which convert); a bool or uint8 file given to --q,
// --k or --v is told "this looks like a mask: pass it as --mask, or save it as float32 (...)".
Tensor read_input(const std::string& flag, const std::string& path, InputDtypes accepted);

// The header of the file read_input() would read, its data not read, with read_input()'s errors:
// what it will hold, for a command that checks its arrays' sizes before reading any of them.
detail::NpyHeader read_input_header(const std::string& flag, const std::string& path, InputDtypes accepted);

// The Error above for the file `path` given to `flag`, whose header spells its dtype `descr`
// (printable; "bool/uint8" where only the dtype read is known).
[[noreturn]] void refuse_dtype(const std::string& flag, const std::string& path, const std::string& descr,
                               InputDtypes accepted);

// read_npy and the header parser read bool and uint8 (as DType::u8) for --mask; a flag taking
// floats refuses them here, by refuse_dtype().
void require_accepted(const std::string& flag, const std::string& path, DType dtype, InputDtypes accepted);

// read() (a read or parse of the .npy file `path`) with its errors named by `flag`, as read_input()
// names them: a dtype outside `accepted` refused by refuse_dtype(), any other Error with "<flag>: "
// in front. read_input() and context-parallel attend's header reading both go through it.
template <class Read>
auto naming_input_errors(const std::string& flag, const std::string& path, InputDtypes accepted, Read&& read)
    -> decltype(read()) {
  try {
    return read();
  } catch (const detail::NpyDtypeError& e) {
    refuse_dtype(flag, path, e.descr, accepted);
  } catch (const Error& e) {
    throw Error(flag + ": " + e.what());
  }
}

}  // namespace attnscale::cli
