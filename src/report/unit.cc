// The report's registry: one Unit per line of lab/experiments/list.h (each defined in that
// experiment's report.cc).
#include "report/unit.h"

#include <cmath>

namespace attnscale::report {

#define ATTNSCALE_UNIT(name, id) Unit unit_##name();
#include "lab/experiments/list.h"
#undef ATTNSCALE_UNIT

int misses_chance_allows(int n) {
  int k = 0;
  double tail = 1;                // P(X ≥ k)
  double pk = std::pow(0.95, n);  // P(X = k)
  while (k < n) {
    tail -= pk;  // now P(X ≥ k + 1)
    if (tail < 0.01) break;
    pk *= (n - k) / (k + 1.0) * (0.05 / 0.95);
    ++k;
  }
  return k;
}

namespace {
// The rows with an interval: one without (NaN ends: too few trials, or every trial the same with no
// bound to reach from, lab/stats.h) is no evidence either way, not a miss.
std::vector<std::pair<const lab::Row*, double>> with_interval(const std::vector<std::pair<const lab::Row*, double>>& rows) {
  std::vector<std::pair<const lab::Row*, double>> out;
  for (const auto& row : rows)
    if (!std::isnan(row.first->ci_low) && !std::isnan(row.first->ci_high)) out.push_back(row);
  return out;
}
}  // namespace

bool misses_are_chance(const std::vector<std::pair<const lab::Row*, double>>& all) {
  const auto rows = with_interval(all);
  int misses = 0;
  for (const auto& [r, value] : rows) {
    if (r->ci_low <= value && value <= r->ci_high) continue;
    ++misses;
    const double half = (r->ci_high - r->ci_low) / 2;
    if (!(std::abs(r->mean - value) <= 3 * half)) return false;  // 3 half-widths from the mean: 2 outside
  }
  return misses <= misses_chance_allows(static_cast<int>(rows.size()));
}

Verdict coverage_verdict(const std::vector<std::pair<const lab::Row*, double>>& all) {
  const auto rows = with_interval(all);
  int in = 0;
  for (const auto& [r, value] : rows) in += r->ci_low <= value && value <= r->ci_high;
  if (!rows.empty() && in >= 0.8 * static_cast<double>(rows.size())) return Verdict::supported;
  return rows.empty() || misses_are_chance(rows) ? Verdict::mixed : Verdict::refuted;
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::supported: return "supported";
    case Verdict::refuted: return "refuted";
    case Verdict::mixed: return "mixed";
  }
  return "mixed";
}

const Settings& Unit::settings(Depth depth) const {
  return depth == Depth::quick ? quick : depth == Depth::full ? full : standard;
}

const std::vector<Unit>& units() {
  static const std::vector<Unit> all = [] {
    std::vector<Unit> v;
#define ATTNSCALE_UNIT(unit, id) \
  v.push_back(unit_##unit());    \
  v.back().name = #unit;
#include "lab/experiments/list.h"
#undef ATTNSCALE_UNIT
    return v;
  }();
  return all;
}

}  // namespace attnscale::report
