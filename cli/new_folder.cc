#include "new_folder.h"

#include <fmt/format.h>

#include "attnscale/error.h"

namespace attnscale::cli {

namespace fs = std::filesystem;

NewFolder::NewFolder(const std::string& flag, const std::string& path) {
  // The missing ones among the path's prefixes, as given ("a", "a/b", "a/b/c"): what
  // create_directories makes. "." and ".." name folders that exist whenever their prefix does.
  std::error_code ec;
  fs::path prefix;
  for (const fs::path& part : fs::path(path)) {
    prefix /= part;
    if (part.empty() || part == "." || part == ".." || part == prefix.root_path()) continue;
    if (!fs::exists(prefix, ec)) created_.push_back(prefix);
  }
  if (fs::exists(path, ec) && !fs::is_directory(path, ec))
    throw Error(fmt::format("{}: {} exists and is not a folder", flag, path));
  fs::create_directories(path, ec);
  if (ec) {
    undo();
    throw Error(fmt::format("{}: cannot create {}: {}", flag, path, ec.message()));
  }
}

void NewFolder::undo() noexcept {
  std::error_code ec;
  for (auto it = created_.rbegin(); it != created_.rend(); ++it)
    if (!fs::remove(*it, ec)) break;  // only an empty folder is removed (rmdir)
  created_.clear();
}

}  // namespace attnscale::cli
