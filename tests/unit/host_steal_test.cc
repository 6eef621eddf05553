// The steal share of /proc/stat's cpu line (cli/host_steal.h).
#include "cli/host_steal.h"

#include <gtest/gtest.h>

namespace attnscale::cli {
namespace {

TEST(HostSteal, ParsesTheCpuLineUpToSteal) {
  const CpuTimes t = parse_cpu_line("cpu  9986437 117214 1091531 1949379 8992 0 4417 36775 5 7");
  ASSERT_TRUE(t.known);
  EXPECT_EQ(t.steal, 36775u);
  EXPECT_EQ(t.total, 9986437u + 117214 + 1091531 + 1949379 + 8992 + 0 + 4417 + 36775);  // not guest's
}

TEST(HostSteal, RefusesOtherLinesAndShortOnes) {
  EXPECT_FALSE(parse_cpu_line("cpu0 1 2 3 4 5 6 7 8").known);
  EXPECT_FALSE(parse_cpu_line("cpu 1 2 3 4 5 6 7").known);  // no steal column (kernels before 2.6.11)
  EXPECT_FALSE(parse_cpu_line("").known);
}

TEST(HostSteal, ShareBetweenTwoReadings) {
  const CpuTimes a = parse_cpu_line("cpu 100 0 0 100 0 0 0 0");
  const CpuTimes b = parse_cpu_line("cpu 180 0 0 110 0 0 0 10");
  EXPECT_DOUBLE_EQ(steal_share(a, b), 10.0 / 100.0);
  EXPECT_LT(steal_share(a, a), 0);  // no time between them
  EXPECT_LT(steal_share(CpuTimes{}, b), 0);
}

}  // namespace
}  // namespace attnscale::cli
