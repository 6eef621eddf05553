// allocate_block / release_block (common/memory.h): alignment, and the blocks of 128 KiB and more
// kept after release and handed out again for requests they hold with less than half to spare.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "common/memory.h"

namespace attnscale::detail {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

bool aligned(const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

TEST(Memory, SmallBlocksAreCacheLineAlignedKeptOnesOnPagesAndHugeOnesOn2MiB) {
  void* small = allocate_block(100);
  void* kept = allocate_block(200 * 1024);
  void* huge = allocate_block(5 * kMiB);
  ASSERT_NE(small, nullptr);
  ASSERT_NE(kept, nullptr);
  ASSERT_NE(huge, nullptr);
  EXPECT_TRUE(aligned(small, 64));
  EXPECT_TRUE(aligned(kept, 4096));
  EXPECT_TRUE(aligned(huge, 2 * kMiB));
  EXPECT_GE(block_capacity(small), 100u);
  EXPECT_GE(block_capacity(kept), 200 * 1024u);
  EXPECT_GE(block_capacity(huge), 5 * kMiB);
  std::memset(small, 1, block_capacity(small));  // all of it usable (the address sanitizer checks)
  std::memset(kept, 1, block_capacity(kept));
  std::memset(huge, 1, block_capacity(huge));
  release_block(small);
  release_block(kept);
  release_block(huge);
  release_block(nullptr);  // does nothing
}

TEST(Memory, BlocksFrom128KiBAreKeptAndSmallerOnesFreed) {
  free_kept_blocks();  // none kept by the tests before this one in the process
  void* small = allocate_block(128 * 1024 - 1);
  release_block(small);
  EXPECT_EQ(kept_block_bytes(), 0u);  // given back to malloc
  void* a = allocate_block(128 * 1024 + 1);  // 33 pages
  ASSERT_NE(a, nullptr);
  release_block(a);
  EXPECT_EQ(kept_block_bytes(), 132 * 1024u);
  void* b = allocate_block(200 * 1024);  // the kept block is too small: a new one
  EXPECT_NE(b, a);
  void* c = allocate_block(100 * 1024 + 1);  // not kept, so not the kept block
  EXPECT_NE(c, a);
  void* d = allocate_block(130 * 1024);  // the kept block, usable as a whole
  EXPECT_EQ(d, a);
  std::memset(d, 4, 130 * 1024);
  for (void* p : {b, c, d}) release_block(p);
  free_kept_blocks();
}

TEST(Memory, AReleasedHugeBlockServesTheNextRequestItHolds) {
  // None kept by the tests before this one in the process (a kept 6-8 MiB block would serve the
  // 6 MiB request below instead of the 10 MiB one).
  free_kept_blocks();
  EXPECT_EQ(kept_block_bytes(), 0u);
  void* a = allocate_block(9 * kMiB);  // 10 MiB rounded to whole 2 MiB pages
  ASSERT_NE(a, nullptr);
  release_block(a);
  void* b = allocate_block(9 * kMiB + 1);  // the same block
  EXPECT_EQ(b, a);
  release_block(b);
  void* c = allocate_block(4 * kMiB);  // less than half of it: a new block
  EXPECT_NE(c, a);
  void* d = allocate_block(6 * kMiB);  // the kept block again, and usable as a whole
  EXPECT_EQ(d, a);
  std::memset(d, 2, 6 * kMiB);
  void* e = allocate_block(20 * kMiB);  // larger than any kept block: a new one
  EXPECT_NE(e, a);
  for (void* p : {c, d, e}) release_block(p);
}

TEST(Memory, KeptBlocksAreBounded) {
  // 40 blocks of 10 MiB released in turn: at most 256 MiB stay kept, the oldest are freed (run
  // under the address sanitizer this also checks that every block is freed once).
  free_kept_blocks();  // none kept by the tests before this one in the process
  void* blocks[40];
  for (void*& p : blocks) p = allocate_block(10 * kMiB);
  for (void* p : blocks) release_block(p);
  EXPECT_EQ(kept_block_bytes(), 250 * kMiB);  // 25 of them
  for (void*& p : blocks) p = allocate_block(10 * kMiB);  // the 25 kept ones, then new ones
  EXPECT_EQ(kept_block_bytes(), 0u);
  for (void* p : blocks) release_block(p);
  free_kept_blocks();  // frees each kept block once (checked under the address sanitizer)
  EXPECT_EQ(kept_block_bytes(), 0u);
  void* again = allocate_block(10 * kMiB);  // a new block, usable
  std::memset(again, 3, 10 * kMiB);
  release_block(again);
}

}  // namespace
}  // namespace attnscale::detail
