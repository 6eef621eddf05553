// The library names its arguments as C++ does ("q: ...", "cu_seqlens_q: ...", "q, k, v: dtypes
// differ"); the command line promises the flag ("--q: ...", "--cu-seqlens-q: ..."). Messages of
// the library calls a subcommand makes are rewritten here, the one table of the two spellings.
#pragma once
#include <string>

#include "attnscale/error.h"

namespace attnscale::cli {

// `message` with its leading argument names ("q" or "k, v" before the first ':') spelt as flags,
// when every one of them is a flag's; otherwise unchanged.
std::string with_flag_names(const std::string& message);

// Runs `call` (a library call on the flags' values); an Error it throws names the flags.
template <class F>
void naming_flags(F&& call) {
  try {
    call();
  } catch (const Error& e) {
    throw Error(with_flag_names(e.what()));
  }
}

}  // namespace attnscale::cli
