// The saturation experiment's fast path: vectorised normals (normals.h), batched row metrics
// (row_metrics_batch.h), and float32 against float64 on the Simulation note's sweep.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "attnscale/error.h"
#include "lab/attention_rows.h"
#include "lab/experiment.h"
#include "lab/normals.h"
#include "lab/results.h"
#include "lab/row_metrics_batch.h"
#include "lab/rng.h"

namespace attnscale::lab {
namespace {

// Element 64g + 16m + l comes from Philox block 16g + l (Random123, through Stream::block) by
// Box-Muller on its words: checks the vectorised Philox and the layout (a wrong word changes the
// value completely; the tolerance is the float32 Box-Muller's).
TEST(LabNormals, MatchScalarPhiloxAndBoxMuller) {
  const Stream s(0x123456789abcdefull, 0x0badf00d, 77);
  const std::uint64_t offset = 64 * ((1ull << 28) - 3);  // crosses 2^32 blocks: the index's high word
  const std::int64_t n = 64 * 5 + 13;
  std::vector<double> z(n);
  fill_normals(s, offset, n, z.data());
  for (std::int64_t e = 0; e < n; ++e) {
    const std::uint64_t g = (offset + e) / 64, m = (offset + e) % 64 / 16, l = (offset + e) % 16;
    const auto w = s.block(16 * g + l);
    auto u = [](std::uint32_t x) { return (x / 2 + 0.5) / 2147483648.0; };
    const double r = std::sqrt(-2 * std::log(u(w[m < 2 ? 0 : 2])));
    const double theta = 3.141592653589793 * (2 * u(w[m < 2 ? 1 : 3]) - 1);
    const double want = r * (m % 2 == 0 ? std::cos(theta) : std::sin(theta));
    EXPECT_NEAR(z[e], want, 2e-6 * (1 + std::abs(want))) << e;  // float32 Box-Muller
  }
}

TEST(LabNormals, PureFunctionOfTheIndexInBothPrecisions) {
  const Stream s(5, 6, 7);
  std::vector<double> all(1000);
  fill_normals(s, 0, 1000, all.data());
  for (std::int64_t start : {0, 64, 128, 320, 896}) {
    for (std::int64_t len : {1, 7, 63, 64, 65, 100}) {
      if (start + len > 1000) continue;
      std::vector<double> part(len);
      fill_normals(s, start, len, part.data());
      for (std::int64_t i = 0; i < len; ++i) EXPECT_EQ(part[i], all[start + i]) << start << "+" << i;
    }
  }
  std::vector<float> f(1000);
  fill_normals(s, 0, 1000, f.data());
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(f[i], static_cast<float>(all[i]));
  EXPECT_THROW(fill_normals(s, 32, 4, all.data()), Error);
  std::vector<double> other(1000);
  fill_normals(Stream(5, 6, 8), 0, 1000, other.data());
  EXPECT_NE(other, all);
}

TEST(LabNormals, MomentsAreStandardNormal) {
  const std::int64_t n = 1 << 20;
  std::vector<double> z(n);
  fill_normals(Stream(1, 2, 3), 0, n, z.data());
  double m1 = 0, m2 = 0, m4 = 0, tail = 0;
  for (double x : z) {
    m1 += x;
    m2 += x * x;
    m4 += x * x * x * x;
    tail += std::abs(x) > 3;
  }
  m1 /= n, m2 /= n, m4 /= n, tail /= n;
  EXPECT_NEAR(m1, 0, 5 * std::sqrt(1.0 / n));
  EXPECT_NEAR(m2, 1, 5 * std::sqrt(2.0 / n));
  EXPECT_NEAR(m4, 3, 5 * std::sqrt(96.0 / n));
  EXPECT_NEAR(tail, 0.0026998, 5 * std::sqrt(0.0027 / n));  // P(|z| > 3)
}

TEST(LabRowMetrics, SortingNetworkSortsEveryLength) {
  std::mt19937 gen(3);
  for (std::int64_t n = 1; n <= 130; ++n) {
    std::vector<float> x(n);
    for (auto& v : x) v = static_cast<float>(gen() % 17);  // many ties
    auto want = x;
    std::sort(want.begin(), want.end(), std::greater<float>());
    for (const auto& [i, j] : sorting_network(n)) {
      ASSERT_LT(i, j);
      ASSERT_LT(j, n);
      if (x[i] < x[j]) std::swap(x[i], x[j]);
    }
    EXPECT_EQ(x, want) << "n = " << n;
  }
}

// The batched metrics against the scalar row_metrics on softmax rows of awkward lengths, with
// exact zeros, ties and one-hot rows.
TEST(LabRowMetrics, BatchMatchesScalarDefinition) {
  std::mt19937 gen(11);
  std::normal_distribution<double> normal;
  for (std::int64_t n : {1, 2, 3, 7, 16, 17, 50, 97, 300}) {
    const std::int64_t rows = 37;
    std::vector<float> p(rows * n);
    for (std::int64_t r = 0; r < rows; ++r) {
      const double sigma = r % 5 == 0 ? 60.0 : 0.2 * (r % 13);  // frozen (zeros, one-hot) to flat
      std::vector<double> x(n);
      double mx = -1e300, z = 0;
      for (auto& v : x) mx = std::max(mx, v = sigma * normal(gen));
      if (r % 7 == 3)
        for (auto& v : x) v = std::round(v);  // ties
      for (auto& v : x) z += std::exp(v - mx);
      for (std::int64_t j = 0; j < n; ++j) p[r * n + j] = static_cast<float>(std::exp(x[j] - mx) / z);
    }
    std::vector<double> got(rows * kRowMetrics), want(kRowMetrics), scratch;
    row_metrics_batch(p.data(), rows, n, got.data());
    for (std::int64_t r = 0; r < rows; ++r) {
      std::vector<double> row(p.begin() + r * n, p.begin() + (r + 1) * n);
      row_metrics(row.data(), n, want.data(), scratch);
      const double* g = got.data() + r * kRowMetrics;
      EXPECT_EQ(g[0], want[0]) << "top_p_95 n=" << n << " row " << r;
      EXPECT_NEAR(g[1], want[1], 2e-6 * (1 + std::log(n))) << "entropy n=" << n << " row " << r;
      EXPECT_EQ(g[2], want[2]) << "max_weight n=" << n << " row " << r;
      EXPECT_NEAR(g[3], want[3], (1e-6 + 1e-7 * n) * want[3])  // float32 sums
          << "participation n=" << n << " row " << r;
    }
  }
}

// float32 (the default) against float64 on the Simulation note's sweep: the same normals (float32 = rounded
// float64), the engine in each precision. Every mean moves by far less than its interval.
TEST(LabSaturation, Float32MatchesFloat64) {
  const auto& sat = find_experiment("saturation");
  std::map<std::string, std::string> f = {{"n", "50"}, {"d", "1,2,4,8,16,32,64,128,256,512"}, {"scaling", "none,sqrt"}};
  const auto a = run_experiment(sat, f, 1, 64, 2);
  f["dtype"] = "f64";
  const auto b = run_experiment(sat, f, 1, 64, 2);
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (std::size_t i = 0; i < a.rows.size(); ++i) {
    const auto& x = a.rows[i];
    const auto& y = b.rows[i];
    ASSERT_EQ(x.params, y.params);
    const double half = (y.ci_high - y.ci_low) / 2;
    EXPECT_LE(std::abs(x.mean - y.mean), 0.02 * half + 1e-9)
        << x.metric << " d=" << x.params[1] << " " << x.params[2] << ": f32 " << x.mean << " f64 " << y.mean;
  }
}

// Chunked trials (several chunks of 16), both samplers of auto, float32 and float64: 1 and 2
// threads give byte-identical CSV.
TEST(LabSaturation, ChunkedRunIsIndependentOfThreads) {
  const auto& sat = find_experiment("saturation");
  for (const char* dtype : {"f32", "f64"}) {
    const std::map<std::string, std::string> f = {{"n", "7,50"}, {"d", "3,64"}, {"dtype", dtype}};
    EXPECT_EQ(to_csv(run_experiment(sat, f, 3, 41, 1)), to_csv(run_experiment(sat, f, 3, 41, 2))) << dtype;
  }
}

}  // namespace
}  // namespace attnscale::lab
