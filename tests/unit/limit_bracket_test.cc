// A bench row's ratio against its limit timed before and after it (cli/limit_bracket.h).
#include "cli/limit_bracket.h"

#include <gtest/gtest.h>

namespace attnscale::cli {
namespace {

TEST(LimitBracket, RatioOverTheMeanOfBothLimitTimings) {
  const LimitBracket b{200, 180, 95};
  EXPECT_DOUBLE_EQ(b.ratio(), 95.0 / 190.0);
  EXPECT_TRUE(b.steady(200));  // 20 apart, 10% of 200
}

TEST(LimitBracket, SteadyWithinTheToleranceOfTheLarger) {
  EXPECT_TRUE((LimitBracket{100, 100 * (1 - kSteadyTolerance), 1}.steady(100)));
  EXPECT_FALSE((LimitBracket{100, 100 * (1 - kSteadyTolerance) - 1, 1}.steady(100)));
  EXPECT_FALSE((LimitBracket{101, 200, 1}.steady(200)));  // a core's worth before, two after
  EXPECT_FALSE((LimitBracket{200, 101, 1}.steady(200)));
}

TEST(LimitBracket, NotSteadyInsideASlowSpell) {
  // Both timings agree, but at a core's worth of two: the whole round ran in a slow spell.
  EXPECT_TRUE((LimitBracket{102, 101, 70}.steady(0)));
  EXPECT_FALSE((LimitBracket{102, 101, 70}.steady(199)));
  EXPECT_TRUE((LimitBracket{100 * kSlowShare, 100 * kSlowShare, 1}.steady(100)));  // at the share: not under it
  EXPECT_FALSE((LimitBracket{125, 119, 1}.steady(200)));  // within 15%, but one under 0.6 of 200
}

TEST(LimitBracket, SummaryOverSteadyRoundsElseEveryRound) {
  // Two steady rounds among four: only theirs count.
  BracketSummary s = summarise({{200, 198, 140}, {200, 100, 140}, {196, 200, 138}, {100, 200, 70}}, 199);
  EXPECT_EQ(s.steady, 2);
  EXPECT_EQ(s.rounds, 4);
  ASSERT_EQ(s.ratios.size(), 2u);
  EXPECT_DOUBLE_EQ(s.ratios[0], 140.0 / 199.0);
  EXPECT_DOUBLE_EQ(s.ratios[1], 138.0 / 198.0);
  // None steady: every round's ratio, marked by steady = 0.
  s = summarise({{200, 100, 75}, {100, 200, 150}}, 150);
  EXPECT_EQ(s.steady, 0);
  EXPECT_EQ(s.rounds, 2);
  EXPECT_EQ(s.ratios.size(), 2u);
  // A round inside a slow spell (both timings at half the run's median) does not count.
  s = summarise({{200, 198, 140}, {101, 102, 80}, {199, 201, 139}}, 199);
  EXPECT_EQ(s.steady, 2);
  ASSERT_EQ(s.ratios.size(), 2u);
  EXPECT_DOUBLE_EQ(s.ratios[1], 139.0 / 200.0);
  // No rounds (a row without a limit).
  s = summarise({}, 0);
  EXPECT_EQ(s.rounds, 0);
  EXPECT_TRUE(s.ratios.empty());
}

TEST(LimitBracket, SlowTimingsUnderTheShareOfTheMedian) {
  EXPECT_EQ(slow_timings({}, 0), 0);
  EXPECT_EQ(slow_timings({200, 198, 101, 203, 199}, 199), 1);  // one timing at a core's worth of two
  EXPECT_EQ(slow_timings({100, 100 * kSlowShare, 100}, 100), 0);  // at the share: not under it
  EXPECT_EQ(slow_timings({26, 16, 37, 15, 27, 25}, 25.5), 1);      // share 15.3: only 15 under it
}

}  // namespace
}  // namespace attnscale::cli
