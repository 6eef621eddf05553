// place_files (report/placement.h): a folder's new files placed all or none. A rename made to fail
// by a folder at a file's path (which no rename replaces, root or not) undoes every step before it.
#include "report/placement.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "attnscale/error.h"
#include "fresh_folder.h"

namespace attnscale::report {
namespace {
namespace fs = std::filesystem;

fs::path folder(const std::string& name) { return testing::fresh_folder("placement_test", name); }

void put(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// Every entry under `dir` (relative path → contents; "/" for a folder).
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    out[fs::relative(e.path(), dir).string()] =
        e.is_directory() ? "/" : std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

// A staging folder beside `dir` (the report's is inside it; either is on dir's filesystem) with a
// report's files: two data files, a figure, report.md and index.html.
const std::vector<fs::path> kFiles = {"data/a.csv", "data/a.json", "figures/f.svg", "report.md", "index.html"};
fs::path stage(const fs::path& dir) {
  const fs::path staging = folder(dir.filename().string() + "_staging");
  for (const fs::path& f : kFiles) put(staging / f, "new " + f.string());
  return staging;
}

// place_files's Error over kFiles, "" when it placed them.
std::string placing_error(const fs::path& staging, const fs::path& dir) {
  try {
    place_files(staging, dir, kFiles);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ReportPlacement, PlacesEveryFileOverEarlierOnesAndKeepsOthers) {
  const fs::path d = folder("places");
  put(d / "report.md", "old report.md");
  put(d / "data" / "a.csv", "old data/a.csv");
  put(d / "notes.txt", "the user's");
  const fs::path staging = stage(d);
  EXPECT_EQ(placing_error(staging, d), "");
  for (const fs::path& f : kFiles) EXPECT_EQ(tree(d)[f.string()], "new " + f.string()) << f;
  EXPECT_EQ(tree(d)["notes.txt"], "the user's");
  EXPECT_EQ(tree(staging / ".replaced"),
            (std::map<std::string, std::string>{{"data", "/"}, {"data/a.csv", "old data/a.csv"}, {"report.md", "old report.md"}}));
  fs::remove_all(d);
  fs::remove_all(staging);
}

// The last rename fails: the files placed before it (one over an earlier file) are taken back,
// the earlier file returns, the folders made for them go.
TEST(ReportPlacement, AFailedRenameUndoesEveryStepBeforeIt) {
  const fs::path d = folder("undo");
  put(d / "report.md", "old report.md");
  put(d / "notes.txt", "the user's");
  put(d / "index.html" / "occupied", "");  // a folder where index.html must go
  const fs::path staging = stage(d);
  const auto before = tree(d), staged = tree(staging);
  EXPECT_EQ(placing_error(staging, d), (d / "index.html").string() + ": Is a directory");
  EXPECT_EQ(tree(d), before);  // data/ and figures/ gone, report.md the old one
  auto back = tree(staging);
  back.erase(".replaced");  // empty again: the old report.md went back
  EXPECT_EQ(back, staged);
  fs::remove_all(d);
  fs::remove_all(staging);
}

// A folder that cannot be made (a file in its way) fails before anything of it is placed; the
// files placed before it are taken back all the same.
TEST(ReportPlacement, AFolderThatCannotBeMadeUndoesTheFilesBeforeIt) {
  const fs::path d = folder("parents");
  put(d / "figures", "a file named figures");
  const fs::path staging = stage(d);
  const auto before = tree(d), staged = tree(staging);
  const std::string error = placing_error(staging, d);
  EXPECT_EQ(error.rfind((d / "figures" / "f.svg").string() + ": ", 0), 0u) << error;
  EXPECT_EQ(tree(d), before);
  EXPECT_EQ(tree(staging), staged);
  fs::remove_all(d);
  fs::remove_all(staging);
}

}  // namespace
}  // namespace attnscale::report
