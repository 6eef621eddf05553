// The report's registry: one Unit per line of lab/experiments/list.h (each defined in that
// experiment's report.cc).
#include "report/unit.h"

namespace attnscale::report {

#define ATTNSCALE_UNIT(name, id) Unit unit_##name();
#include "lab/experiments/list.h"
#undef ATTNSCALE_UNIT

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
