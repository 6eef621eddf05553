// Output files that appear together or not at all, each in a file of its own.
//
// Each file is written to a temporary name and renamed (write_npy); if a later file of the same
// command fails, the ones already placed are removed, so a failed command leaves no output.
// Before anything is read, require_own_paths refuses an output path given twice (`--out x.npy
// --lse x.npy` would keep only the last write) or naming an input (`--out q.npy` would replace it).
#pragma once
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "attnscale/error.h"
#include "attnscale/npy.h"

namespace attnscale::cli {

// (flag, path) pairs; an empty path is a flag not given.
using PathFlags = std::vector<std::pair<const char*, std::string>>;

// The same file: the same existing file (hard links, ./x and x), or the same normalised path.
inline bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
  return fs::weakly_canonical(fs::absolute(a, ec), ec) == fs::weakly_canonical(fs::absolute(b, ec), ec);
}

inline void require_own_paths(const PathFlags& outputs, const PathFlags& inputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& [flag, path] = outputs[i];
    if (path.empty()) continue;
    for (const auto& [in_flag, in_path] : inputs)
      if (!in_path.empty() && same_file(path, in_path))
        throw Error(std::string(flag) + ": '" + path + "' is also the input " + in_flag +
                    " (write the output to another file)");
    for (std::size_t j = 0; j < i; ++j)
      if (!outputs[j].second.empty() && same_file(path, outputs[j].second))
        throw Error(std::string(flag) + ": '" + path + "' is also " + outputs[j].first +
                    "'s file (give each output its own path)");
  }
}

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
