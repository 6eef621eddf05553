// A bench row's ratio to its limit, from the limit timed right before the row and right after it.
//
// On a shared host the machine's limits move while a bench runs. On a 2-vCPU cloud guest (Zen 3,
// 2026-12-07) the FMA loop on both threads read 101-104 GFLOP/s in some rounds and 195-204 in the
// others, for tens of milliseconds at a time; `build/bin/fma_rounds --rounds 20000` (bench/) found a
// thread slow while on the CPU all along (its CPU time equal to its wall time, so no steal time
// showed it) in 2365 rounds, its loop taking 1.93x the median, half speed, as if the physical
// core's other hardware thread had work of another tenant. A ratio taken against
// a limit timed once, before the row, is then off by up to 2x whenever the host changed in between.
// Timing the limit on both sides tells the rounds where it held from those where it moved:
//   ratio  = the row's rate / the mean of the two limit rates;
//   steady = the two within kSteadyTolerance of each other (of the larger), and neither under
//            kSlowShare of the limit's median over the whole run.
// The second condition catches a round that fell wholly inside a slow spell: both limit timings
// then agree, at about half the limit, while a row less bound by the FMA pipes than the loop loses
// less than half of its rate, so its ratio would read high. The median of a limit's timings over
// the run is its rate outside the spells as long as they hold fewer than half of its timings (the
// table's notes count them: slow_timings).
// The table's ratio is the median over the steady rounds, or over every round when none was steady
// (then marked 0/N): a host change that comes and goes within one row is not seen by either side.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

namespace attnscale::cli {

inline constexpr double kSteadyTolerance = 0.15;

// Timings of a limit under kSlowShare of its median over the run (`median`, the one the table
// reports): the spells in which the host slowed the cores (a compute limit at half its rate) or
// the memory, which the table's notes count so that a reader sees how often the machine moved
// under the run.
inline constexpr double kSlowShare = 0.6;

inline int slow_timings(const std::vector<double>& rates, double median) {
  return static_cast<int>(std::count_if(rates.begin(), rates.end(), [&](double r) { return r < kSlowShare * median; }));
}

struct LimitBracket {
  double before = 0, after = 0;  // the limit's rate right before the row and right after it
  double rate = 0;               // the row's rate, in the limit's unit

  double ratio() const { return rate / (0.5 * (before + after)); }
  // `median`: the limit's median over the run.
  bool steady(double median) const {
    return std::abs(after - before) <= kSteadyTolerance * std::max(before, after) &&
           std::min(before, after) >= kSlowShare * median;
  }
};

// The ratios a row's summary is taken over: the steady rounds', else every round's; `limit_median`
// is the limit's median over the run.
struct BracketSummary {
  std::vector<double> ratios;
  int steady = 0, rounds = 0;
};

inline BracketSummary summarise(const std::vector<LimitBracket>& rounds, double limit_median) {
  BracketSummary s;
  s.rounds = static_cast<int>(rounds.size());
  for (const LimitBracket& b : rounds)
    if (b.steady(limit_median)) s.ratios.push_back(b.ratio());
  s.steady = static_cast<int>(s.ratios.size());
  if (s.ratios.empty())
    for (const LimitBracket& b : rounds) s.ratios.push_back(b.ratio());
  return s;
}

}  // namespace attnscale::cli
