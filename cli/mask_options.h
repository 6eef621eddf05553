// The attention flags shared by `attend` and `explain`: --scale, --causal, --window, --align,
// --mask. Registered once, turned into attnscale::Options once.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "attnscale/attention.h"
#include "attnscale/tensor.h"

namespace attnscale::cli {

struct MaskFlags {
  std::string scale = "sqrt";
  std::string causal;  // "", "top-left", "bottom-right"
  std::vector<std::int64_t> window;  // empty, or {L, R}
  std::string align;   // "", "top-left", "bottom-right"
  std::string mask_path;
  int threads = 0;

  void add_to(CLI::App& app, bool with_mask_file = true);
  // Builds Options; `mask_storage` keeps a loaded --mask array alive. Throws Error on bad values.
  Options options(Tensor& mask_storage) const;
};

}  // namespace attnscale::cli
