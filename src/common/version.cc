#include "attnscale/version.h"

namespace attnscale {
const char* version() { return ATTNSCALE_VERSION_STRING; }
const char* git_hash() { return ATTNSCALE_GIT_HASH; }
}  // namespace attnscale
