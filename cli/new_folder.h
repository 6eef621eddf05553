// A folder a command creates for its outputs (`report --out a/b/c`), with every parent it lacked,
// and taken back when the command fails: the folders it created go again, deepest first, each only
// while still empty, so a failed command leaves the filesystem as it was.
//
//   NewFolder folder("--out", "a/b/c");  // creates a, a/b, a/b/c where missing
//   try { write_into("a/b/c"); } catch (...) { folder.undo(); throw; }
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace attnscale::cli {

class NewFolder {
 public:
  // Creates `path` and its missing parents. Throws Error naming `flag` when it cannot: a file in
  // the way, no permission (whatever it created by then is taken back first).
  NewFolder(const std::string& flag, const std::string& path);

  // Removes the folders the constructor created, deepest first, stopping at the first that is no
  // longer empty (something else was put there since).
  void undo() noexcept;

 private:
  std::vector<std::filesystem::path> created_;  // outermost first
};

}  // namespace attnscale::cli
