// The lab's promise about a row's interval (src/lab/stats.h), as the tests check it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "lab/results.h"

namespace attnscale::testing {

// Row r's interval is none (NaN at both ends) or holds its mean with some width and lies in the
// metric's range [lo, hi] (up to slack). Whether r had an interval, for the caller's count.
inline bool expect_interval_sound(const lab::Row& r, double lo, double hi, const std::string& what, double slack = 0) {
  if (std::isnan(r.ci_low) || std::isnan(r.mean)) {
    EXPECT_TRUE(std::isnan(r.ci_high)) << what;
    return false;
  }
  EXPECT_LT(r.ci_low, r.ci_high) << what;
  EXPECT_LE(r.ci_low, r.mean) << what;
  EXPECT_LE(r.mean, r.ci_high) << what;
  EXPECT_GE(r.ci_low, lo - slack) << what;
  EXPECT_LE(r.ci_high, hi + slack) << what;
  return true;
}

}  // namespace attnscale::testing
