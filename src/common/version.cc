#include "attnscale/version.h"

#include "attnscale_git_hash.h"  // generated at build time (cmake/git_hash.cmake)

#include "attention/kernels.h"

namespace attnscale {
const char* version() { return ATTNSCALE_VERSION_STRING; }
const char* git_hash() { return ATTNSCALE_GIT_HASH; }
}  // namespace attnscale

namespace attnscale {
// The Highway target the dispatched kernels run on ("AVX3", "AVX2", "EMU128"), after
// $ATTNSCALE_TARGET is applied.
const char* cpu_target() { return detail::simd::target_name(); }
}  // namespace attnscale
