// Output files that appear together or not at all, each in a file of its own.
//
// Before anything is read, require_own_paths refuses an output path given twice (`--out x.npy
// --lse x.npy` would keep only the last write) or naming an input (`--out q.npy` would replace it),
// and require_writable refuses a path that cannot be written (a missing or unwritable directory,
// a directory), so that such a mistake fails in a second and before any file is touched.
//
// OutputFiles writes in two phases (io/output_file.h): add() writes each output to a temporary
// file beside its target, and a failure there (a full disk) leaves every existing file as it was;
// place() then puts them all in place: first the outputs written in place (a FIFO or device at
// the path, whose writes can fail), then the renames of the rest. Symbolic links are followed:
// the link stays and its target gets the output. Only a failure of place() itself can leave a
// command half done: outputs it had created are then removed, while files it had already renamed
// over an existing file keep the new contents (the old ones are gone); the error names the output
// that failed.
#pragma once
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "attnscale/error.h"
#include "attnscale/tensor.h"
#include "io/npy_header.h"
#include "io/output_file.h"

namespace attnscale::cli {

// (flag, path) pairs; an empty path is a flag not given.
using PathFlags = std::vector<std::pair<const char*, std::string>>;

// The file `path` names, whatever its spelling: absolute, with the symbolic links of its existing
// part followed (x.npy, ./x.npy and link-to-this-folder/x.npy alike). "" (not given) stays "".
inline std::string canonical_path(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return path;
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return path;
  const fs::path canonical = fs::weakly_canonical(absolute, ec);
  return (ec ? absolute.lexically_normal() : canonical).string();
}

// A path as a message shows it: as given, then the file it names when that is spelt otherwise
// ("x.npy (/data/run/x.npy)"), for ranks whose paths are compared by canonical_path.
inline std::string shown_path(const std::string& path) {
  const std::string canonical = canonical_path(path);
  return canonical == path ? path : path + " (" + canonical + ")";
}

// The same file: the same existing file (hard links, ./x and x), or the same canonical path.
inline bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
  return canonical_path(a) == canonical_path(b);
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

// Each output path given can be written (detail::output_target); else an Error naming its flag.
inline void require_writable(const PathFlags& outputs) {
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    try {
      detail::output_target(path);
    } catch (const Error& e) {
      throw Error(std::string(flag) + ": " + e.what());
    }
  }
}

class OutputFiles {
 public:
  // Writes `bytes` to a temporary for `path` (or keeps them for a path written in place).
  void add(const char* flag, const std::string& path, std::string bytes) {
    try {
      files_.emplace_back(flag, detail::OutputFile(path, std::move(bytes)));
    } catch (const Error& e) {
      throw Error(std::string(flag) + ": " + e.what());
    }
  }
  void add_npy(const char* flag, const std::string& path, const TensorView& view) {
    std::string bytes;
    try {
      bytes = detail::npy_file_bytes(view);
    } catch (const Error& e) {
      throw Error(std::string(flag) + ": " + path + ": " + e.what());
    }
    add(flag, path, std::move(bytes));
  }

  // Puts every output in place: in-place ones first, then the renames.
  void place() {
    std::vector<std::size_t> order;
    for (const bool in_place : {true, false})
      for (std::size_t i = 0; i < files_.size(); ++i)
        if (files_[i].second.in_place() == in_place) order.push_back(i);
    for (std::size_t k = 0; k < order.size(); ++k) {
      auto& [flag, file] = files_[order[k]];
      try {
        file.place();
      } catch (const Error& e) {
        for (std::size_t j = 0; j < k; ++j) files_[order[j]].second.remove_if_new();
        throw Error(std::string(flag) + ": " + e.what());
      }
    }
  }

 private:
  std::vector<std::pair<const char*, detail::OutputFile>> files_;
};

}  // namespace attnscale::cli
