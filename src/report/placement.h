// A folder's new files put in place all together or not at all (`report --out DIR`).
//
// The files are first written whole into a staging folder inside DIR (same filesystem, so each can
// be renamed); place_files then renames each onto its path in DIR. A file already at that path is
// first moved aside into the staging folder (rename(2) onto it would drop it), and a missing
// folder of DIR (figures/, data/) is created. When any step fails, every step done is undone in
// reverse: placed files go back to the staging folder, files moved aside come back, created
// folders are removed, so DIR is left as it was as far as rename(2) can take a step back. A folder
// found at a file's path is never moved: the rename onto it fails and the placing is undone.
//
//   place_files(dir / ".report.tmp", dir, {"data/variance.csv", "report.md", "index.html"});
#pragma once
#include <filesystem>
#include <vector>

namespace attnscale::report {

// Moves staging/f to dir/f for each f (relative paths, in order). Throws Error "<dir/f>: <reason>"
// naming the path that failed, after undoing every step. Files moved aside stay in
// staging/.replaced/ on success, for the caller to remove with the staging folder.
void place_files(const std::filesystem::path& staging, const std::filesystem::path& dir,
                 const std::vector<std::filesystem::path>& files);

}  // namespace attnscale::report
