// Every compiled SIMD target against float64: the GEMM kernel over awkward lengths and misaligned
// pointers, and forward() under the accuracy rule "error vs float64 <= 2x the error of a naive
// float32 matmul-softmax-matmul on the same inputs", for every mask kind, GQA and awkward sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "attention/bf16_kernels.h"
#include "attention/kernels.h"
#include "attention/peak_loops.h"
#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "attnscale/version.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using testing::poison;
using testing::random_tensor;
using testing::rel_error;

// Runs fn once per target this CPU supports, then restores the best target.
template <class Fn>
void for_each_target(Fn fn) {
  const auto targets = detail::simd::available_targets();
  ASSERT_FALSE(targets.empty());
  for (const std::string& t : targets) {
    detail::simd::force_target(t);
    SCOPED_TRACE("target " + t + " (" + cpu_target() + ")");
    fn(t);
  }
  detail::simd::force_target("");
}

// The bench's read ceiling (peak::read_two_streams) reads every whole 64 bytes of both streams, by
// any target's vectors, and no byte past them: its sum is the words' sum.
TEST(Targets, ReadLoopSumsEveryWordOfBothStreamsOnEveryTarget) {
  const std::size_t bytes = 64 * 7 + 13, whole = 64 * 7;
  std::vector<std::uint64_t> a(bytes / 8 + 1), b(bytes / 8 + 1);
  std::uint64_t x = 0x9e3779b97f4a7c15u, expect = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = x = x * 6364136223846793005u + 1442695040888963407u;
    b[i] = x = x * 6364136223846793005u + 1442695040888963407u;
    if (8 * i < whole) expect += a[i] + b[i];
  }
  for_each_target([&](const std::string&) {
    EXPECT_EQ(detail::peak::read_two_streams(reinterpret_cast<const char*>(a.data()),
                                             reinterpret_cast<const char*>(b.data()), bytes),
              expect);
  });
}

// The peak loops timed by themselves (the bench's limits) count every thread's flops, on every
// target, with more threads than the machine has and with one: threads · steps · the loop's flops a
// step; a positive time, none longer than the call.
TEST(Targets, TimedPeakLoopsCountEveryThreadsFlops) {
  const int many = 2 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) + 1;
  for_each_target([&](const std::string&) {
    for (int threads : {1, many}) {
      const auto t0 = std::chrono::steady_clock::now();
      const detail::peak::Timing fma = detail::peak::timed_fp32_fma(threads, 1000);
      const detail::peak::Timing dot = detail::peak::timed_bf16_dot(threads, 1000);
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_EQ(fma.flops, threads * 1000 * detail::peak::fp32_flops_per_step());
      EXPECT_EQ(dot.flops, threads * 1000 * detail::peak::bf16_flops_per_step());
      EXPECT_GT(fma.time.seconds, 0);
      EXPECT_GT(dot.time.seconds, 0);
      EXPECT_LT(fma.time.seconds + dot.time.seconds, wall);
    }
  });
}

TEST(Targets, ScalarIsAlwaysAvailableAndNamesAreChecked) {
  const auto targets = detail::simd::available_targets();
  EXPECT_EQ(targets.front(), "scalar");
  EXPECT_THROW(detail::simd::force_target("sse9"), Error);
  for_each_target([](const std::string& t) {
    const std::string name = cpu_target();
    if (t == "avx512") {
      EXPECT_EQ(name, "AVX3");
    } else if (t == "avx2") {
      EXPECT_EQ(name, "AVX2");
    } else {
      EXPECT_TRUE(name == "SCALAR" || name == "EMU128") << name;
    }
  });
}

// A (M x K), B (K x N), C (M x N) and C's row scales for a GEMM test, each one float longer than
// its matrix: the operands start one float off a 64-byte boundary, at element 1.
struct GemmOperands {
  std::vector<float> a, b, c, scale;
};
GemmOperands gemm_operands(std::size_t M, std::size_t N, std::size_t K) {
  GemmOperands o{std::vector<float>(M * K + 1), std::vector<float>(K * N + 1), std::vector<float>(M * N + 1),
                 std::vector<float>(M + 1)};
  for (std::size_t x = 0; x < o.a.size(); ++x) o.a[x] = std::sin(0.37 * x + M);
  for (std::size_t x = 0; x < o.b.size(); ++x) o.b[x] = std::cos(0.11 * x + N);
  for (std::size_t x = 0; x < o.c.size(); ++x) o.c[x] = 0.5f - 0.01f * x;
  for (std::size_t x = 0; x < o.scale.size(); ++x) o.scale[x] = 0.25f * x;
  return o;
}

// transpose_scaled against its definition on every target: rows at odd float offsets, row and
// column counts around the 16 × 16 blocks, each value the one product rows[r][c]·f.
TEST(Targets, TransposeScaledMatchesItsDefinition) {
  for_each_target([&](const std::string&) {
    for (std::size_t n : {1, 15, 16, 17, 33, 64})
      for (std::size_t d : {1, 7, 16, 31, 64, 80}) {
        std::vector<float> data(n * (d + 3));
        for (std::size_t x = 0; x < data.size(); ++x) data[x] = std::sin(0.7 * x + n) * 3.0f;
        std::vector<const float*> rows(n);
        for (std::size_t r = 0; r < n; ++r) rows[r] = data.data() + r * (d + 3) + 1;
        const std::size_t ld = n + 5;
        const float f = 0.123f;
        std::vector<float> got(d * ld, -7.0f), want = got;
        for (std::size_t c = 0; c < d; ++c)
          for (std::size_t r = 0; r < n; ++r) want[c * ld + r] = rows[r][c] * f;
        detail::simd::transpose_scaled(rows.data(), n, d, f, got.data(), ld);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << n << " x " << d;
      }
  });
}

// row_dots8 against its definition on every target: each row's float64 chain in column order,
// bit for bit, for lengths around the 8-column blocks, rows at odd offsets and of mixed scales.
TEST(Targets, RowDots8MatchesItsChains) {
  for_each_target([&](const std::string&) {
    for (std::size_t n : {0, 1, 7, 8, 9, 64, 131}) {
      std::vector<float> a(8 * (n + 3)), b(8 * (n + 3));
      for (std::size_t x = 0; x < a.size(); ++x) {
        a[x] = std::sin(0.37 * x + n) * std::exp2(static_cast<int>(x % 23) - 11);
        b[x] = std::cos(0.91 * x) * 3.0f;
      }
      const float *ra[8], *rb[8];
      for (std::size_t r = 0; r < 8; ++r) ra[r] = a.data() + r * (n + 3) + 1, rb[r] = b.data() + r * (n + 3) + 2;
      double got[8], want[8] = {};
      for (std::size_t r = 0; r < 8; ++r)
        for (std::size_t c = 0; c < n; ++c) want[r] += static_cast<double>(ra[r][c]) * static_cast<double>(rb[r][c]);
      detail::simd::row_dots8(ra, rb, n, got);
      ASSERT_EQ(0, std::memcmp(got, want, sizeof got)) << n << " columns";
    }
  });
}

// C = A·B against a double loop, for M, N, K in awkward sizes around the lane counts, with A
// transposed or not and every pointer one float off a 64-byte boundary.
TEST(Targets, GemmMatchesDoubleLoop) {
  const std::vector<std::size_t> sizes = {1, 3, 7, 8, 9, 15, 16, 17, 31, 48, 67};
  for_each_target([&](const std::string&) {
    for (std::size_t M : sizes)
      for (std::size_t N : sizes)
        for (std::size_t K : {std::size_t{1}, std::size_t{5}, std::size_t{33}})
          for (int transposed = 0; transposed < 2; ++transposed)
            for (int mode = 0; mode < 3; ++mode) {
              auto [a, b, c, scale] = gemm_operands(M, N, K);
              const std::size_t ars = transposed ? 1 : K, acs = transposed ? M : 1;
              std::vector<double> want(M * N);
              for (std::size_t m = 0; m < M; ++m)
                for (std::size_t n = 0; n < N; ++n) {
                  double s = mode == 0 ? 0.0 : mode == 1 ? c[1 + m * N + n] : scale[1 + m] * c[1 + m * N + n];
                  for (std::size_t k = 0; k < K; ++k) s += double(a[1 + m * ars + k * acs]) * b[1 + k * N + n];
                  want[m * N + n] = s;
                }
              detail::simd::gemm(M, N, K, a.data() + 1, ars, acs, b.data() + 1, N, c.data() + 1, N,
                                 static_cast<detail::simd::GemmMode>(mode), scale.data() + 1);
              double err = 0;
              for (std::size_t x = 0; x < M * N; ++x) err = std::max(err, std::abs(c[1 + x] - want[x]));
              ASSERT_LE(err, 1e-4 * (K + 1)) << M << "x" << N << "x" << K << " t" << transposed << " mode " << mode;
              ASSERT_EQ(c[0], 0.5f) << "wrote before C";
            }
  });
}

// tile_gemm (the forward's products, their running sums in registers) gives gemm's bits in every
// mode, on every target, for sizes around the register tiles (rows 1..7, 64, 67), inner dimensions
// across the blocks and the L1 spans of TileGemm (1, 17, 64, 129, 300), A transposed or not.
TEST(Targets, TileGemmGivesGemmsBits) {
  const std::vector<std::size_t> rows = {1, 2, 3, 4, 5, 7, 64, 67}, cols = {1, 9, 16, 33, 64, 80, 128};
  for_each_target([&](const std::string&) {
    for (std::size_t M : rows)
      for (std::size_t N : cols)
        for (std::size_t K : {1, 17, 64, 129, 300})
          for (int transposed = 0; transposed < 2; ++transposed)
            for (int mode = 0; mode < 3; ++mode) {
              auto [a, b, c, scale] = gemm_operands(M, N, K);
              std::vector<float> c2 = c;
              const std::size_t ars = transposed ? 1 : K, acs = transposed ? M : 1;
              const auto md = static_cast<detail::simd::GemmMode>(mode);
              detail::simd::gemm(M, N, K, a.data() + 1, ars, acs, b.data() + 1, N, c.data() + 1, N, md, scale.data() + 1);
              detail::simd::tile_gemm(M, N, K, a.data() + 1, ars, acs, b.data() + 1, N, c2.data() + 1, N, md,
                                      scale.data() + 1);
              ASSERT_EQ(0, std::memcmp(c.data(), c2.data(), c.size() * sizeof(float)))
                  << M << "x" << N << "x" << K << " t" << transposed << " mode " << mode;
            }
  });
}

// The soft-capping kernel (vector tanh) against float64 tanh: runs of every tail length, values
// from tiny to past tanh's saturation, ±inf, NaN, and its derivative 1 − tanh² for the backward;
// nothing outside the run written.
TEST(Targets, SoftcapMatchesFloat64Tanh) {
  for_each_target([&](const std::string&) {
    for (float c : {0.5f, 30.0f, 1000.0f})
      for (std::size_t n : {1, 2, 7, 15, 16, 17, 31, 64, 67}) {
        std::vector<float> x(n + 2), dcap(n + 2, -7.0f);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sinh(0.9 * i - 12.0) * c / 20.0);
        if (n > 3) x[2] = INFINITY, x[3] = -INFINITY;
        if (n > 4) x[4] = NAN;
        const std::vector<float> in = x;
        detail::simd::softcap(x.data() + 1, n, c, dcap.data() + 1);
        EXPECT_EQ(in[0], x[0]);
        EXPECT_EQ(in[n + 1], x[n + 1]);
        EXPECT_EQ(-7.0f, dcap[0]);
        EXPECT_EQ(-7.0f, dcap[n + 1]);
        for (std::size_t i = 1; i <= n; ++i) {
          const double t = std::tanh(static_cast<double>(in[i]) / c);
          if (std::isnan(in[i])) {
            EXPECT_TRUE(std::isnan(x[i]));
            continue;
          }
          ASSERT_NEAR(c * t, x[i], 4e-7 * c * std::max(std::abs(t), 1e-3)) << "c " << c << " n " << n << " x " << in[i];
          ASSERT_NEAR(1.0 - t * t, dcap[i], 1e-6) << "c " << c << " n " << n << " x " << in[i];
        }
      }
  });
}

// e^(x − sub) of the row kernels at both accuracies (kernels.h, ExpFor) against float64 2^t, t
// the kernels' own float32 argument (x − sub)·log2(e): float32's polynomial within 2.5e-7, the bf16
// forward's degree-3 one within 1.02e-4 (its fit's 1.01e-4 and float32 rounding), over a fine grid
// of fractions and exponents (below 2^-126 within 2^-126 absolute); e^0 exactly 1, -inf to 0, NaN kept. Then the bf16 flavour's online
// softmax: P <= 1 with the row's largest exactly 1, and l the float32 sum of its P. The column
// kernel at both accuracies gives the row kernel's bits.
TEST(Targets, Exp2RowsAtBothAccuracies) {
  for_each_target([&](const std::string&) {
    using detail::simd::ExpFor;
    const std::size_t n = 4096 + 16;
    std::vector<float> x(n);
    for (std::size_t i = 0; i < 4096; ++i) x[i] = -static_cast<float>(i) * (90.0f / 4096.0f);
    x[4096] = 0.0f, x[4097] = -INFINITY, x[4098] = NAN;
    for (std::size_t i = 4099; i < n; ++i) x[i] = -0.5f * static_cast<float>(i - 4098);
    for (const ExpFor e : {ExpFor::f32, ExpFor::bf16}) {
      std::vector<float> y = x;
      const float sub = 0.0f;
      detail::simd::exp2_rows(y.data(), n, 1, n, &sub, nullptr, e);
      const double tol = e == ExpFor::bf16 ? 1.02e-4 : 2.5e-7;
      for (std::size_t i = 0; i < n; ++i) {
        if (std::isnan(x[i])) {
          EXPECT_TRUE(std::isnan(y[i]));
          continue;
        }
        const float t = (x[i] - sub) * 1.4426950408889634f;
        const double want = std::exp2(static_cast<double>(t));
        // Below 2^-126 targets without vscalefps flush to 0 (exp2-inl.h): there the error is absolute.
        ASSERT_LE(std::abs(y[i] - want), want >= 0x1p-126 ? tol * want : 0x1p-126)
            << "x " << x[i] << (e == ExpFor::bf16 ? " bf16" : " f32");
      }
      EXPECT_EQ(1.0f, y[4096]);
      EXPECT_EQ(0.0f, y[4097]);
      // The column kernel (the backwards' P, exp2_columns) on the same values as a 257 x 16 tile:
      // the same e^x, so the same bits.
      std::vector<float> yc = x;
      const std::vector<float> subs(16, 0.0f), ones(16, 1.0f);
      detail::simd::exp2_columns(yc.data(), 16, n / 16, 16, subs.data(), ones.data(), e);
      for (std::size_t i = 0; i < n; ++i)
        if (!std::isnan(x[i])) {
          ASSERT_EQ(y[i], yc[i]) << "x " << x[i] << (e == ExpFor::bf16 ? " bf16" : " f32");
        }
    }
    // Three rows of 37 scores (one ragged vector), the online step from an empty state.
    const std::size_t rows = 3, cols = 37, lds = 48;
    std::vector<float> S(rows * lds), m(rows, -INFINITY), l(rows, 0.0f), alpha(rows);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) S[r * lds + c] = static_cast<float>(std::sin(3.7 * (r * cols + c)) * 9.0);
    const std::vector<float> in = S;
    detail::simd::softmax_update_rows(S.data(), lds, rows, cols, m.data(), l.data(), alpha.data(), ExpFor::bf16);
    for (std::size_t r = 0; r < rows; ++r) {
      float largest = 0.0f, sum = 0.0f;
      double exact = 0.0;
      for (std::size_t c = 0; c < cols; ++c) {
        EXPECT_LE(S[r * lds + c], 1.0f);
        largest = std::max(largest, S[r * lds + c]);
        sum += S[r * lds + c];
        exact += std::exp(static_cast<double>(in[r * lds + c]) - m[r]);
      }
      EXPECT_EQ(1.0f, largest);
      EXPECT_NEAR(exact, l[r], 1.1e-4 * exact);
      EXPECT_NEAR(sum, l[r], 1e-5 * l[r]);
    }
  });
}

// softmax_update_rows_to_bf16 (the bf16 forward's whole tiles: P rounded as it is made) against
// the two steps it replaces, softmax_update_rows(ExpFor::bf16) or its scaled form, then to_bf16:
// the same m, l and alpha, and P's bits, on awkward row counts and widths, over states of earlier
// tiles; on AVX-512 only where AVX-512 BF16 is usable (its vcvtneps2bf16).
TEST(Targets, SoftmaxToBf16GivesTheTwoStepsBits) {
  for_each_target([&](const std::string& t) {
    if (t == "avx512" && !detail::bfdot::avx512_bf16_usable()) return;
    for (const bool fold : {false, true})
    for (const bool scaled : {false, true})
      for (const std::size_t rows : {1, 3, 4, 7, 32})
        for (const std::size_t cols : {1, 37, 128, 256}) {
          SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols) + (scaled ? " scaled" : "") +
                       (fold ? " fold" : ""));
          const std::size_t lds = (cols + 15) / 16 * 16 + 16, ldp = lds + 8;
          const float scale = scaled ? 0.125f : 1.0f;
          std::vector<float> S(rows * lds), m(rows), l(rows), alpha(rows);
          for (std::size_t r = 0; r < rows; ++r) {
            m[r] = r % 3 == 0 ? -INFINITY : static_cast<float>(r % 5);  // a first tile, or later ones
            l[r] = r % 3 == 0 ? 0.0f : 1.5f + static_cast<float>(r);
            for (std::size_t c = 0; c < cols; ++c)
              S[r * lds + c] = static_cast<float>(std::sin(1.3 * static_cast<double>(r * cols + c) + 0.2) * 30.0);
          }
          std::vector<float> S2 = S, m2 = m, l2 = l, alpha2(rows);
          std::vector<std::uint16_t> P(rows * ldp, 0xdead);
          detail::simd::softmax_update_rows_to_bf16(S.data(), lds, rows, cols, m.data(), l.data(), alpha.data(), scale,
                                                    scaled, fold, P.data(), ldp);
          if (scaled)
            detail::simd::softmax_update_rows_bf16_scaled(S2.data(), lds, rows, cols, m2.data(), l2.data(),
                                                          alpha2.data(), scale, fold);
          else
            detail::simd::softmax_update_rows(S2.data(), lds, rows, cols, m2.data(), l2.data(), alpha2.data(),
                                              detail::simd::ExpFor::bf16);
          const std::size_t padded = (cols + 15) / 16 * 16;
          for (std::size_t r = 0; r < rows; ++r) {
            EXPECT_EQ(m2[r], m[r]);
            EXPECT_EQ(l2[r], l[r]);
            EXPECT_EQ(alpha2[r], alpha[r]);
            for (std::size_t c = 0; c < padded; ++c)
              ASSERT_EQ(to_bf16(S2[r * lds + c]).bits, P[r * ldp + c]) << "row " << r << " column " << c;
            EXPECT_EQ(0xdead, P[r * ldp + padded]);  // nothing past the padded row
          }
        }
  });
}

// The bf16 backward's panel passes that round as they make (exp2_columns_bf16_scaled_to,
// softmax_grad_to_bf16) against the passes that store float32 and to_bf16 after them: the same
// Pt, the same bits of Pt, dSt and dSt's row pairs.
TEST(Targets, BackwardRoundingPassesGiveTheStepsBits) {
  for_each_target([&](const std::string& t) {
    if (t == "avx512" && !detail::bfdot::avx512_bf16_usable()) return;
    for (const std::size_t rows : {2, 6, 32})
      for (const std::size_t cols : {16, 64}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
        const std::size_t ld = cols + 16, ldp = 2 * cols + 8;
        const float scale = 0.09f;
        std::vector<float> St(rows * ld), dPt(rows * ld), sub(cols), mul(cols), D(cols);
        for (std::size_t c = 0; c < cols; ++c) {
          sub[c] = c % 7 == 6 ? INFINITY : static_cast<float>(std::cos(0.3 * c) * 3.0 + 4.0);  // +inf: a padded query
          mul[c] = c % 7 == 6 ? 0.0f : 1.0f / static_cast<float>(1 + c % 3);
          D[c] = static_cast<float>(std::sin(0.7 * c));
        }
        for (std::size_t i = 0; i < St.size(); ++i) {
          St[i] = static_cast<float>(std::sin(1.1 * static_cast<double>(i)) * 40.0);
          dPt[i] = static_cast<float>(std::cos(0.9 * static_cast<double>(i)) * 2.0);
        }
        std::vector<float> St2 = St, dPt2 = dPt;
        std::vector<std::uint16_t> Pb(rows * ldp, 1), dSb(rows * ldp, 2), dSv(rows * cols, 3);
        detail::simd::exp2_columns_bf16_scaled_to(St.data(), ld, rows, cols, sub.data(), mul.data(), scale, Pb.data(),
                                                  ldp);
        detail::simd::softmax_grad_to_bf16(St.data(), dPt.data(), ld, rows, cols, D.data(), scale, dSb.data(), ldp,
                                           dSv.data(), cols);
        detail::simd::exp2_columns_bf16_scaled(St2.data(), ld, rows, cols, sub.data(), mul.data(), scale);
        detail::simd::softmax_grad(St2.data(), dPt2.data(), ld, rows, cols, D.data(), scale);
        for (std::size_t j = 0; j < rows; ++j)
          for (std::size_t c = 0; c < cols; ++c) {
            ASSERT_EQ(St2[j * ld + c], St[j * ld + c]) << "P row " << j << " column " << c;
            ASSERT_EQ(to_bf16(St2[j * ld + c]).bits, Pb[j * ldp + c]) << "Pb row " << j << " column " << c;
            const std::uint16_t ds = to_bf16(dPt2[j * ld + c]).bits;
            ASSERT_EQ(ds, dSb[j * ldp + c]) << "dSb row " << j << " column " << c;
            ASSERT_EQ(ds, dSv[((j / 2) * cols + c) * 2 + j % 2]) << "dSv row " << j << " column " << c;
          }
      }
  });
}

// The bf16 softmax's fold (kernels.h): e^(x·s − m) by one multiply-add from x stays within
// 7.2e-4 of the three operations' P where |m| <= 4096 (rows of scores up to ±4000 here), and past
// that limit (rows whose maximum is 10^6) gives their bits; likewise the backward's exp2_columns.
// Score x of row r, column c in Bf16SoftmaxFoldWithinItsBound.
float S0(float top, float scale, std::size_t r, std::size_t c, std::size_t cols) {
  return (top / static_cast<float>(r + 1) - 90.0f * static_cast<float>((c * 7 + r) % cols) / cols) / scale;
}

TEST(Targets, Bf16SoftmaxFoldWithinItsBound) {
  for_each_target([&](const std::string&) {
    const std::size_t rows = 9, cols = 300, lds = 304;
    for (const float top : {4000.0f, 1e6f}) {
      SCOPED_TRACE("largest score " + std::to_string(top));
      const float scale = 0.37f;
      std::vector<float> S(rows * lds, -INFINITY);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c)  // within 90 of the row's largest x·s, which is top / (r + 1)
          S[r * lds + c] = S0(top, scale, r, c, cols);
      std::vector<float> Sf = S, m(rows, -INFINITY), l(rows, 0.0f), a(rows), mf = m, lf = l, af(rows);
      detail::simd::softmax_update_rows_bf16_scaled(S.data(), lds, rows, cols, m.data(), l.data(), a.data(), scale, false);
      detail::simd::softmax_update_rows_bf16_scaled(Sf.data(), lds, rows, cols, mf.data(), lf.data(), af.data(), scale, true);
      for (std::size_t r = 0; r < rows; ++r) {
        EXPECT_EQ(m[r], mf[r]);
        const bool folds = std::fabs(m[r]) <= 4096.0f;
        for (std::size_t c = 0; c < cols; ++c) {
          const float p = S[r * lds + c], pf = Sf[r * lds + c];
          if (folds) ASSERT_LE(std::fabs(pf - p), 7.2e-4 * p) << "row " << r << " column " << c;
          else ASSERT_EQ(p, pf) << "row " << r << " column " << c;
        }
        EXPECT_LE(std::fabs(lf[r] - l[r]), 7.2e-4 * l[r]);
      }
      // The backward's P from final statistics: sub = lse = m + log l per column (one query a column).
      std::vector<float> St(cols * 16), sub(16), mul(16, 1.0f);
      for (std::size_t q = 0; q < 16; ++q) sub[q] = m[q % rows] + std::log(l[q % rows]);
      for (std::size_t j = 0; j < cols; ++j)
        for (std::size_t q = 0; q < 16; ++q) St[j * 16 + q] = S0(top, scale, q % rows, j, cols);
      std::vector<float> Pu = St, Pf = St;
      for (std::size_t j = 0; j < cols; ++j)
        for (std::size_t q = 0; q < 16; ++q) Pu[j * 16 + q] *= scale;  // scaled first: the plain form
      detail::simd::exp2_columns(Pu.data(), 16, cols, 16, sub.data(), mul.data(), detail::simd::ExpFor::bf16);
      detail::simd::exp2_columns_bf16_scaled(Pf.data(), 16, cols, 16, sub.data(), mul.data(), scale);
      for (std::size_t i = 0; i < Pu.size(); ++i) {
        if (top <= 4096.0f) ASSERT_LE(std::fabs(Pf[i] - Pu[i]), 7.2e-4 * Pu[i]) << i;
        else ASSERT_LE(std::fabs(Pf[i] - Pu[i]), 1e-6 * Pu[i]) << i;  // no fold: x·s rounded once either way
      }
    }
  });
}

// Every element of a float32 product is finished by the same operations wherever it falls (the
// tile's columns, its full and remainder rows, the ragged last vector): with every row of A alike,
// every column of B alike and C alike, all of C comes out with one value, for gemm, tile_gemm,
// forward_gemm and forward_pv in each mode they take, on every target.
TEST(Targets, GemmFinishesEveryElementAlike) {
  using namespace detail::simd;
  const std::size_t M = 7, N = 70, K = 96, ldc = N;
  std::vector<float> A(M * K), B(K * N), row_scale(M, 0.8173f);
  for (std::size_t k = 0; k < K; ++k) {
    const float a = static_cast<float>(std::sin(0.37 * k)), b = static_cast<float>(std::cos(0.91 * k + 0.2));
    for (std::size_t m = 0; m < M; ++m) A[m * K + k] = a;
    for (std::size_t n = 0; n < N; ++n) B[k * N + n] = b;
  }
  for_each_target([&](const std::string&) {
    for (GemmMode mode : {kOverwrite, kAccumulate, kRescaleAccumulate})
      for (int kernel = 0; kernel < 4; ++kernel) {
        if (kernel == 3 && mode != kRescaleAccumulate) continue;  // forward_pv rescales, always
        std::vector<float> C(M * ldc, 1.7313f);
        if (kernel == 0) gemm(M, N, K, A.data(), K, 1, B.data(), N, C.data(), ldc, mode, row_scale.data());
        if (kernel == 1) tile_gemm(M, N, K, A.data(), K, 1, B.data(), N, C.data(), ldc, mode, row_scale.data());
        if (kernel == 2) forward_gemm(M, N, K, A.data(), K, 1, B.data(), N, C.data(), ldc, mode, row_scale.data());
        if (kernel == 3) forward_pv(M, N, K, A.data(), K, 1, B.data(), N, C.data(), ldc, row_scale.data());
        for (std::size_t i = 0; i < C.size(); ++i) {
          ASSERT_EQ(C[0], C[i]) << "kernel " << kernel << " mode " << mode << " row " << i / ldc << " column "
                                << i % ldc;
        }
      }
  });
}

enum class MaskKind { none, causal_tl, causal_br, window, keep, additive, all };

struct Inputs {
  Tensor q, k, v, mask;
  Options opt;
};

Inputs make_inputs(std::int64_t B, std::int64_t Hq, std::int64_t Hkv, std::int64_t Nq, std::int64_t Nkv,
                   std::int64_t dk, std::int64_t dv, MaskKind m, std::uint64_t seed) {
  Inputs in{random_tensor(DType::f32, {B, Hq, Nq, dk}, seed, 0), random_tensor(DType::f32, {B, Hkv, Nkv, dk}, seed, 1),
            random_tensor(DType::f32, {B, Hkv, Nkv, dv}, seed, 2), Tensor(), Options()};
  switch (m) {
    case MaskKind::none: break;
    case MaskKind::causal_tl: in.opt.mask.causal = true; break;
    case MaskKind::causal_br: in.opt.mask.causal = true; in.opt.mask.align = Align::bottom_right; break;
    case MaskKind::window: in.opt.mask.window_left = 70; in.opt.mask.window_right = 9; break;
    case MaskKind::keep: in.mask = random_tensor(DType::u8, {Nq, Nkv}, seed, 3); break;
    case MaskKind::additive: in.mask = random_tensor(DType::f32, {B, 1, Nq, Nkv}, seed, 3); break;
    case MaskKind::all:
      in.opt.mask.causal = true;
      in.opt.mask.align = Align::bottom_right;
      in.opt.mask.window_left = 80;
      in.mask = random_tensor(DType::u8, {1, Hq, Nq, Nkv}, seed, 3);
      break;
  }
  if (!in.mask.empty()) in.opt.mask.explicit_mask = in.mask.view();
  return in;
}

// The naive float32 composition the rule compares against: S = s·Q·Kᵀ + bias in float32, a
// max-subtracted softmax with std::exp, then P·V — all float32.
Tensor naive_f32(const Inputs& in) {
  const Tensor& q = in.q;
  const std::int64_t B = q.dim(0), Hq = q.dim(1), Nq = q.dim(2), dk = q.dim(3), Hkv = in.k.dim(1),
                     Nkv = in.k.dim(2), dv = in.v.dim(3);
  Tensor probs(DType::f64, {B, Hq, Nq, Nkv}), out(DType::f32, {B, Hq, Nq, dv});
  reference::forward(q.view(), in.k.view(), in.v.view(), {Tensor(DType::f64, {B, Hq, Nq, dv}).view(), {}, probs.view()},
                     in.opt);  // used only for which pairs are visible (probs > 0 or not masked)
  const float s = static_cast<float>(in.opt.scale.resolve(dk));
  std::vector<float> row(Nkv);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < Nq; ++i) {
        const std::int64_t kh = h / (Hq / Hkv);
        const float* qi = q.as<float>() + ((b * Hq + h) * Nq + i) * dk;
        float m = -INFINITY;
        for (std::int64_t j = 0; j < Nkv; ++j) {
          const float* kj = in.k.as<float>() + ((b * Hkv + kh) * Nkv + j) * dk;
          float dot = 0;
          for (std::int64_t c = 0; c < dk; ++c) dot += qi[c] * kj[c];
          float add = 0;
          if (!in.mask.empty() && in.mask.dtype() == DType::f32) add = in.mask.as<float>()[(b * Nq + i) * Nkv + j];
          const bool visible = probs.as<double>()[((b * Hq + h) * Nq + i) * Nkv + j] > 0;
          row[j] = visible ? dot * s + add : -INFINITY;
          m = std::max(m, row[j]);
        }
        float l = 0;
        for (std::int64_t j = 0; j < Nkv; ++j) l += row[j] = m == -INFINITY ? 0.f : std::exp(row[j] - m);
        float* o = out.as<float>() + ((b * Hq + h) * Nq + i) * dv;
        for (std::int64_t c = 0; c < dv; ++c) {
          float acc = 0;
          for (std::int64_t j = 0; j < Nkv; ++j) acc += row[j] * in.v.as<float>()[((b * Hkv + kh) * Nkv + j) * dv + c];
          o[c] = l > 0 ? acc / l : 0.f;
        }
      }
  return out;
}

TEST(Targets, ForwardWithinTwiceNaiveFloat32Error) {
  struct Shape {
    std::int64_t B, Hq, Hkv, Nq, Nkv, dk, dv;
  };
  // Awkward sizes: 1, odd, prime, around the 64-row/key tiles; GQA and MQA; dk != dv.
  const std::vector<Shape> shapes = {{1, 1, 1, 1, 1, 1, 1},     {1, 2, 1, 3, 5, 7, 3},     {2, 4, 2, 67, 131, 16, 24},
                                     {1, 3, 1, 129, 64, 59, 5}, {1, 2, 2, 64, 65, 128, 128}, {1, 1, 1, 200, 257, 33, 70}};
  // The inputs and both references of each case made once, the forward run on every target.
  for (const Shape& s : shapes)
    for (MaskKind m : {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window,
                       MaskKind::keep, MaskKind::additive, MaskKind::all}) {
      const Inputs in = make_inputs(s.B, s.Hq, s.Hkv, s.Nq, s.Nkv, s.dk, s.dv, m, 500 + s.Nq + s.dk);
      Tensor ref(DType::f64, {s.B, s.Hq, s.Nq, s.dv});
      reference::forward(in.q.view(), in.k.view(), in.v.view(), {ref.view()}, in.opt);
      const Tensor naive = naive_f32(in);
      const double theirs = rel_error(naive.view(), ref.view());
      for_each_target([&](const std::string& target) {
        Tensor out(DType::f32, {s.B, s.Hq, s.Nq, s.dv});
        poison(out);
        forward(in.q.view(), in.k.view(), in.v.view(), {out.view()}, in.opt);
        const double ours = rel_error(out.view(), ref.view());
        // A floor of a few float32 ulps for cases where the naive error happens to be ~0 (1 key).
        EXPECT_LE(ours, std::max(2 * theirs, 4e-7))
            << "Nq " << s.Nq << " Nkv " << s.Nkv << " dk " << s.dk << " mask " << static_cast<int>(m);
      });
    }
}

TEST(Targets, DecodeSplitsKeysAndMatchesReference) {
  // Nq * group <= 16 and Nkv >= 2048 takes the split-key decode path; at most kDotRows rows per
  // (batch, KV head) also take the one-dot-product-per-key scores (Nq = 1 below, dk = 37 ragged).
  struct Shape {
    std::int64_t Nq, dk;
  };
  for_each_target([&](const std::string& target) {
    for (const Shape& sh : {Shape{3, 32}, Shape{1, 37}})
      for (MaskKind m : {MaskKind::none, MaskKind::causal_br, MaskKind::keep}) {
        const std::int64_t Nkv = target == "scalar" ? 2100 : 5001;
        const Inputs in = make_inputs(1, 4, 2, sh.Nq, Nkv, sh.dk, 24, m, 77);
        Tensor out(DType::f32, {1, 4, sh.Nq, 24}), lse(DType::f32, {1, 4, sh.Nq}), ref(DType::f64, {1, 4, sh.Nq, 24}),
            rlse(DType::f64, {1, 4, sh.Nq});
        poison(out);
        poison(lse);
        forward(in.q.view(), in.k.view(), in.v.view(), {out.view(), lse.view()}, in.opt);
        reference::forward(in.q.view(), in.k.view(), in.v.view(), {ref.view(), rlse.view()}, in.opt);
        EXPECT_LE(rel_error(out.view(), ref.view()), 2e-6) << static_cast<int>(m) << " Nq " << sh.Nq;
        EXPECT_LE(rel_error(lse.view(), rlse.view()), 1e-6) << static_cast<int>(m) << " Nq " << sh.Nq;
      }
  });
}

TEST(Targets, BackwardMatchesFloat64Reference) {
  struct Shape {
    std::int64_t B, Hq, Hkv, Nq, Nkv, dk, dv;
  };
  const std::vector<Shape> shapes = {{1, 1, 1, 1, 1, 1, 1}, {2, 4, 2, 67, 131, 16, 24}, {1, 3, 1, 129, 70, 33, 5}};
  for_each_target([&](const std::string& target) {
    for (const Shape& s : shapes)
      for (MaskKind m : {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window,
                         MaskKind::keep, MaskKind::additive, MaskKind::all}) {
        const Inputs in = make_inputs(s.B, s.Hq, s.Hkv, s.Nq, s.Nkv, s.dk, s.dv, m, 900 + s.Nq);
        const Tensor dout = random_tensor(DType::f32, {s.B, s.Hq, s.Nq, s.dv}, 900 + s.Nq, 5);
        Tensor out(DType::f32, {s.B, s.Hq, s.Nq, s.dv}), lse(DType::f32, {s.B, s.Hq, s.Nq});
        forward(in.q.view(), in.k.view(), in.v.view(), {out.view(), lse.view()}, in.opt);
        Tensor dq(DType::f32, {s.B, s.Hq, s.Nq, s.dk}), dk(DType::f32, {s.B, s.Hkv, s.Nkv, s.dk}),
            dv(DType::f32, {s.B, s.Hkv, s.Nkv, s.dv});
        Tensor rq(DType::f64, {s.B, s.Hq, s.Nq, s.dk}), rk(DType::f64, {s.B, s.Hkv, s.Nkv, s.dk}),
            rv(DType::f64, {s.B, s.Hkv, s.Nkv, s.dv});
        poison(dq);
        poison(dk);
        poison(dv);
        backward(in.q.view(), in.k.view(), in.v.view(), out.view(), lse.view(), dout.view(),
                 {dq.view(), dk.view(), dv.view()}, in.opt);
        reference::backward(in.q.view(), in.k.view(), in.v.view(), dout.view(), {rq.view(), rk.view(), rv.view()},
                            in.opt);
        const std::string what = "Nq " + std::to_string(s.Nq) + " mask " + std::to_string(static_cast<int>(m));
        EXPECT_LE(rel_error(dq.view(), rq.view()), 1e-4) << what;
        EXPECT_LE(rel_error(dk.view(), rk.view()), 1e-4) << what;
        EXPECT_LE(rel_error(dv.view(), rv.view()), 1e-4) << what;
      }
  });
}

// The float32 forward and backward give the same bits on every target for every call the tile path
// takes: each score, probability and output element is the same chain of operations on every target
// (Gemm's per-element order does not depend on the register tile, e^x is one polynomial, the sums
// across lanes of few-row blocks run in fixed chains and trees, DotSum and Sums4), and kernels.cc is
// compiled without contracting a multiply and an add into an FMA. Shapes: blocks of 64 rows with
// 5, 2 or no rows left over, and 3 rows alone with an explicit mask (without one, so few rows take
// the cache decode, kv_*.cc, whose sums across lanes depend on the lane count). Soft-capping
// is left out on the scalar target (its tanh rounds each multiply and add apart).
TEST(Targets, FloatForwardAndBackwardSameBitsOnEveryTarget) {
  struct Shape {
    std::int64_t B, Hq, Hkv, Nq, Nkv, dk, dv;
  };
  const std::vector<Shape> shapes = {{2, 4, 2, 69, 131, 16, 24}, {1, 3, 1, 133, 70, 33, 5}, {1, 2, 2, 64, 1, 80, 80},
                                     {2, 4, 2, 66, 131, 37, 24}, {1, 3, 3, 3, 100, 61, 19}};
  const auto bits = [](const Tensor& t) {
    return std::vector<unsigned char>(t.as<unsigned char>(), t.as<unsigned char>() + t.nbytes());
  };
  for (const Shape& s : shapes)
    for (MaskKind m : {MaskKind::none, MaskKind::causal_br, MaskKind::window, MaskKind::keep, MaskKind::additive,
                       MaskKind::all})
      for (double cap : {0.0, 5.0}) {
        const bool explicit_mask = m == MaskKind::keep || m == MaskKind::additive || m == MaskKind::all;
        if (s.Nq <= 4 && !explicit_mask) continue;  // the cache decode's
        Inputs in = make_inputs(s.B, s.Hq, s.Hkv, s.Nq, s.Nkv, s.dk, s.dv, m, 1300 + s.Nq);
        in.opt.softcap = cap;
        const Tensor dout = random_tensor(DType::f32, {s.B, s.Hq, s.Nq, s.dv}, 1300 + s.Nq, 5);
        std::vector<std::vector<unsigned char>> first;
        for_each_target([&](const std::string& target) {
          if (cap > 0 && target == "scalar") return;
          Tensor out(DType::f32, {s.B, s.Hq, s.Nq, s.dv}), lse(DType::f32, {s.B, s.Hq, s.Nq}),
              dq(DType::f32, {s.B, s.Hq, s.Nq, s.dk}), dk(DType::f32, {s.B, s.Hkv, s.Nkv, s.dk}),
              dv(DType::f32, {s.B, s.Hkv, s.Nkv, s.dv});
          forward(in.q.view(), in.k.view(), in.v.view(), {out.view(), lse.view()}, in.opt);
          backward(in.q.view(), in.k.view(), in.v.view(), out.view(), lse.view(), dout.view(),
                   {dq.view(), dk.view(), dv.view()}, in.opt);
          const std::vector<std::vector<unsigned char>> now = {bits(out), bits(lse), bits(dq), bits(dk), bits(dv)};
          if (first.empty()) first = now;
          for (std::size_t x = 0; x < now.size(); ++x)
            EXPECT_TRUE(now[x] == first[x]) << "output " << x << " (out, lse, dq, dk, dv) Nq " << s.Nq << " mask "
                                            << static_cast<int>(m) << " softcap " << cap;
        });
      }
}

}  // namespace
}  // namespace attnscale
