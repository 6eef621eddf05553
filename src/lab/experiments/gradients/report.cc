// The gradients experiment in the report: the softmax Jacobian of a row and the gradient that
// reaches Q through attention, scaled and unscaled.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "report/query.h"
#include "report/unit.h"

namespace attnscale::report {
namespace {

std::vector<Figure> figures(const lab::ResultTable& t) {
  const std::string n = values(t, "n").front();
  Figure f{"gradients"};
  f.width = 960;
  f.height = 460;
  f.legend_below = true;
  LinePanel& a = f.lines("Softmax Jacobian ‖diag(p) − pp^{T}‖_{F} per row", "d_{k}", "‖J‖_{F}");
  a.logx = a.logy = true;
  LinePanel& b = f.lines("End to end: ‖∂L/∂Q‖_{F} through attention", "d_{k}", "‖∂L/∂Q‖_{F}");
  b.logx = b.logy = true;
  int colour = 0;
  for (const auto& s : values(t, "scaling")) {
    auto add = [&](LinePanel& p, const char* metric, const std::string& what, bool secondary) {
      Series ser = series(t, "d", metric, {{"n", n}, {"scaling", s}}, scaling_title(s) + ", " + what);
      ser.colour = colour;
      ser.secondary = secondary;
      p.series.push_back(std::move(ser));
    };
    add(a, "jacobian_fro_median", "median", false);
    add(a, "jacobian_fro_mean", "mean", true);
    add(b, "grad_q_fro_median", "median", false);
    add(b, "grad_q_fro", "mean", true);
    ++colour;
  }
  return {f};
}

struct AtLargestD {
  std::string n, dmax;
  const lab::Row *jac_none, *jac_sqrt, *jac_mean_none, *grad_none, *grad_sqrt;
};

AtLargestD at_largest_d(const lab::ResultTable& t) {
  AtLargestD r;
  r.n = values(t, "n").front();
  r.dmax = largest_value(t, "d");
  auto row = [&](const char* metric, const char* scaling) {
    return &one(t, metric, {{"n", r.n}, {"d", r.dmax}, {"scaling", scaling}});
  };
  r.jac_none = row("jacobian_fro_median", "none");
  r.jac_sqrt = row("jacobian_fro_median", "sqrt");
  r.jac_mean_none = row("jacobian_fro_mean", "none");
  r.grad_none = row("grad_q_fro_median", "none");
  r.grad_sqrt = row("grad_q_fro_median", "sqrt");
  return r;
}

// "a tenth": CIs apart by a factor 10.
bool ten_times_smaller(const lab::Row& small, const lab::Row& large) { return small.ci_high < 0.1 * large.ci_low; }

Slots slots(const lab::ResultTable& t) {
  const AtLargestD g = at_largest_d(t);
  const double jac_drop = g.jac_sqrt->mean / g.jac_none->mean, grad_ratio = g.grad_none->mean / g.grad_sqrt->mean;
  const bool grad_smaller = g.grad_none->ci_high < g.grad_sqrt->ci_low;  // CIs apart
  // The scaled median over every d, not only the largest: "stays" only when it moves by less than
  // a factor 1.5.
  double lo = INFINITY, hi = -INFINITY;
  for (const lab::Row* r : select(t, "jacobian_fro_median", {{"n", g.n}, {"scaling", "sqrt"}}))
    lo = std::min(lo, r->mean), hi = std::max(hi, r->mean);
  return {{"n", g.n},
          {"dmax", g.dmax},
          {"jac_sqrt_lo", fmt(lo, 2)},
          {"jac_sqrt_hi", fmt(hi, 2)},
          {"jac_sqrt_flat", hi <= 1.5 * lo ? "true" : ""},
          {"jac_smaller", jac_drop > 1 ? "true" : ""},
          {"jac_rise", fmt(1 / jac_drop, 2)},
          {"jac_none", fmt_ci(*g.jac_none)},
          {"jac_mean_none", fmt_ci(*g.jac_mean_none)},
          {"jac_drop", fmt(jac_drop, 2)},
          {"jac_collapses", ten_times_smaller(*g.jac_none, *g.jac_sqrt) ? "true" : ""},
          {"mean_hides", g.jac_mean_none->ci_low > 2 * g.jac_none->ci_high ? "true" : ""},
          {"grad_none", fmt_ci(*g.grad_none)},
          {"grad_sqrt", fmt_ci(*g.grad_sqrt)},
          {"grad_ratio", fmt(grad_ratio, 2)},
          {"grad_larger", g.grad_none->ci_low > g.grad_sqrt->ci_high ? "true" : ""},
          {"grad_smaller", grad_smaller ? "true" : ""},
          // "differs" from the Jacobian's picture: the end-to-end gradient is not smaller unscaled
          // where the Jacobian is, or is where the Jacobian is not.
          {"grad_differs", (jac_drop > 1) != grad_smaller ? "true" : ""}};
}

std::vector<Evidence> claims(const lab::ResultTable& t) {
  const AtLargestD g = at_largest_d(t);
  const bool softmax = ten_times_smaller(*g.jac_none, *g.jac_sqrt);
  const bool end_to_end = ten_times_smaller(*g.grad_none, *g.grad_sqrt);
  return {{"small-gradients",
           "without the scale, the softmax's Jacobian and the gradient that reaches Q both become extremely small "
           "at large d_{k}",
           fmt::format("at d={}, N={}, medians over rows: softmax ‖J‖_{{F}} unscaled {}, scaled {}; end-to-end "
                       "‖∂L/∂Q‖_{{F}} unscaled {}, scaled {}",
                       g.dmax, g.n, fmt_ci(*g.jac_none), fmt_ci(*g.jac_sqrt), fmt_ci(*g.grad_none),
                       fmt_ci(*g.grad_sqrt)),
           "supported when both medians, the softmax Jacobian's and the end-to-end gradient's, are below a tenth of "
           "the scaled ones at the largest d (CIs apart); refuted when neither is; mixed when only one is",
           softmax && end_to_end ? Verdict::supported : softmax || end_to_end ? Verdict::mixed : Verdict::refuted}};
}

}  // namespace

Unit unit_gradients() {
  return {.quick = {{{"d", "1,4,16,64,128,512"}}, 10}, .standard = {{}, 100}, .full = {{}, 1000},
          .figures = figures, .slots = slots, .claims = claims};
}

}  // namespace attnscale::report
