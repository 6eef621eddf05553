// The bf16 forward (bfloat16 products, float32 accumulation) on every bf16 path this CPU runs,
// against the float64 reference: relative error <= 1e-2, for bf16 inputs and for float32 inputs
// with Options::compute = bf16; and the run-time detection of AMX and AVX-512 BF16.
#include <gtest/gtest.h>
#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attention/bf16_kernels.h"
#include "attention/kernels.h"
#include "attention/peak_loops.h"
#include "common/cpu_model.h"
#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "bf16_paths.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using detail::bfdot::Path;
using testing::poison;
using testing::random_tensor;
using testing::rel_error;
using testing::value_at;

// round_bits (the float32 inputs' rounding when packed) gives round_to_bf16's bits for every
// kind of value: ties both ways, subnormals, infinities, NaNs of every payload, random bit patterns;
// an odd length, so that the vector loop and its tail both run.
TEST(Bf16, RoundBitsMatchesRoundToBf16) {
  std::vector<std::uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00008000u, 0x00018000u,
                                     0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
                                     0xff800000u, 0x7f800001u, 0x7fc00000u, 0xffffffffu, 0x7fbfffffu, 0x7f808000u};
  std::uint32_t x = 2463534242u;
  while (bits.size() < 1037) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    bits.push_back(x);
  }
  std::vector<float> values(bits.size());
  std::memcpy(values.data(), bits.data(), bits.size() * 4);
  std::vector<std::uint16_t> got(values.size());
  detail::bfdot::round_bits(values.data(), values.size(), got.data());
  for (std::size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(got[i], detail::bfdot::round_to_bf16(values[i])) << std::hex << bits[i];
}

// The widened path's GEMM against the portable loop, on every SIMD target: products of bf16 values
// are exact in float32, both sum each element's products in k order and both finish an element by
// the same multiplies and adds (not fused: -ffp-contract=off), so every mode gives the same bits,
// with output scales of 1 and not. Sizes cross the 6-row and 16/32-column tiles' edges, with row and
// column strides larger than the operands.
TEST(Bf16, WidenedGemmMatchesPortableLoop) {
  const Tensor pool = random_tensor(DType::bf16, {1 << 16}, 41, 0, 1.0, testing::Draw::bulk);
  const Tensor scales = random_tensor(DType::f32, {128}, 42, 0, 1.0, testing::Draw::one);
  const auto* bits = reinterpret_cast<const std::uint16_t*>(pool.as<bf16>());
  for (const std::string& target : detail::simd::available_targets()) {
    detail::simd::force_target(target);
    for (std::size_t M : {1, 5, 6, 7, 13, 64})
      for (std::size_t N : {1, 7, 16, 17, 33, 130})
        for (std::size_t K : {32, 64, 160})
          for (int mode : {0, 1, 2}) {
            const std::size_t lda = K + 32, ldb = (N + 15) / 16 * 16 + 16, ldc = N + 3;
            std::vector<std::uint16_t> A((M + 15) / 16 * 16 * lda), B(K / 2 * ldb * 2);  // A padded to 16 rows
            for (std::size_t i = 0; i < A.size(); ++i) A[i] = bits[(7 * i + M) % pool.numel()];
            for (std::size_t i = 0; i < B.size(); ++i) B[i] = bits[(11 * i + N + K) % pool.numel()];
            std::vector<float> c0(M * ldc), c1;
            for (std::size_t i = 0; i < c0.size(); ++i) c0[i] = scales.as<float>()[i % 128];
            c1 = c0;
            const float out_scale = mode == 0 ? 0.125f : K == 64 ? 1.0f : 0.3062f;
            const float* rs = mode == 2 ? scales.as<float>() : nullptr;
            detail::bfdot::gemm(Path::portable, M, N, K, A.data(), lda, B.data(), ldb, c0.data(), ldc, mode, rs,
                                out_scale);
            detail::bfdot::gemm(Path::widened, M, N, K, A.data(), lda, B.data(), ldb, c1.data(), ldc, mode, rs,
                                out_scale);
            for (std::size_t m = 0; m < M; ++m)
              for (std::size_t n = 0; n < ldc; ++n) {
                const float want = c0[m * ldc + n], got = c1[m * ldc + n];
                SCOPED_TRACE(target + " M " + std::to_string(M) + " N " + std::to_string(N) + " K " +
                             std::to_string(K) + " mode " + std::to_string(mode));
                if (n >= N) ASSERT_EQ(got, scales.as<float>()[(m * ldc + n) % 128]) << "column " << n << " written";
                else ASSERT_EQ(got, want) << m << ", " << n;
              }
          }
  }
  detail::simd::force_target("");
}

// Every element of a product is finished by the same operations wherever it falls: with every row
// of A alike, every column of B alike and every element of C alike, all of C comes out with one
// value, on every path, in each mode (an output scale other than 1 in modes 0 and 1, and in mode 2
// one and not), across a 64-column block and a ragged one and a 4-row tile and single rows.
TEST(Bf16, EveryElementFinishedAlike) {
  const Tensor pool = random_tensor(DType::bf16, {96}, 43, 0, 1.0, testing::Draw::bulk);
  const auto* bits = reinterpret_cast<const std::uint16_t*>(pool.as<bf16>());
  const std::size_t M = 7, N = 70, K = 96, lda = K, ldb = 80, ldc = N;
  std::vector<std::uint16_t> A(16 * lda), B(K / 2 * ldb * 2);  // round_up(M, 16) rows (bf16_kernels.h)
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t k = 0; k < K; ++k) A[m * lda + k] = bits[k];
  for (std::size_t kk = 0; kk < K / 2; ++kk)
    for (std::size_t n = 0; n < ldb; ++n)
      for (std::size_t h = 0; h < 2; ++h) B[(kk * ldb + n) * 2 + h] = bits[(2 * kk + h + 5) % K];
  const std::vector<float> row_scale(M, 0.8173f);
  testing::for_each_bf16_path([&] {
    for (int mode : {0, 1, 2})
      for (float out_scale : {0.3062f, 1.0f}) {
        if (mode < 2 && out_scale == 1.0f) continue;
        std::vector<float> C(M * ldc, 1.7313f);
        detail::bfdot::gemm(detail::bfdot::path(), M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc, mode,
                            row_scale.data(), out_scale);
        for (std::size_t i = 0; i < C.size(); ++i)
          ASSERT_EQ(C[0], C[i]) << "mode " << mode << " scale " << out_scale << " row " << i / ldc << " column "
                                << i % ldc;
      }
  });
}

// Every path's GEMM against the float64 products of the same bf16 operands, in every mode, with
// output scales of 1 and not: each element within (K + 2)·2^-23 of the sum of its terms' magnitudes
// (float32 sums of exact products, in any order). Sizes cross the AMX kernel's 16 x 16 tiles and
// 32 x 32 blocks (ragged M and N, N < 16, one row, K = 32) and the other paths' tiles, with strides
// larger than the operands; A has round_up(M, 16) rows and B's columns run to ldb, as bf16_kernels.h
// allows every path to read. Elements past N in a row and rows past M are never written.
TEST(Bf16, GemmMatchesFloat64OnEveryPath) {
  const Tensor pool = random_tensor(DType::bf16, {1 << 16}, 44, 0, 1.0, testing::Draw::bulk);
  const Tensor scales = random_tensor(DType::f32, {256}, 45, 0, 1.0, testing::Draw::one);
  const auto* bits = reinterpret_cast<const std::uint16_t*>(pool.as<bf16>());
  const auto widen = [](std::uint16_t b) { return double(from_bf16(bf16{b})); };  // exact
  testing::for_each_bf16_path([&] {
    for (std::size_t M : {1, 5, 16, 17, 31, 32, 33, 64, 100})
      for (std::size_t N : {1, 7, 15, 16, 17, 32, 33, 48, 130})
        for (std::size_t K : {32, 64, 160})
          for (int mode : {0, 1, 2}) {
            SCOPED_TRACE("M " + std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K) + " mode " +
                         std::to_string(mode));
            const std::size_t rows = (M + 15) / 16 * 16, lda = K + 32, ldb = (N + 15) / 16 * 16 + 16, ldc = N + 5;
            std::vector<std::uint16_t> A(rows * lda), B(K / 2 * ldb * 2);
            for (std::size_t i = 0; i < A.size(); ++i) A[i] = bits[(7 * i + M) % pool.numel()];
            for (std::size_t i = 0; i < B.size(); ++i) B[i] = bits[(11 * i + N + K) % pool.numel()];
            const std::size_t c_rows = (M + 31) / 32 * 32 + 1;
            std::vector<float> C(c_rows * ldc);
            for (std::size_t i = 0; i < C.size(); ++i) C[i] = scales.as<float>()[i % 256];
            const std::vector<float> C0 = C;
            const float out_scale = (M + N + K) % 2 ? 0.3062f : 1.0f;
            const float* rs = mode == 2 ? scales.as<float>() + 7 : nullptr;
            detail::bfdot::gemm(detail::bfdot::path(), M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc, mode, rs,
                                out_scale);
            for (std::size_t m = 0; m < c_rows; ++m)
              for (std::size_t n = 0; n < ldc; ++n) {
                const std::size_t e = m * ldc + n;
                if (m >= M || n >= N) {
                  ASSERT_EQ(C[e], C0[e]) << "written at " << m << ", " << n;
                  continue;
                }
                double sum = 0, mag = 0;
                for (std::size_t k = 0; k < K; ++k) {
                  const double t = widen(A[m * lda + k]) * widen(B[((k / 2) * ldb + n) * 2 + k % 2]);
                  sum += t;
                  mag += std::fabs(t);
                }
                const double init = mode == 0 ? 0.0 : mode == 1 ? C0[e] : double(rs[m]) * C0[e];
                const double want = init + double(out_scale) * sum;
                const double bound = (K + 2) * 0x1p-23 * (std::fabs(out_scale) * mag + std::fabs(init));
                ASSERT_LE(std::fabs(C[e] - want), bound) << m << ", " << n << ": " << C[e] << " against " << want;
              }
          }
  });
}

// A TileScope keeps the AMX tiles configured between products (and nests); the products give the
// same bits inside one as outside, on every path, and after it closes.
TEST(Bf16, GemmInsideTileScopeGivesTheSameBits) {
  const Tensor pool = random_tensor(DType::bf16, {1 << 14}, 46, 0, 1.0, testing::Draw::bulk);
  const auto* bits = reinterpret_cast<const std::uint16_t*>(pool.as<bf16>());
  const std::size_t M = 40, N = 50, K = 96, lda = K, ldb = 64, ldc = N;
  std::vector<std::uint16_t> A(48 * lda), B(K / 2 * ldb * 2);
  for (std::size_t i = 0; i < A.size(); ++i) A[i] = bits[(3 * i) % pool.numel()];
  for (std::size_t i = 0; i < B.size(); ++i) B[i] = bits[(5 * i + 1) % pool.numel()];
  testing::for_each_bf16_path([&] {
    const Path path = detail::bfdot::path();
    const auto product = [&](int mode) {
      std::vector<float> C(M * ldc, 0.5f), row_scale(M, 0.75f);
      detail::bfdot::gemm(path, M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc, mode, row_scale.data(), 0.125f);
      return C;
    };
    const std::vector<float> outside = product(2);
    {
      const detail::bfdot::TileScope scope(path);
      EXPECT_EQ(product(2), outside);
      {
        const detail::bfdot::TileScope inner(path);
        EXPECT_EQ(product(2), outside);
      }
      EXPECT_EQ(product(2), outside);
      EXPECT_EQ(product(1), product(1));
    }
    EXPECT_EQ(product(2), outside);
  });
}

// to_bf16_pairs on the widened path (vector rounding) against the portable loop, bit for bit: ties
// both ways, NaNs, infinities, subnormals and random bits, an odd row count and zero padding rows.
TEST(Bf16, WidenedPairsMatchPortableLoop) {
  const std::uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7fc00001u, 0xff800001u, 0x7f800000u, 0x00000001u,
                                   0x807fffffu, 0x7f7fffffu, 0x3f80ffffu, 0x00008000u};
  for (const std::string& target : detail::simd::available_targets()) {
    detail::simd::force_target(target);
    const std::size_t rows = 7, pad_rows = 10, cols = 48, lds = 53, ldd = 64;
    std::vector<float> src(rows * lds);
    std::uint32_t x = 12345;
    for (std::size_t i = 0; i < src.size(); ++i) {
      x = x * 1664525u + 1013904223u;
      const std::uint32_t bits = i % 5 == 0 ? special[(i / 5) % 10] : x;
      std::memcpy(&src[i], &bits, 4);
    }
    std::vector<std::uint16_t> want(pad_rows / 2 * ldd * 2, 7), got = want;
    detail::bfdot::to_bf16_pairs(Path::portable, src.data(), lds, rows, pad_rows, cols, want.data(), ldd);
    detail::bfdot::to_bf16_pairs(Path::widened, src.data(), lds, rows, pad_rows, cols, got.data(), ldd);
    EXPECT_EQ(got, want) << target;
  }
  detail::simd::force_target("");
}

// transpose_words16 (the forward's K packing) against its definition: 16 rows of random bits, each
// at an odd 16-bit offset (rows read in place are aligned to their element only), word counts
// below, at and past the blocks of 16, an output row stride longer than 16.
TEST(Bf16, TransposedWordsMatchTheirDefinition) {
  for (std::size_t words : {1, 15, 16, 17, 64, 67}) {
    std::vector<std::uint16_t> data(16 * (2 * words + 3));
    std::uint32_t x = 777u + static_cast<std::uint32_t>(words);
    for (std::uint16_t& e : data) e = static_cast<std::uint16_t>((x = x * 1664525u + 1013904223u) >> 16);
    const std::uint16_t* rows[16];
    for (std::size_t r = 0; r < 16; ++r) rows[r] = data.data() + r * (2 * words + 3) + 1;
    const std::size_t ldo = 21;
    std::vector<std::uint32_t> got(words * ldo, 0xdeadbeefu), want = got;
    for (std::size_t w = 0; w < words; ++w)
      for (std::size_t r = 0; r < 16; ++r)
        want[w * ldo + r] = rows[r][2 * w] | static_cast<std::uint32_t>(rows[r][2 * w + 1]) << 16;
    detail::bfdot::transpose_words16(rows, words, got.data(), ldo);
    EXPECT_EQ(got, want) << words << " words";
  }
}

TEST(Bf16, TransposedHalvesMatchTheirDefinition) {
  for (std::size_t n : {1, 31, 32, 33, 64, 67, 128}) {
    std::vector<std::uint16_t> data(16 * (n + 3));
    std::uint32_t x = 555u + static_cast<std::uint32_t>(n);
    for (std::uint16_t& e : data) e = static_cast<std::uint16_t>((x = x * 1664525u + 1013904223u) >> 16);
    const std::uint16_t* rows[16];
    for (std::size_t r = 0; r < 16; ++r) rows[r] = data.data() + r * (n + 3) + 1;  // odd 16-bit offsets
    const std::size_t ldo = 37;
    std::vector<std::uint16_t> got(n * ldo, 0xbeef), want = got;
    for (std::size_t c = 0; c < n; ++c)
      for (std::size_t r = 0; r < 16; ++r) want[c * ldo + r] = rows[r][c];
    detail::bfdot::transpose_halves16(rows, n, got.data(), ldo);
    EXPECT_EQ(got, want) << n << " columns";
  }
}

TEST(Bf16, DetectionFollowsCpuid) {
  unsigned a, b, c, d;
  const bool cpuid_amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 24)) && (d & (1u << 22));
  // Without the CPUID bits AMX must be refused (this machine: an AVX-512 BF16 CPU without AMX).
  if (!cpuid_amx) {
    EXPECT_FALSE(detail::bfdot::amx_usable());
  }
  const bool cpuid_bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
  if (!cpuid_bf16) {
    EXPECT_FALSE(detail::bfdot::avx512_bf16_usable());
  }
  // vdpbf16ps only off Intel's cores, where it is no faster than two FMAs (bf16_gemm.cc).
  const bool dot_pays = detail::bfdot::avx512_bf16_usable() && !detail::cpu_model().intel;
  EXPECT_EQ(detail::bfdot::best_path(), detail::bfdot::amx_usable() ? Path::amx
                                        : dot_pays                  ? Path::avx512_bf16
                                                                    : Path::widened);
  EXPECT_THROW(detail::bfdot::force_path("tpu"), Error);
}

// The AMX peak loop runs where the bf16 products may use AMX (16384 flops a tdpbf16ps, 4 a step, on
// each thread) and does nothing elsewhere.
TEST(Bf16, AmxPeakLoopWhereAmxIsUsable) {
  EXPECT_EQ(detail::peak::amx_available(), detail::bfdot::amx_usable());
  EXPECT_EQ(detail::peak::timed_amx_bf16(2, 10).flops, detail::bfdot::amx_usable() ? 2 * 10 * 4 * 16384.0 : 0.0);
  EXPECT_EQ(detail::peak::amx_flops_per_step(), detail::bfdot::amx_usable() ? 4 * 16384.0 : 0.0);
}

TEST(Bf16, ForwardWithinOnePercentOnEveryPath) {
  struct Shape {
    std::int64_t B, Hq, Hkv, Nq, Nkv, dk, dv;
  };
  const std::vector<Shape> shapes = {{1, 1, 1, 1, 1, 1, 1}, {2, 4, 2, 67, 131, 16, 24}, {1, 2, 1, 130, 77, 59, 5},
                                     {1, 1, 1, 64, 64, 128, 128}, {1, 2, 1, 200, 420, 32, 16}};
  testing::for_each_bf16_path([&] {
    for (const Shape& s : shapes)
      for (int mask = 0; mask < 5; ++mask)
        for (DType dtype : {DType::bf16, DType::f32}) {
          const Tensor q = random_tensor(dtype, {s.B, s.Hq, s.Nq, s.dk}, 60 + s.Nq, 0),
                       k = random_tensor(dtype, {s.B, s.Hkv, s.Nkv, s.dk}, 60 + s.Nq, 1),
                       v = random_tensor(dtype, {s.B, s.Hkv, s.Nkv, s.dv}, 60 + s.Nq, 2),
                       keep = random_tensor(DType::u8, {s.Nq, s.Nkv}, 60 + s.Nq, 3);
          Options opt;
          opt.compute = Compute::bf16;
          if (mask == 1) opt.mask.causal = true;
          if (mask == 2) opt.mask.explicit_mask = keep.view();
          if (mask == 3) {  // a window: key tiles start off the grid, at odd keys too
            opt.mask.window_left = 37;
            opt.mask.window_right = 3;
          }
          if (mask == 4) {  // a window longer than a key tile: full tiles that start at odd keys
            opt.mask.window_left = 293;
            opt.mask.window_right = 0;
          }
          Tensor out(dtype, {s.B, s.Hq, s.Nq, s.dv}), lse(DType::f32, {s.B, s.Hq, s.Nq}),
              ref(DType::f64, {s.B, s.Hq, s.Nq, s.dv}), rlse(DType::f64, {s.B, s.Hq, s.Nq});
          poison(out);
          poison(lse);
          forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt);
          reference::forward(q.view(), k.view(), v.view(), {ref.view(), rlse.view()}, opt);
          EXPECT_LE(rel_error(out.view(), ref.view()), 1e-2) << s.Nq << " mask " << mask;
          EXPECT_LE(rel_error(lse.view(), rlse.view()), 1e-2) << s.Nq << " mask " << mask;
          if (mask == 3) {  // the optional probabilities, from the bf16 statistics
            Tensor probs(DType::f32, {s.B, s.Hq, s.Nq, s.Nkv}), rprobs(DType::f64, {s.B, s.Hq, s.Nq, s.Nkv});
            poison(probs);
            forward(q.view(), k.view(), v.view(), {out.view(), {}, probs.view()}, opt);
            reference::forward(q.view(), k.view(), v.view(), {ref.view(), {}, rprobs.view()}, opt);
            EXPECT_LE(rel_error(probs.view(), rprobs.view()), 1e-2) << s.Nq << " probs";
          }
        }
  });
}


// A NaN or infinity in V at a key only the last rows see (causal), or a float32 value that becomes
// infinite in bfloat16 (3.4e38): those rows' output in its column comes out non-finite (the latter
// not asked), every other row finite (its weight there is 0, and 0 · NaN must not reach it) and as without it,
// on every path: bit for bit where no tile of its holds the key, within bfloat16's rounding where
// one does (that tile takes the visible pairs in float32); the clean head beside it is bit for bit
// untouched. The forward skips its per-tile test of V where the packed head is finite
// (bf16_forward.cc), so both kinds of head run here.
TEST(Bf16, NonFiniteValueReachesOnlyTheRowsThatSeeIt) {
  const std::int64_t B = 1, H = 2, N = 300, d = 64, j = N - 5;  // key j: rows j.. see it
  testing::for_each_bf16_path([&] {
    for (DType dtype : {DType::bf16, DType::f32})
      for (const float bad : {NAN, INFINITY, 3.4e38f}) {  // 3.4e38: finite, infinite once rounded to bfloat16
        if (dtype == DType::bf16 && std::isfinite(bad)) continue;
        SCOPED_TRACE(std::string(dtype == DType::bf16 ? "bf16" : "f32") + " " + std::to_string(bad));
        const Tensor q = random_tensor(dtype, {B, H, N, d}, 95, 0), k = random_tensor(dtype, {B, H, N, d}, 95, 1);
        const Tensor v0 = random_tensor(dtype, {B, H, N, d}, 95, 2);
        Tensor v = random_tensor(dtype, {B, H, N, d}, 95, 2);
        const std::int64_t at = ((1 * N) + j) * d + 3;  // head 1, key j, column 3
        if (dtype == DType::bf16) v.as<bf16>()[at] = to_bf16(bad);
        else v.as<float>()[at] = bad;
        Options opt;
        opt.compute = Compute::bf16;
        opt.mask.causal = true;
        Tensor clean(dtype, {B, H, N, d}), out(dtype, {B, H, N, d});
        forward(q.view(), k.view(), v0.view(), {clean.view()}, opt);
        forward(q.view(), k.view(), v.view(), {out.view()}, opt);
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < N; ++i)
            for (std::int64_t c = 0; c < d; ++c) {
              const std::int64_t e = (h * N + i) * d + c;
              const double o = value_at(out.view(), e), o0 = value_at(clean.view(), e);
              if (h == 1 && i >= j && c == 3) {  // each output column sums its own column of V
                if (std::isfinite(bad)) continue;  // 3.4e38 weighs in where it is seen
                ASSERT_FALSE(std::isfinite(o)) << "head " << h << " row " << i << " column " << c;
              } else if (h == 0 || i < j / 128 * 128) {  // no tile of these rows holds key j
                ASSERT_EQ(o, o0) << "head " << h << " row " << i << " column " << c;
              } else if (i < j) {
                ASSERT_LE(std::fabs(o - o0), 1e-2 * (std::fabs(o0) + 0.1)) << "head " << h << " row " << i << " column " << c;
              }
            }
      }
  });
}

// Logits far beyond bfloat16's resolution (scale ±1e30, huge inputs): probs must still be
// probabilities — every entry in [0, 1], each row summing to 1 (0 for a row with no visible key),
// never NaN — because they come from the same scores as the statistics m and l. out and lse are
// held to the float64 reference within the bound of attention_fuzz: a logit's absolute error is
// ds = (dk + 3)·eps·M (M = |s|·max Σ|q k|; eps = 2^-24 for the float32 products of exact bfloat16
// inputs, 2^-8 when float32 inputs are rounded to bfloat16), so the lse carries ds and out
// 4·(e^(2·ds) − 1)·max|v| (at most 2·max|v|: a bound that says nothing once ds is large).
TEST(Bf16, HugeLogitsKeepProbabilities) {
  struct Case {
    double scale, sigma;  // sigma: standard deviation of the inputs
  };
  const std::vector<Case> cases = {{1e4, 1}, {1e4, 100}, {1e30, 1}, {-1e30, 1}, {1e30, 1e3}, {1, 1e17}, {-1, 1e17}};
  const std::int64_t B = 1, Hq = 2, Hkv = 1, Nq = 37, Nkv = 83, dk = 7, dv = 5;
  testing::for_each_bf16_path([&] {
    for (const Case& cs : cases)
      for (DType dtype : {DType::bf16, DType::f32})
        for (int mask = 0; mask < 3; ++mask) {
          SCOPED_TRACE("scale " + std::to_string(cs.scale) + " sigma " + std::to_string(cs.sigma) + " mask " +
                       std::to_string(mask) + (dtype == DType::bf16 ? " bf16" : " f32"));
          const Tensor q = random_tensor(dtype, {B, Hq, Nq, dk}, 90, 0, cs.sigma),
                       k = random_tensor(dtype, {B, Hkv, Nkv, dk}, 90, 1, cs.sigma),
                       v = random_tensor(dtype, {B, Hkv, Nkv, dv}, 90, 2);
          Tensor keep = random_tensor(DType::u8, {Nq, Nkv}, 90, 3);
          for (std::int64_t j = 0; j < Nkv; ++j) keep.as<std::uint8_t>()[5 * Nkv + j] = 0;  // row 5: no key
          Options opt;
          opt.compute = Compute::bf16;
          opt.scale = Scale::value(cs.scale);
          if (mask == 1) opt.mask.causal = true;
          if (mask == 2) opt.mask.explicit_mask = keep.view();
          Tensor out(dtype, {B, Hq, Nq, dv}), lse(DType::f32, {B, Hq, Nq}), probs(DType::f32, {B, Hq, Nq, Nkv});
          Tensor ref(DType::f64, {B, Hq, Nq, dv}), rlse(DType::f64, {B, Hq, Nq}), rprobs(DType::f64, {B, Hq, Nq, Nkv});
          poison(out);
          poison(lse);
          poison(probs);
          forward(q.view(), k.view(), v.view(), {out.view(), lse.view(), probs.view()}, opt);
          reference::forward(q.view(), k.view(), v.view(), {ref.view(), rlse.view(), rprobs.view()}, opt);
          const double eps = dtype == DType::bf16 ? 0x1p-24 : 0x1p-8;
          double vmax = 0;
          for (std::int64_t n = 0; n < v.numel(); ++n) vmax = std::max(vmax, std::fabs(value_at(v.view(), n)));
          for (std::int64_t h = 0; h < Hq; ++h)
            for (std::int64_t i = 0; i < Nq; ++i) {
              const std::int64_t row = h * Nq + i;
              double M = 0;
              for (std::int64_t j = 0; j < Nkv; ++j) {
                double qk = 0;
                for (std::int64_t c = 0; c < dk; ++c)
                  qk += std::fabs(value_at(q.view(), row * dk + c) * value_at(k.view(), j * dk + c));
                M = std::max(M, std::fabs(cs.scale) * qk);
              }
              double sum = 0;
              for (std::int64_t j = 0; j < Nkv; ++j) {
                const double p = value_at(probs.view(), row * Nkv + j);
                ASSERT_TRUE(p >= 0.0 && p <= 1.0) << "row " << row << " key " << j << ": " << p;
                sum += p;
              }
              if (value_at(rlse.view(), row) == -INFINITY) {  // no visible key
                EXPECT_EQ(sum, 0.0) << "row " << row;
                EXPECT_EQ(value_at(lse.view(), row), -INFINITY) << "row " << row;
                continue;
              }
              EXPECT_NEAR(sum, 1.0, (Nkv + 4) * 4 * 0x1p-23) << "row " << row;
              const double ds = (dk + 3) * eps * M + (Nkv + 4) * 0x1p-24;
              const double a = value_at(lse.view(), row), r = value_at(rlse.view(), row);
              ASSERT_TRUE(std::isfinite(a)) << "row " << row;
              EXPECT_LE(std::fabs(a - r), 2 * ds + 0x1p-23 * std::fabs(r)) << "row " << row;
              const double tol = vmax * std::min(2.0, 4 * std::expm1(2 * ds));
              for (std::int64_t c = 0; c < dv; ++c) {
                const double o = value_at(out.view(), row * dv + c), ro = value_at(ref.view(), row * dv + c);
                ASSERT_TRUE(std::isfinite(o)) << "row " << row;
                EXPECT_LE(std::fabs(o - ro), tol + 0x1p-8 * std::fabs(ro) + 1e-300) << "row " << row << " col " << c;
              }
            }
        }
  });
}

}  // namespace
}  // namespace attnscale
