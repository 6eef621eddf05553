// The bf16 product paths this CPU can run (portable and widened always; AVX-512 BF16 and AMX where present),
// for the tests that run every path.
#pragma once
#include <gtest/gtest.h>

#include <vector>

#include "attention/bf16_kernels.h"

namespace attnscale::testing {

inline std::vector<detail::bfdot::Path> usable_bf16_paths() {
  using detail::bfdot::Path;
  std::vector<Path> paths{Path::portable, Path::widened};
  if (detail::bfdot::avx512_bf16_usable()) paths.push_back(Path::avx512_bf16);
  if (detail::bfdot::amx_usable()) paths.push_back(Path::amx);
  return paths;
}

// fn() once per usable path, that path forced (bfdot::force_path) and named in the failures'
// trace; the best path is chosen again afterwards.
template <class F>
void for_each_bf16_path(F&& fn) {
  for (detail::bfdot::Path path : usable_bf16_paths()) {
    detail::bfdot::force_path(detail::bfdot::path_name(path));
    SCOPED_TRACE(detail::bfdot::path_name(path));
    fn();
  }
  detail::bfdot::force_path("");
}

}  // namespace attnscale::testing
