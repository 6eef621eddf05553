// attnscale/error.h: the one exception type the library throws for bad input.
#pragma once
#include <stdexcept>
#include <string>

namespace attnscale {

// Thrown at the public API for invalid arguments, shapes or files. The message names the
// argument and, where shapes are involved, the shapes seen, e.g.
//   "k: shape [1, 3, 5, 64] does not match q's batch 2 (k must be [B, Hkv, Nkv, dk])".
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& what) : std::invalid_argument(what) {}
};

}  // namespace attnscale
