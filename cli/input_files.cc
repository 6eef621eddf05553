#include "input_files.h"

#include "attnscale/error.h"
#include "attnscale/npy.h"

namespace attnscale::cli {

Tensor read_input(const std::string& flag, const std::string& path) {
  try {
    return read_npy(path);
  } catch (const Error& e) {
    throw Error(flag + ": " + e.what());
  }
}

}  // namespace attnscale::cli
