// Ring attention against the single-process kernels: run under `mpirun -np K` (K = 1..4), every
// rank builds the same global inputs, runs the ring on its shard, and compares its rows with the
// float64 reference (the kernels' own tolerances) and with the single-process fast kernel.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <string>
#include <vector>

#include "attnscale/distributed.h"
#include "attnscale/error.h"
#include "../unit/random_tensors.h"

namespace attnscale::distributed {
namespace {

using testing::random_tensor;
using testing::rel_error;

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int ranks() {
  int k = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &k);
  return k;
}

// The rows `segs` (dimension 2) of a C-order rank-3/4 tensor, concatenated.
Tensor take_rows(const Tensor& full, const std::vector<Segment>& segs) {
  std::int64_t n = 0;
  for (const auto& s : segs) n += s.length;
  const bool r4 = full.rank() == 4;
  const std::int64_t inner = r4 ? full.dim(3) : 1, N = full.dim(2), outer = full.dim(0) * full.dim(1);
  Tensor out = r4 ? Tensor(full.dtype(), {full.dim(0), full.dim(1), n, inner})
                  : Tensor(full.dtype(), {full.dim(0), full.dim(1), n});
  const std::size_t es = dtype_size(full.dtype());
  const char* src = static_cast<const char*>(full.data());
  char* dst = static_cast<char*>(out.data());
  for (std::int64_t o = 0; o < outer; ++o) {
    std::int64_t at = 0;
    for (const auto& s : segs) {
      std::memcpy(dst + ((o * n + at) * inner) * es, src + ((o * N + s.begin) * inner) * es, s.length * inner * es);
      at += s.length;
    }
  }
  return out;
}

struct Case {
  std::string name;
  std::int64_t B, Hq, Hkv, Nq, Nkv, dk, dv;
  bool causal;
  Align align;
  std::int64_t left, right;
  Sharding sharding;
  DType dtype = DType::f32;
};

class Ring : public ::testing::TestWithParam<Case> {};

TEST_P(Ring, ForwardAndBackwardMatchOneProcess) {
  const Case& c = GetParam();
  const int K = ranks(), r = rank();
  Options opt;
  opt.mask.causal = c.causal;
  opt.mask.align = c.align;
  opt.mask.window_left = c.left;
  opt.mask.window_right = c.right;
  const std::uint64_t seed = 1000 + c.Nq * 7 + c.Nkv;
  const Tensor q = random_tensor(c.dtype, {c.B, c.Hq, c.Nq, c.dk}, seed, 1);
  const Tensor k = random_tensor(c.dtype, {c.B, c.Hkv, c.Nkv, c.dk}, seed, 2);
  const Tensor v = random_tensor(c.dtype, {c.B, c.Hkv, c.Nkv, c.dv}, seed, 3);
  const Tensor dout = random_tensor(c.dtype, {c.B, c.Hq, c.Nq, c.dv}, seed, 4);

  // One process: the float64 reference and the fast kernel, on the whole sequence.
  Tensor ref_o(DType::f64, {c.B, c.Hq, c.Nq, c.dv}), ref_l(DType::f64, {c.B, c.Hq, c.Nq});
  Tensor ref_dq(DType::f64, {c.B, c.Hq, c.Nq, c.dk}), ref_dk(DType::f64, {c.B, c.Hkv, c.Nkv, c.dk}),
      ref_dv(DType::f64, {c.B, c.Hkv, c.Nkv, c.dv});
  reference::forward(q.view(), k.view(), v.view(), {ref_o.view(), ref_l.view()}, opt);
  reference::backward(q.view(), k.view(), v.view(), dout.view(), {ref_dq.view(), ref_dk.view(), ref_dv.view()}, opt);
  Tensor one_o(c.dtype, {c.B, c.Hq, c.Nq, c.dv});
  forward(q.view(), k.view(), v.view(), {one_o.view()}, opt);

  // The ring, on this rank's shard.
  const auto qs = shard(c.Nq, K, r, c.sharding), ks = shard(c.Nkv, K, r, c.sharding);
  const Tensor lq = take_rows(q, qs), lk = take_rows(k, ks), lv = take_rows(v, ks), ldo = take_rows(dout, qs);
  Tensor lo(c.dtype, {c.B, c.Hq, lq.dim(2), c.dv}), ll(c.dtype, {c.B, c.Hq, lq.dim(2)});
  testing::poison(lo);
  ring_forward(lq.view(), lk.view(), lv.view(), {lo.view(), ll.view()}, opt, MPI_COMM_WORLD, c.sharding);
  Tensor dq(c.dtype, {c.B, c.Hq, lq.dim(2), c.dk}), dk(c.dtype, {c.B, c.Hkv, lk.dim(2), c.dk}),
      dv(c.dtype, {c.B, c.Hkv, lk.dim(2), c.dv});
  testing::poison(dq);
  testing::poison(dk);
  testing::poison(dv);
  ring_backward(lq.view(), lk.view(), lv.view(), lo.view(), ll.view(), ldo.view(), {dq.view(), dk.view(), dv.view()},
                opt, MPI_COMM_WORLD, c.sharding);

  const std::string where = c.name + " rank " + std::to_string(r) + "/" + std::to_string(K);
  const double fwd_tol = c.dtype == DType::f64 ? 1e-12 : 1e-5, bwd_tol = c.dtype == DType::f64 ? 1e-11 : 1e-4;
  EXPECT_LE(rel_error(lo.view(), take_rows(ref_o, qs).view()), fwd_tol) << where;
  EXPECT_LE(rel_error(lo.view(), take_rows(one_o, qs).view()), 2 * fwd_tol) << where << " against the fast kernel";
  EXPECT_LE(rel_error(ll.view(), take_rows(ref_l, qs).view()), 1e-6) << where;
  EXPECT_LE(rel_error(dq.view(), take_rows(ref_dq, qs).view()), bwd_tol) << where;
  EXPECT_LE(rel_error(dk.view(), take_rows(ref_dk, ks).view()), bwd_tol) << where;
  EXPECT_LE(rel_error(dv.view(), take_rows(ref_dv, ks).view()), bwd_tol) << where;

  // Bitwise the same on a second run (fixed ring order).
  Tensor lo2(c.dtype, {c.B, c.Hq, lq.dim(2), c.dv}), dk2(c.dtype, {c.B, c.Hkv, lk.dim(2), c.dk}),
      dq2(c.dtype, {c.B, c.Hq, lq.dim(2), c.dk}), dv2(c.dtype, {c.B, c.Hkv, lk.dim(2), c.dv});
  ring_forward(lq.view(), lk.view(), lv.view(), {lo2.view()}, opt, MPI_COMM_WORLD, c.sharding);
  ring_backward(lq.view(), lk.view(), lv.view(), lo.view(), ll.view(), ldo.view(), {dq2.view(), dk2.view(), dv2.view()},
                opt, MPI_COMM_WORLD, c.sharding);
  EXPECT_EQ(std::memcmp(lo.data(), lo2.data(), lo.nbytes()), 0) << where;
  EXPECT_EQ(std::memcmp(dq.data(), dq2.data(), dq.nbytes()), 0) << where;
  EXPECT_EQ(std::memcmp(dk.data(), dk2.data(), dk.nbytes()), 0) << where;

  // With a gradient w.r.t. lse (Options::dlse): each block reads its rows' part.
  const Tensor dlse = random_tensor(c.dtype, {c.B, c.Hq, c.Nq}, seed, 5);
  Options with_dlse = opt;
  with_dlse.dlse = dlse.view();
  reference::backward(q.view(), k.view(), v.view(), dout.view(), {ref_dq.view(), ref_dk.view(), ref_dv.view()},
                      with_dlse);
  const Tensor ldlse = take_rows(dlse, qs);
  with_dlse.dlse = ldlse.view();
  ring_backward(lq.view(), lk.view(), lv.view(), lo.view(), ll.view(), ldo.view(), {dq.view(), dk.view(), dv.view()},
                with_dlse, MPI_COMM_WORLD, c.sharding);
  EXPECT_LE(rel_error(dq.view(), take_rows(ref_dq, qs).view()), bwd_tol) << where << " with dlse";
  EXPECT_LE(rel_error(dk.view(), take_rows(ref_dk, ks).view()), bwd_tol) << where << " with dlse";
  EXPECT_LE(rel_error(dv.view(), take_rows(ref_dv, ks).view()), bwd_tol) << where << " with dlse";
}

const Align TL = Align::top_left, BR = Align::bottom_right;
const Sharding C = Sharding::contiguous, Z = Sharding::zigzag;
INSTANTIATE_TEST_SUITE_P(
    Shapes, Ring,
    ::testing::Values(Case{"full", 2, 4, 2, 37, 37, 16, 8, false, TL, -1, -1, C},
                      Case{"full_zigzag_gqa", 1, 6, 2, 29, 29, 8, 24, false, TL, -1, -1, Z},
                      Case{"causal_zigzag", 1, 3, 1, 41, 41, 8, 24, true, TL, -1, -1, Z},
                      Case{"causal_contiguous", 2, 2, 2, 31, 31, 16, 16, true, TL, -1, -1, C},
                      Case{"causal_top_left_nq_ne_nkv", 1, 4, 2, 23, 41, 12, 5, true, TL, -1, -1, C},
                      Case{"causal_bottom_right_nq_ne_nkv", 1, 4, 2, 23, 41, 12, 5, true, BR, -1, -1, Z},
                      Case{"window", 1, 2, 1, 53, 53, 8, 8, false, TL, 7, 3, Z},
                      Case{"causal_window_bottom_right", 1, 2, 2, 50, 47, 16, 8, true, BR, 9, -1, C},
                      Case{"float64_causal", 1, 2, 1, 19, 19, 8, 8, true, TL, -1, -1, Z, DType::f64}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(RingErrors, ShapesThatDisagreeAcrossRanksThrowOnEveryRank) {
  if (ranks() < 2) GTEST_SKIP() << "needs two ranks";  // the K = 1 run checks the rest
  const std::int64_t dk = rank() == 1 ? 12 : 8;
  const Tensor q = random_tensor(DType::f32, {1, 2, 5, dk}, 1, 1), k = random_tensor(DType::f32, {1, 2, 5, dk}, 1, 2);
  const Tensor v = random_tensor(DType::f32, {1, 2, 5, 4}, 1, 3);
  Tensor o(DType::f32, {1, 2, 5, 4});
  try {
    ring_forward(q.view(), k.view(), v.view(), {o.view()}, {}, MPI_COMM_WORLD);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the ranks disagree on the attention: dk: 8 on rank 0, 12 on rank 1"),
              std::string::npos)
        << e.what();
  }
}

TEST(RingErrors, DisagreementsAreShownInTheUsersTerms) {
  if (ranks() < 2) GTEST_SKIP() << "needs two ranks";
  const Tensor q = random_tensor(DType::f32, {1, 1, 4, 8}, 1, 1), k = random_tensor(DType::f32, {1, 1, 4, 8}, 1, 2);
  Tensor o(DType::f32, {1, 1, 4, 8});
  Options options;
  options.scale = Scale::value(rank() == 1 ? 0.5 : 0.25);
  try {
    ring_forward(q.view(), k.view(), k.view(), {o.view()}, options, MPI_COMM_WORLD);
    FAIL() << "no error";
  } catch (const Error& e) {
    // The scale as a number, not its bits.
    EXPECT_NE(std::string(e.what()).find("the ranks disagree on the attention: scale: 0.25 on rank 0, 0.5 on rank 1"),
              std::string::npos)
        << e.what();
  }
}

TEST(RingErrors, AnErrorOnOneRankThrowsOnEveryRank) {
  const Tensor q = random_tensor(DType::f32, {1, 1, 4, 8}, 1, 1), k = random_tensor(DType::f32, {1, 1, 4, 8}, 1, 2);
  const Tensor v = random_tensor(DType::f32, {1, 1, 4, 8}, 1, 3);
  Tensor o(DType::f32, {1, 1, 4, 8});
  TensorView out = o.view();
  if (rank() == ranks() - 1) out.data = nullptr;
  try {
    ring_forward(q.view(), k.view(), v.view(), {out}, {}, MPI_COMM_WORLD);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string want = ranks() > 1 ? "rank " + std::to_string(ranks() - 1) + ": out: missing" : "out: missing";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(RingErrors, ShardsOfTheWrongSizeAreNamed) {
  if (ranks() < 2) GTEST_SKIP() << "needs two ranks";
  const std::int64_t n = rank() == 0 ? 9 : 3;
  const Tensor q = random_tensor(DType::f32, {1, 1, n, 8}, 1, 1), k = random_tensor(DType::f32, {1, 1, n, 8}, 1, 2);
  Tensor o(DType::f32, {1, 1, n, 8});
  EXPECT_THROW(ring_forward(q.view(), k.view(), k.view(), {o.view()}, {}, MPI_COMM_WORLD), Error);
}

TEST(Shard, RowsCoverTheSequenceOnceAndDifferByAtMostOne) {
  for (std::int64_t n : {1, 7, 8, 64, 97})
    for (int k : {1, 2, 3, 4})
      for (Sharding s : {C, Z}) {
        std::vector<int> seen(n, 0);
        std::int64_t lo = n, hi = 0;
        for (int r = 0; r < k; ++r) {
          for (const auto& seg : shard(n, k, r, s))
            for (std::int64_t i = seg.begin; i < seg.begin + seg.length; ++i) ++seen[i];
          lo = std::min(lo, shard_rows(n, k, r, s));
          hi = std::max(hi, shard_rows(n, k, r, s));
        }
        for (int x : seen) EXPECT_EQ(x, 1);
        EXPECT_LE(hi - lo, s == C ? 1 : 2);
      }
}

}  // namespace
}  // namespace attnscale::distributed

// MPI_THREAD_SERIALIZED (as the CLI asks): the ring drives its transfers from a progress thread;
// --mpi-thread-single: without threads, between blocks only.
int main(int argc, char** argv) {
  int level = MPI_THREAD_SERIALIZED, provided = 0;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--mpi-thread-single") level = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, level, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  MPI_Finalize();
  return failed;
}
