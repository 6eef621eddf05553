// attnscale/version.h: the library version.
#pragma once

#define ATTNSCALE_VERSION_MAJOR 0
#define ATTNSCALE_VERSION_MINOR 1
#define ATTNSCALE_VERSION_PATCH 0
#define ATTNSCALE_VERSION_STRING "0.1.0"

namespace attnscale {
const char* version();   // "0.1.0"
const char* git_hash();  // the commit the library was built from, or "unknown"
}  // namespace attnscale

namespace attnscale {
// The SIMD target the fast kernels dispatch to on this CPU (e.g. "AVX3", "AVX2", "baseline").
const char* cpu_target();
}  // namespace attnscale
