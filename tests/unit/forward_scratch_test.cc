// forward_scratch_bytes (attention/forward_scratch.h): the route a shape takes and that route's
// scratch, on the sizes that change it (blocks of rows, V rows off 64-byte lines, the aligned
// copies' budget, long keys for few rows, the reference's score matrices), and the aligned copies
// measured against what a call allocates.
#include "attention/forward_scratch.h"

#include <gtest/gtest.h>

#include <string>

#include "attention/flash_forward.h"
#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "common/memory.h"
#include "random_tensors.h"

namespace attnscale::detail {
namespace {

ForwardShape shape(DType dtype, std::int64_t Nq, std::int64_t Nkv, std::int64_t dk, std::int64_t dv, int threads) {
  ForwardShape s;
  s.dtype = dtype;
  s.Nq = Nq, s.Nkv = Nkv, s.dk = dk, s.dv = dv, s.threads = threads;
  return s;
}

TEST(ForwardScratch, TiledForwardHoldsOneScratchAThread) {
  // 3 blocks of 64 rows: 2 threads; 1 block: 1 thread. V rows of 64 floats start on lines: no copy.
  const ForwardShape s = shape(DType::f32, 130, 77, 64, 64, 2);
  EXPECT_EQ(forward_scratch_bytes(s, Kernel::fast), 2.0 * ForwardScratch<float>::bytes(64, 64));
  EXPECT_EQ(forward_scratch_bytes(shape(DType::f32, 64, 77, 64, 64, 2), Kernel::fast),
            1.0 * ForwardScratch<float>::bytes(64, 64));
  EXPECT_EQ(forward_scratch_bytes(shape(DType::f64, 130, 77, 16, 8, 2), Kernel::fast),
            2.0 * ForwardScratch<double>::bytes(16, 8));
}

TEST(ForwardScratch, VRowsOffLinesAreCopiedWithinTheBudget) {
  // dv = 3 floats (12 bytes a row): each thread copies V's rows, 16 floats apart.
  ForwardShape s = shape(DType::f32, 256, 1000, 16, 3, 2);
  const double tiles = 2.0 * ForwardScratch<float>::bytes(16, 3);
  EXPECT_EQ(forward_scratch_bytes(s, Kernel::fast), tiles + 2 * 1000 * 16 * 4);
  s.window = true;  // each block reads a band: no copy
  EXPECT_EQ(forward_scratch_bytes(s, Kernel::fast), tiles);
  s.window = false;
  s.Nkv = 300000;  // 2 · 300000 · 64 bytes > 32 MiB: read in place
  EXPECT_EQ(forward_scratch_bytes(s, Kernel::fast), tiles);
  s.Nkv = 1000, s.Nq = 64;  // one block reads V once: no copy
  EXPECT_EQ(forward_scratch_bytes(s, Kernel::fast), 1.0 * ForwardScratch<float>::bytes(16, 3));
}

TEST(ForwardScratch, TheAlignedCopiesAreWhatACallAllocates) {
  // The copies are blocks of 512 KiB, released after the call and kept (memory.h): the bytes kept
  // grow by the estimate's copies, one per thread.
  const std::int64_t Nq = 256, Nkv = 8192, dk = 16, dv = 3;
  const Tensor q = testing::random_tensor(DType::f32, {1, 1, Nq, dk}, 7, 1),
               k = testing::random_tensor(DType::f32, {1, 1, Nkv, dk}, 7, 2),
               v = testing::random_tensor(DType::f32, {1, 1, Nkv, dv}, 7, 3);
  Tensor out(DType::f32, {1, 1, Nq, dv});
  Options o;
  o.threads = 1;  // one thread takes every block
  free_kept_blocks();
  forward(q.view(), k.view(), v.view(), {out.view()}, o);
  const ForwardShape s = shape(DType::f32, Nq, Nkv, dk, dv, 1);
  const double copies = forward_scratch_bytes(s, Kernel::fast) - ForwardScratch<float>::bytes(dk, dv);
  EXPECT_EQ(copies, Nkv * 16 * 4);
  EXPECT_EQ(static_cast<double>(kept_block_bytes()), copies);
}

TEST(ForwardScratch, FewRowsOverLongKeysHoldTheChunksPartials) {
  // float64, 1 row, 4096 keys: the split-key decode, 4 chunks of 1024 keys (one KV head): a
  // thread's scratch for each of 2 threads, 4 partials of dv + 2 values, one merging thread's row.
  const ForwardShape s = shape(DType::f64, 1, 4096, 32, 16, 2);
  EXPECT_TRUE(uses_split_decode(s));
  EXPECT_EQ(forward_scratch_bytes(s, Kernel::fast),
            2.0 * ForwardScratch<double>::bytes(32, 16) + 4 * 18 * 8 + 18 * 8);
  // float32 takes the KV-cache decode there, whose scratch is not counted.
  EXPECT_TRUE(cache_route_pays(shape(DType::f32, 1, 4096, 32, 16, 2)));
  EXPECT_EQ(forward_scratch_bytes(shape(DType::f32, 1, 4096, 32, 16, 2), Kernel::fast), 0.0);
  ForwardShape with_mask = shape(DType::f32, 1, 4096, 32, 16, 2);
  with_mask.mask = true;  // the KV-cache decode takes no mask tensor: the split-key decode
  EXPECT_EQ(forward_scratch_bytes(with_mask, Kernel::fast),
            2.0 * ForwardScratch<float>::bytes(32, 16) + 4 * 18 * 4 + 18 * 4);
  ForwardShape probs = s;
  probs.probs = true;  // probabilities need the tiles
  EXPECT_FALSE(uses_split_decode(probs));
  EXPECT_EQ(forward_scratch_bytes(probs, Kernel::fast), 1.0 * ForwardScratch<double>::bytes(32, 16));
}

TEST(ForwardScratch, TheReferenceHoldsOneHeadsScoreMatrices) {
  // P, 1 − tanh² and the dropout factors in float64, the visibility flags: 25 bytes a score; lse.
  EXPECT_EQ(forward_scratch_bytes(shape(DType::f32, 7, 11, 4, 4, 2), Kernel::reference), 25.0 * 7 * 11 + 8 * 7);
  EXPECT_EQ(reference_scratch_bytes(1, 1), 33.0);
  try {
    check_reference_scratch(1000000, 1000000);
    FAIL() << "not refused";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("reference: one head's 1000000 x 1000000 score matrix needs 22.7 TiB, more than", 0),
              0u)
        << e.what();
  }
}

}  // namespace
}  // namespace attnscale::detail
