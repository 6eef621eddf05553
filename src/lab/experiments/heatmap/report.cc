// The heatmap experiment in the report: the Simulation note's attention maps, one draw.
#include <algorithm>

#include <fmt/format.h>

#include "report/query.h"
#include "report/unit.h"

namespace attnscale::report {
namespace {

// The colour scale's floor: weights below it share its colour. Uniform weights over N = 50 keys
// are 0.02, so a log scale from 10⁻⁴ shows the scaled rows' spread instead of one dark field.
constexpr double kFloor = 1e-4;

std::vector<Figure> figures(const lab::ResultTable& t) {
  const std::string n = values(t, "n").front(), d = values(t, "d").front(), trial = values(t, "trial").front();
  const int side = std::stoi(n);
  Figure f{"heatmap"};
  f.width = 1000;
  f.height = 390;
  auto panel = [&](const std::string& scaling, const std::string& axis, const std::string& title) {
    const Fixed at{{"scaling", scaling}, {"axis", axis}, {"trial", trial}, {"d", d}, {"n", n}};
    if (select(t, "p", at).empty()) return;
    HeatPanel& h = f.heat(title, "key j", "query i");
    h.rows = h.cols = side;
    h.cbmin = kFloor;
    h.logcb = true;
    h.values.assign(static_cast<std::size_t>(side) * side, 0.0);
    for (const lab::Row* r : select(t, "p", at))
      h.values[std::stoul(param(t, *r, "i")) * side + std::stoul(param(t, *r, "j"))] = r->mean;
  };
  panel("none", "row", "unscaled (rows sum to 1)");
  panel("sqrt", "row", "1/√d_{k} (rows sum to 1)");
  panel("sqrt", "column", "1/√d_{k}, column-wise");
  return {f};
}

Slots slots(const lab::ResultTable& t) {
  const std::string n = values(t, "n").front(), d = values(t, "d").front(), trial = values(t, "trial").front();
  Slots s{{"n", n}, {"d", d}, {"uniform", fmt(1 / std::stod(n), 2)}};
  auto top = [&](const char* scaling) {
    return select(t, "top_p_95", {{"scaling", scaling}, {"axis", "row"}, {"d", d}, {"trial", trial}});
  };
  auto largest = [&](const char* scaling) {
    double m = 0;
    for (const lab::Row* r : select(t, "p", {{"scaling", scaling}, {"axis", "row"}, {"d", d}, {"trial", trial}}))
      m = std::max(m, r->mean);
    return m;
  };
  if (!top("none").empty() && !top("sqrt").empty()) {
    s["top"] = "true";
    s["top_none"] = fmt(top("none").front()->mean, 3);
    s["top_sqrt"] = fmt(top("sqrt").front()->mean, 3);
    s["max_none"] = fmt(largest("none"), 3);
    s["max_sqrt"] = fmt(largest("sqrt"), 3);
  }
  return s;
}

}  // namespace

Unit unit_heatmap() {
  return {.quick = {{}, 1}, .standard = {{}, 1}, .full = {{}, 1},
          .figures = figures, .slots = slots};
}

}  // namespace attnscale::report
