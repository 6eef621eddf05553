// .npy round trips and every malformed file named in one clear error.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "attnscale/error.h"
#include "attnscale/npy.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("attnscale_npy_test_" + name)).string();
}

void write_raw(const std::string& path, const std::string& header_dict, std::size_t data_bytes, int version = 1) {
  std::string h = header_dict;
  const std::size_t pre = version == 1 ? 10 : 12;
  h.append((64 - (pre + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY", 6);
  out.put(static_cast<char>(version));
  out.put(0);
  out.put(static_cast<char>(h.size() & 0xff));
  out.put(static_cast<char>(h.size() >> 8));
  if (version != 1) out.write("\0\0", 2);
  out << h << std::string(data_bytes, '\0');
}

std::string error_of(const std::string& path) {
  try {
    read_npy(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Npy, RoundTripEveryDtypeAndRank) {
  for (DType t : {DType::f32, DType::f64, DType::u8}) {
    const Tensor a = testing::random_tensor(t, {2, 3, 5, 7}, 3, 0);
    const std::string p = temp_path("roundtrip.npy");
    write_npy(p, a.view());
    const Tensor b = read_npy(p);
    ASSERT_EQ(b.dtype(), t);
    ASSERT_EQ(b.view().shape_str(), "[2, 3, 5, 7]");
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes()));
    fs::remove(p);
  }
  const Tensor r1 = testing::random_tensor(DType::f32, {5}, 3, 0);
  write_npy(temp_path("r1.npy"), r1.view());
  EXPECT_EQ(read_npy(temp_path("r1.npy")).view().shape_str(), "[5]");
}

TEST(Npy, StridedViewIsWrittenInCOrder) {
  Tensor a = testing::random_tensor(DType::f64, {4, 6}, 2, 0);
  // Transposed view [6, 4].
  const TensorView t = TensorView::strided(a.data(), DType::f64, {6, 4}, {1, 6});
  write_npy(temp_path("t.npy"), t);
  const Tensor b = read_npy(temp_path("t.npy"));
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(b.as<double>()[i * 4 + j], a.as<double>()[j * 6 + i]);
}

TEST(Npy, Version2HeaderIsRead) {
  write_raw(temp_path("v2.npy"), "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", 24, 2);
  EXPECT_EQ(read_npy(temp_path("v2.npy")).view().shape_str(), "[3]");
}

TEST(Npy, AMinorVersionNumpyDoesNotWriteIsRefused) {
  // Before, version 1.5 was read as 1.0: a format this reader cannot know to be the same.
  const std::string p = temp_path("v15.npy");
  write_raw(p, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", 24);
  {
    std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(7);
    f.put(5);
  }
  EXPECT_EQ(error_of(p), p + ": unsupported .npy format version 1.5");
}

TEST(Npy, BadFilesNameTheProblem) {
  const std::string p = temp_path("bad.npy");
  EXPECT_NE(error_of(temp_path("does_not_exist.npy")).find("cannot open file"), std::string::npos);
  { std::ofstream(p, std::ios::binary); }
  EXPECT_EQ(error_of(p), p + ": empty file, not a .npy array");
  { std::ofstream(p, std::ios::binary) << "PK\x03\x04 this is a zip file"; }
  EXPECT_EQ(error_of(p), p + ": not a .npy file (bad magic string)");
  write_raw(p, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8);
  EXPECT_NE(error_of(p).find("big-endian"), std::string::npos);
  write_raw(p, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16);
  EXPECT_NE(error_of(p).find("Fortran-order"), std::string::npos);
  write_raw(p, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", 16);
  EXPECT_NE(error_of(p).find("unsupported dtype '<i8'"), std::string::npos);
  write_raw(p, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }", 60);
  EXPECT_EQ(error_of(p), p + ": header promises 64 data bytes but the file holds 60 (truncated)");
  write_raw(p, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 20);
  EXPECT_EQ(error_of(p), p + ": header promises 16 data bytes but the file holds 20");
  write_raw(p, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4);
  EXPECT_NE(error_of(p).find("rank 1..4"), std::string::npos);
  write_raw(p, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1), }", 4);
  EXPECT_NE(error_of(p).find("rank 1..4"), std::string::npos);
  write_raw(p, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999, 99999999999999), }", 4);
  EXPECT_NE(error_of(p).find("shape too large"), std::string::npos);
  write_raw(p, "{'descr': '<f4', 'shape': (2,), }", 8);
  EXPECT_NE(error_of(p).find("fortran_order"), std::string::npos);
  fs::remove(p);
}

TEST(Npy, BigEndianAdviceKeepsTheWidthAndNulsInDescrAreShown) {
  const std::string p = temp_path("descr.npy");
  write_raw(p, "{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }", 16);
  EXPECT_NE(error_of(p).find("arr.astype('<f8')"), std::string::npos) << error_of(p);
  using namespace std::string_literals;
  write_raw(p, "{'descr': '<f\0x', 'fortran_order': False, 'shape': (2,), }"s, 8);
  EXPECT_EQ(error_of(p), p + ": unsupported dtype '<f\\x00x' (expected float32 '<f4', float64 '<f8', bool or uint8)");
  fs::remove(p);
}

// The header and data of a file write_npy wrote.
std::pair<std::string, std::string> header_and_data(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t len = static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8;
  return {bytes.substr(10, len), bytes.substr(10 + len)};
}

TEST(Npy, IntegerAndHalfViewsAreWrittenWithTheirOwnDescr) {
  const std::string p = temp_path("dtypes.npy");
  std::int32_t i32[3] = {1, -2, 70000};
  std::int8_t i8[3] = {1, -2, 3};
  f16 h[3] = {to_f16(1.0f), to_f16(-2.5f), to_f16(0.0f)};
  const struct {
    TensorView view;
    const char* descr;
    const void* data;
    std::size_t bytes;
  } cases[] = {{TensorView::contiguous(i32, DType::i32, {3}), "'<i4'", i32, sizeof i32},
               {TensorView::contiguous(i8, DType::i8, {3}), "'|i1'", i8, sizeof i8},
               {TensorView::contiguous(h, DType::f16, {3}), "'<f2'", h, sizeof h}};
  for (const auto& c : cases) {
    write_npy(p, c.view);
    const auto [header, data] = header_and_data(p);
    EXPECT_NE(header.find(std::string("'descr': ") + c.descr), std::string::npos) << header;
    EXPECT_NE(header.find("'shape': (3,)"), std::string::npos) << header;
    ASSERT_EQ(data.size(), c.bytes) << c.descr;
    EXPECT_EQ(0, std::memcmp(data.data(), c.data, c.bytes)) << c.descr;
  }
  fs::remove(p);
}

TEST(Npy, RanksOutsideOneToFourAreRefusedWithoutWritingOrReadingPastTheShape) {
  const std::string p = temp_path("rank.npy");
  float x[4] = {};
  TensorView scalar;
  scalar.data = x;
  scalar.rank = 0;
  TensorView five = TensorView::contiguous(x, DType::f32, {1, 1, 1, 4});
  five.rank = 5;  // shape holds 4 dimensions: nothing may read a fifth
  for (const auto& [view, words] : {std::pair{scalar, "rank 0"}, std::pair{five, "rank 5"}}) {
    try {
      write_npy(p, view);
      ADD_FAILURE() << words << " was written";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), p + ": cannot write an array of " + words + " (ranks 1 to 4 are written)");
    }
    EXPECT_FALSE(fs::exists(p));
  }
}

TEST(Npy, FailedWriteLeavesNoFile) {
  const Tensor a = testing::random_tensor(DType::f32, {3}, 1, 0);
  const std::string p = temp_path("no_such_dir/sub/out.npy");
  EXPECT_THROW(write_npy(p, a.view()), Error);
  EXPECT_FALSE(fs::exists(p));
}

}  // namespace
}  // namespace attnscale

namespace attnscale {
namespace {

// Found by npy_fuzz: a zero dimension after dimensions whose product alone is too large. The array
// is empty (numpy writes such files) and must read as such, not fail as "too large".
TEST(Npy, ZeroDimensionAfterHugeOnesIsEmpty) {
  const std::string p = temp_path("zero_after_huge.npy");
  write_raw(p, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000, 100, 0), }", 0);
  const Tensor t = read_npy(p);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.view().shape_str(), "[1000000, 1000000, 100, 0]");
  fs::remove(p);
}

}  // namespace
}  // namespace attnscale
