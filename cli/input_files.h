// Reading a .npy input named by a flag: every error says which flag's file it is.
//
// read_npy() knows only the path, so its messages start with it ("k.npy: unsupported dtype ...").
// Given on the command line, the same file can be behind several flags (--k and --v), and a user
// who typed --q x.npy looks for --q in the message; context-parallel attend already says
// "--q: x.npy: ...". Every subcommand reads its input files here.
#pragma once
#include <string>

#include "attnscale/tensor.h"

namespace attnscale::cli {

// read_npy(path); an Error it throws comes back as Error("<flag>: <its message>").
Tensor read_input(const std::string& flag, const std::string& path);

}  // namespace attnscale::cli
