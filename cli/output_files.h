// Output files that appear together or not at all.
//
// Each file is written to a temporary name and renamed (write_npy); if a later file of the same
// command fails, the ones already placed are removed, so a failed command leaves no output.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "attnscale/npy.h"

namespace attnscale::cli {

class OutputFiles {
 public:
  void write_npy(const std::string& path, const TensorView& view) {
    attnscale::write_npy(path, view);
    placed_.push_back(path);
  }
  void commit() { placed_.clear(); }
  ~OutputFiles() {
    for (const auto& p : placed_) std::remove(p.c_str());
  }

 private:
  std::vector<std::string> placed_;
};

}  // namespace attnscale::cli
