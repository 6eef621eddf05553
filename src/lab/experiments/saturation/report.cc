// The saturation experiment in the report: the Simulation note's top_p_95 sweep at scale.
#include <cmath>

#include <fmt/format.h>

#include "report/query.h"
#include "report/unit.h"

namespace attnscale::report {
namespace {

// Legend entry of the REM curves: the asymptotic formulas, shown only where they hold (lab/theory.h).
constexpr const char* kRemTheoryTitle = "theory (REM, N → ∞, where valid)";
// The Simulation note's readings of its chart, drawn in their own colour (not the theory's).
constexpr const char* kCitedColour = "#8B1A4A";

std::vector<Figure> figures(const lab::ResultTable& t) {
  const std::string n = values(t, "n").front();
  Figure f{"saturation"};
  f.width = 960;
  f.height = 460;
  LinePanel& a = f.lines("top\\_p\\_95 (tokens holding 95% of the mass), N = " + n, "d_{k}", "top\\_p\\_95");
  a.logx = true;
  f.legend_below = true;
  LinePanel& b = f.lines("Entropy of a row (nats)", "d_{k}", "entropy");
  b.logx = true;
  a.theory_title = b.theory_title = kRemTheoryTitle;
  for (const auto& s : values(t, "scaling")) {
    Series top = series(t, "d", "top_p_95", {{"n", n}, {"scaling", s}}, scaling_title(s));
    for (double& th : top.theory) th += 0.5;  // the integer count sits ½ above the continuous formula (docs/lab.md)
    a.series.push_back(std::move(top));
    b.series.push_back(series(t, "d", "entropy", {{"n", n}, {"scaling", s}}, scaling_title(s)));
  }
  if (n == "50") {
    a.refs.push_back({38, "Simulation note: 38", kCitedColour});
    a.refs.push_back({2, "Simulation note: 2", kCitedColour});
  }
  b.refs.push_back({std::log(std::stod(n)), "ln N (uniform)"});
  return {f};
}

bool has(const lab::ResultTable& t, const std::string& n, const char* d, const char* scaling) {
  return !select(t, "top_p_95", {{"n", n}, {"d", d}, {"scaling", scaling}}).empty();
}

Slots slots(const lab::ResultTable& t) {
  const std::string n = values(t, "n").front();
  Slots s{{"n", n}, {"at50", n == "50" ? "true" : ""}};
  auto top = [&](const char* d, const char* scaling) {
    return one(t, "top_p_95", {{"n", n}, {"d", d}, {"scaling", scaling}});
  };
  if (has(t, n, "64", "sqrt") && has(t, n, "128", "none") && has(t, n, "1", "none")) {
    const lab::Row &s64 = top("64", "sqrt"), &u1 = top("1", "none"), &u128 = top("128", "none"),
                   &s128 = top("128", "sqrt");
    s["compare"] = "true";
    s["scaled64"] = fmt_ci(s64);
    s["scaled128"] = fmt(s128.mean, 3);
    s["unscaled1"] = fmt_ci(u1);
    s["unscaled128"] = fmt_ci(u128);
    s["unscaled128_mean"] = fmt(u128.mean, 3);
    // "stays flat": the scaled count at d = 128 within 5% of N of the one at d = 64.
    s["scaled_flat"] = std::abs(s128.mean - s64.mean) <= 0.05 * std::stod(n) ? "true" : "";
    // "falls" from d = 1 to d = 128 only where their intervals are apart.
    s.merge(change_slots("unscaled", u1, u128));
  }
  if (has(t, n, "64", "linear")) {
    const lab::Row& l64 = top("64", "linear");
    s["linear64"] = fmt_ci(l64);
    // "towards uniform": within 10% of N keys of the uniform row's 0.95·N.
    s["linear_uniform"] = l64.mean >= 0.85 * std::stod(n) ? "true" : "";
    s["has_linear"] = "true";
  }
  return s;
}

std::vector<Evidence> claims(const lab::ResultTable& t) {
  std::vector<Evidence> out;
  const auto row = [&](const char* metric, const char* d, const char* scaling) {
    return one(t, metric, {{"n", "50"}, {"d", d}, {"scaling", scaling}});
  };
  const lab::Row &s64 = row("top_p_95", "64", "sqrt"), &s128 = row("top_p_95", "128", "sqrt"),
                 &u128 = row("top_p_95", "128", "none");
  out.push_back({"top38", "top_p_95 ≈ 38 (N = 50)", fmt::format("d=64: {}; d=128: {}", fmt_ci(s64), fmt_ci(s128)),
                 "supported when the mean at d=64 is within ±1.5 tokens of 38 (the note quotes a rounded reading of "
                 "a chart)",
                 judge(std::abs(s64.mean - 38) <= 1.5)});
  out.push_back({"top2", "top_p_95 ≈ 2 at d = 128 (N = 50)", "d=128: " + fmt_ci(u128),
                 "supported when the mean at d=128 is within ±0.5 of 2", judge(std::abs(u128.mean - 2) <= 0.5)});
  const lab::Row &mu = row("max_weight", "64", "none"), &ms = row("max_weight", "64", "sqrt");
  out.push_back({"heatmap", "unscaled: the largest weight of a row dominates; scaled: spread",
                 fmt::format("largest weight per row at d=64: unscaled {}, scaled {}", fmt_ci(mu), fmt_ci(ms)),
                 "supported when the unscaled largest weight's CI lies above 0.5 and the scaled one's below 0.25",
                 judge(mu.ci_low > 0.5 && ms.ci_high < 0.25)});
  return out;
}

}  // namespace

Unit unit_saturation() {
  return {.quick = {{{"d", "1,4,16,64,128,512"}}, 20}, .standard = {{}, 200}, .full = {{}, 2000},
          .figures = figures, .slots = slots, .claims = claims};
}

}  // namespace attnscale::report
