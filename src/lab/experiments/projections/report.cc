// The projections experiment in the report: Q and K made as Chuang (2023) makes them, X W_q and
// X W_k, and whether its assumptions (ii)–(iv) then hold.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "report/query.h"
#include "report/unit.h"

namespace attnscale::report {
namespace {

// The axis the sweep varies: the input width dx when several were run, else d.
std::string x_axis(const lab::ResultTable& t) { return values(t, "dx").size() > 1 ? "dx" : "d"; }
std::string widest(const lab::ResultTable& t) {
  return x_axis(t) == "dx" ? largest_value(t, "dx") : values(t, "dx").front();
}

std::vector<Figure> figures(const lab::ResultTable& t) {
  const std::string x = x_axis(t);
  Figure f{"projections"};
  f.width = 960;
  f.height = 460;
  f.legend_below = true;
  for (const auto& ln : values(t, "layernorm")) {
    LinePanel& p = f.lines("Var(q·k/√d_{k}), LayerNorm on X: " + ln, x == "dx" ? "d_{x}" : "d_{k}", "Var(q·k/√d_{k})");
    p.logx = p.logy = true;
    for (const auto& init : values(t, "init"))
      p.series.push_back(series(t, x, "var_qk_scaled", {{"init", init}, {"layernorm", ln}}, init));
    p.refs.push_back({1, "1 (Chuang's target)"});
  }
  return {f};
}

const lab::Row* at(const lab::ResultTable& t, const char* metric, const char* init, const char* ln) {
  const auto rows = select(t, metric, {{"init", init}, {"layernorm", ln}, {"dx", widest(t)}});
  return rows.empty() ? nullptr : rows.front();
}

Slots slots(const lab::ResultTable& t) {
  const std::string dx = widest(t);
  Slots s{{"x_mean", flag(t, "x-mean")}, {"x_std", flag(t, "x-std")}, {"dx", dx}};
  std::vector<std::vector<std::string>> rows;
  double worst_corr = 0;
  for (const auto& ln : values(t, "layernorm"))
    for (const auto& init : values(t, "init")) {
      const Fixed fx{{"init", init}, {"layernorm", ln}, {"dx", dx}};
      auto get = [&](const char* m) {
        const auto r = select(t, m, fx);
        return r.empty() ? std::string("—") : fmt_ci(*r.front(), 3);
      };
      for (const lab::Row* r : select(t, "corr_qk", fx)) worst_corr = std::max({worst_corr, std::abs(r->ci_low), std::abs(r->ci_high)});
      rows.push_back({init, ln, get("mean_q"), get("var_q"), get("corr_qk"), get("var_qk"), get("var_qk_scaled")});
    }
  s["table"] = md_table({"init", "LayerNorm", "mean of q_{i}", "Var q_{i}", "Corr(q_{i}, k_{i})", "Var(q·k)", "Var(q·k/√d_{k})"}, rows);
  s["worst_corr"] = fmt(worst_corr, 2);
  s["corr_small"] = worst_corr < 0.05 ? "true" : "";
  const lab::Row *on = at(t, "var_qk_scaled", "scaled", "on"), *off = at(t, "var_qk_scaled", "scaled", "off"),
                 *normal_on = at(t, "var_qk_scaled", "normal", "on");
  if (on && off && normal_on) {
    s["both"] = "true";
    s["scaled_on"] = fmt_ci(*on);
    s["scaled_on_unit"] = covers(*on, 1.0) || std::abs(on->mean - 1) < 0.05 ? "true" : "";
    s["scaled_off"] = fmt_ci(*off);
    s["normal_on"] = fmt_ci(*normal_on);
  }
  return s;
}

std::vector<Evidence> claims(const lab::ResultTable& t) {
  const lab::Row *off = at(t, "var_qk_scaled", "scaled", "off"), *on = at(t, "var_qk_scaled", "scaled", "on");
  if (!off || !on) return {};
  // "fails": the scaled variance at least a factor 2 away from 1; "holds": 1 inside the CI or within 5%.
  const bool fails_off = off->ci_low > 2 || off->ci_high < 0.5;
  const bool holds_on = covers(*on, 1.0) || std::abs(on->mean - 1) < 0.05;
  const bool holds_off = off->ci_low > 0.8 && off->ci_high < 1.25;
  return {{"layernorm-reason",
           "without LayerNorm the scaled logits' variance is not 1; with it, it is",
           fmt::format("N(0, 1/d_{{x}}) weights, d_{{x}}={}, inputs of mean {} and sd {}: Var(q·k/√d_{{k}}) = {} "
                       "without LayerNorm, {} with it",
                       widest(t), flag(t, "x-mean"), flag(t, "x-std"), fmt_ci(*off), fmt_ci(*on)),
           "how often the scale is used is practice (the training experiment); the reason given is judged here: "
           "supported when without LayerNorm the scaled variance is more than a factor 2 from 1 (CI) and with it 1 "
           "lies inside the CI or within 5%; refuted when without LayerNorm it lies within [0.8, 1.25]; mixed "
           "otherwise. The inputs' mean and sd are the experiment's flags: other inputs give other numbers",
           fails_off && holds_on ? Verdict::supported : holds_off ? Verdict::refuted : Verdict::mixed}};
}

}  // namespace

Unit unit_projections() {
  return {.quick = {{{"dx", "16,64,256"}}, 20},
          .standard = {{{"dx", "16,32,64,128,256,512"}}, 100},
          .full = {{{"dx", "16,32,64,128,256,512"}}, 1000},
          .figures = figures, .slots = slots, .claims = claims};
}

}  // namespace attnscale::report
