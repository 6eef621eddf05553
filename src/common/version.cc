#include "attnscale/version.h"

namespace attnscale {
const char* version() { return ATTNSCALE_VERSION_STRING; }
const char* git_hash() { return ATTNSCALE_GIT_HASH; }
}  // namespace attnscale

namespace attnscale {
// Engine v0 has one portable code path; SIMD dispatch reports its chosen target here.
const char* cpu_target() { return "baseline"; }
}  // namespace attnscale
