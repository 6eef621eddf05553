// Output files: a path's new contents never replace a symbolic link or a device node by a regular
// file, and a failure before place() leaves the old file as it was.
#include "io/output_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "attnscale/error.h"
#include "fresh_folder.h"
#include "attnscale/npy.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
namespace fs = std::filesystem;

fs::path folder(const std::string& name) { return testing::fresh_folder("output_file_test", name); }

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::size_t entries(const fs::path& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

TEST(OutputFile, ASymlinkIsWrittenThroughAndStays) {
  const fs::path d = folder("symlink");
  fs::create_directories(d / "real");
  std::ofstream(d / "real" / "o.npy") << "OLD";
  fs::create_symlink("real/o.npy", d / "link.npy");  // relative to the link's folder
  const Tensor a = testing::random_tensor(DType::f32, {3, 4}, 1, 0);
  write_npy((d / "link.npy").string(), a.view());
  EXPECT_TRUE(fs::is_symlink(d / "link.npy"));
  EXPECT_EQ(read_npy((d / "real" / "o.npy").string()).view().shape_str(), "[3, 4]");
  EXPECT_EQ(entries(d), 2u);  // no temporary left beside the link
  EXPECT_EQ(entries(d / "real"), 1u);
  // A dangling link: its target is created, the link kept.
  fs::create_symlink("real/new.npy", d / "dangling.npy");
  write_npy((d / "dangling.npy").string(), a.view());
  EXPECT_TRUE(fs::is_symlink(d / "dangling.npy"));
  EXPECT_TRUE(fs::is_regular_file(d / "real" / "new.npy"));
  fs::remove_all(d);
}

TEST(OutputFile, AFifoIsWrittenInPlaceAndStaysAFifo) {
  const fs::path d = folder("fifo");
  const fs::path fifo = d / "o.npy";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const Tensor a = testing::random_tensor(DType::f64, {5, 2}, 2, 0);
  auto reader = std::async(std::launch::async, [&] { return slurp(fifo); });
  write_npy(fifo.string(), a.view());
  const std::string through_fifo = reader.get();
  write_npy((d / "copy.npy").string(), a.view());
  EXPECT_EQ(through_fifo, slurp(d / "copy.npy"));
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_EQ(entries(d), 2u);
  fs::remove_all(d);
}

TEST(OutputFile, AFifoWhoseReaderLeavesIsAnErrorNotASignal) {
  const fs::path d = folder("fifo_closed");
  const fs::path fifo = d / "o.npy";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // More than a pipe holds (64 KiB), so the write is still going when the reader closes.
  const Tensor a = testing::random_tensor(DType::f32, {1024, 256}, 3, 0);
  auto reader = std::async(std::launch::async, [&] { std::ifstream in(fifo, std::ios::binary); });
  try {
    write_npy(fifo.string(), a.view());
    ADD_FAILURE() << "the write succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), fifo.string() + ": write failed (Broken pipe)");
  }
  reader.get();
  EXPECT_TRUE(fs::is_fifo(fifo));
  fs::remove_all(d);
}

TEST(OutputFile, DirectoriesAndMissingFoldersAreRefusedBeforeWriting) {
  const fs::path d = folder("refused");
  fs::create_directories(d / "adir");
  const Tensor a = testing::random_tensor(DType::f32, {3}, 1, 0);
  const auto error = [&](const fs::path& p) -> std::string {
    try {
      write_npy(p.string(), a.view());
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(error(d / "adir"), (d / "adir").string() + ": is a directory, not a file");
  EXPECT_NE(error(d / "nodir" / "o.npy").find(": cannot write: no directory " + (d / "nodir").string()),
            std::string::npos);
  fs::create_symlink("adir", d / "dirlink");
  EXPECT_NE(error(d / "dirlink").find("is a directory (the link's target"), std::string::npos);
  fs::create_symlink("loop", d / "loop");
  EXPECT_NE(error(d / "loop").find("Too many levels of symbolic links"), std::string::npos);
  EXPECT_EQ(entries(d), 3u);
  EXPECT_TRUE(fs::is_directory(d / "adir") && fs::is_empty(d / "adir"));
  fs::remove_all(d);
}

TEST(OutputFile, NothingChangesUntilPlaced) {
  const fs::path d = folder("two_phase");
  const fs::path o = d / "o.npy";
  std::ofstream(o) << "OLD";
  ::chmod(o.c_str(), 0640);
  {
    detail::OutputFile staged(o.string(), "NEW");
    EXPECT_EQ(slurp(o), "OLD");
    EXPECT_EQ(entries(d), 2u);  // the temporary
  }  // dropped unplaced, as when a later output of the same command fails
  EXPECT_EQ(slurp(o), "OLD");
  EXPECT_EQ(entries(d), 1u);
  detail::OutputFile placed(o.string(), "NEW");
  placed.place();
  EXPECT_EQ(slurp(o), "NEW");
  EXPECT_EQ(fs::status(o).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write |
                                                              fs::perms::group_read);  // kept from the old file
  EXPECT_EQ(entries(d), 1u);
  fs::remove_all(d);
}

}  // namespace
}  // namespace attnscale
