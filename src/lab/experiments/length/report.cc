// The length experiment in the report: attention rows as the sequence grows, for three temperature
// rules.
#include <cmath>

#include <fmt/format.h>

#include "report/query.h"
#include "report/unit.h"

namespace attnscale::report {
namespace {

constexpr const char* kRemTheoryTitle = "theory (REM, N → ∞, where valid)";

std::string rule_title(const std::string& r) {
  if (r == "fixed") return "1/√d (fixed)";
  if (r == "sqrt-log") return "√(ln N)/√d";
  if (r == "log") return "ln N/√d";
  return r;
}

std::vector<Figure> figures(const lab::ResultTable& t) {
  const std::string d = values(t, "d").front();
  Figure f{"length"};
  f.width = 960;
  f.height = 460;
  f.legend_below = true;
  LinePanel& a = f.lines("Entropy of a row against N (d_{k} = " + d + ")", "N", "entropy (nats)");
  a.logx = true;
  LinePanel& b = f.lines("Largest weight in a row", "N", "max_{j} p_{ij}");
  b.logx = b.logy = true;
  a.theory_title = b.theory_title = kRemTheoryTitle;
  for (const auto& r : values(t, "rule")) {
    a.series.push_back(series(t, "n", "entropy", {{"d", d}, {"rule", r}}, rule_title(r)));
    b.series.push_back(series(t, "n", "max_weight", {{"d", d}, {"rule", r}}, rule_title(r)));
  }
  // ln N, the entropy of uniform attention, as a reference curve.
  Series ln;
  ln.title = "ln N (uniform)";
  for (double x : a.series.front().x) ln.x.push_back(x), ln.y.push_back(std::log(x));
  a.series.push_back(ln);
  return {f};
}

Slots slots(const lab::ResultTable& t) {
  const std::string d = values(t, "d").front(), nmax = largest_value(t, "n"), nmin = smallest_value(t, "n");
  // The smallest N whose fixed-rule entropy carries a theory value (the table decides, not the caption).
  std::string from;
  for (const lab::Row* r : select(t, "entropy", {{"d", d}, {"rule", "fixed"}}))
    if (r->theory && (from.empty() || std::stod(param(t, *r, "n")) < std::stod(from))) from = param(t, *r, "n");
  const lab::Row& e0 = one(t, "entropy", {{"n", nmin}, {"d", d}, {"rule", "fixed"}});
  const lab::Row& e1 = one(t, "entropy", {{"n", nmax}, {"d", d}, {"rule", "fixed"}});
  const lab::Row& m0 = one(t, "max_weight", {{"n", nmin}, {"d", d}, {"rule", "fixed"}});
  const lab::Row& m1 = one(t, "max_weight", {{"n", nmax}, {"d", d}, {"rule", "fixed"}});
  // "tracks ln N − ½": the entropy at the largest N within 0.1 nats of ln N − ½.
  const double target = std::log(std::stod(nmax)) - 0.5;
  Slots s{{"d", d},
          {"nmin", nmin},
          {"nmax", nmax},
          {"theory_from", from},
          {"has_theory", from.empty() ? "" : "true"},
          {"entropy_min", fmt_ci(e0)},
          {"entropy_max", fmt_ci(e1)},
          {"ln_n_half", fmt(target, 3)},
          {"tracks", std::abs(e1.mean - target) < 0.1 ? "true" : ""},
          {"rises", e1.ci_low > e0.ci_high ? "true" : ""},
          {"max_weight_min", fmt_ci(m0)},
          {"max_weight", fmt_ci(m1)}};
  s.merge(change_slots("weight", m0, m1));  // "falls" only where the intervals are apart
  // The √(ln N) rule's largest weight from the smallest to the largest N, told by the intervals as
  // the fixed rule's is, with the factor each rule's weight falls by: its weight falls too, only
  // less, so "keeps" would not follow from the rows.
  const auto sl0 = select(t, "max_weight", {{"n", nmin}, {"d", d}, {"rule", "sqrt-log"}});
  const auto sl1 = select(t, "max_weight", {{"n", nmax}, {"d", d}, {"rule", "sqrt-log"}});
  if (!sl0.empty() && !sl1.empty()) {
    s["sqrt_log"] = "true";
    s["sqrt_log_min"] = fmt_ci(*sl0.front());
    s["sqrt_log_max"] = fmt_ci(*sl1.front());
    s["sqrt_log_factor"] = fmt(sl0.front()->mean / sl1.front()->mean, 2);
    s["fixed_factor"] = fmt(m0.mean / m1.mean, 2);
    s["sqrt_log_higher"] = sl1.front()->ci_low > m1.ci_high ? "true" : "";
    s.merge(change_slots("sqrt_log_weight", *sl0.front(), *sl1.front()));
  }
  return s;
}

}  // namespace

Unit unit_length() {
  return {.quick = {{{"n", "8,64,512"}}, 10}, .standard = {{}, 50}, .full = {{}, 500},
          .figures = figures, .slots = slots};
}

}  // namespace attnscale::report
