// variance: Var(q·k) and Var(s q·k) against d for the scalings none (1), sqrt (1/√d), linear (1/d),
// and the fitted log-log slope of each (the Blog post's question: which c gives Var(c q·k) = 1?).
//
// Theory (Propositions 3-4 with mean μ and standard deviation σ): Var(q·k) = d((σ²+μ²)² − μ⁴), so
// Var(s q·k) = s² d ((σ²+μ²)² − μ⁴): slope 1 for none, 0 for sqrt, −1 for linear. The c that makes
// the variance 1 is 1/sd(q·k) = 1/√d for unit components; 1/d over-corrects, giving Var = 1/d → 0.
#include <cmath>

#include "lab/registry.h"
#include "lab/rng.h"
#include "lab/sweep_memory.h"
#include "lab/theory.h"

namespace attnscale::lab {
namespace {

std::vector<Row> run(const Args& a, const std::vector<std::string>& point) {
  const Dist dist = Dist::parse(point[0]);
  const auto ds = a.ints("d");
  const auto scalings = a.words("scaling");
  const double mu = a.doubles("mu")[0], sigma = a.doubles("sigma")[0];
  const Components comp{dist, mu, sigma, 0};
  const auto dots = per_trial(a.threads, a.trials, ds.size(), [&](std::int64_t t, double* out) {
    for (std::size_t c = 0; c < ds.size(); ++c) {
      const Stream s(a.seed, stream_id(k_variance, {static_cast<int>(dist.kind), std::llround(dist.nu * 1000), ds[c]}),
                     static_cast<std::uint32_t>(t));
      double dot = 0;
      for (std::int64_t i = 0; i < ds[c]; ++i) {
        double q, k;
        comp.pair(s, i, q, k);
        dot += q * k;
      }
      out[c] = dot;
    }
  });
  std::vector<Row> rows;
  std::vector<std::vector<double>> logd(scalings.size()), logv(scalings.size());
  for (std::size_t c = 0; c < ds.size(); ++c) {
    const std::int64_t d = ds[c];
    const Summary v = variance_ci(dots[c]);
    const double th = theory::var_dot(d, mu, sigma, 0);
    const std::string ds_ = std::to_string(d), dn = dist.name();
    for (std::size_t k = 0; k < scalings.size(); ++k) {
      const double s = scaling_factor(scalings[k], d, 1);
      rows.push_back(make_row({ds_, scalings[k], dn}, "var", {s * s * v.mean, s * s * v.ci_low, s * s * v.ci_high},
                              s * s * th));
      if (v.mean > 0) {
        logd[k].push_back(std::log(static_cast<double>(d)));
        logv[k].push_back(std::log(s * s * v.mean));
      }
    }
    // c with Var(c q·k) = 1: 1/sd(q·k); the interval maps the variance's interval through 1/√v.
    if (v.mean > 0)
      rows.push_back(make_row({ds_, "none", dn}, "c_unit_var",
                              {1 / std::sqrt(v.mean), 1 / std::sqrt(std::max(v.ci_high, 1e-300)),
                               v.ci_low > 0 ? 1 / std::sqrt(v.ci_low) : INFINITY},
                              1 / std::sqrt(th)));
  }
  for (std::size_t k = 0; k < scalings.size(); ++k) {
    if (logd[k].size() < 2) continue;
    const double theory_slope = scalings[k] == "none" ? 1 : scalings[k] == "sqrt" ? 0 : -1;
    rows.push_back(make_row({"all", scalings[k], dist.name()}, "loglog_slope", slope_ci(logd[k], logv[k]),
                            theory_slope));
  }
  return rows;
}

}  // namespace

Experiment make_variance() {
  Experiment e;
  e.name = "variance";
  e.summary = "Var(q.k) and Var(s q.k) vs d for s = 1, 1/sqrt(d), 1/d, with fitted log-log slopes";
  e.flags = {{"d", "1,2,4,8,16,32,64,128,256,512,1024,2048,4096", "head dimensions, each 1 to 2^24"},
             {"scaling", "none,sqrt,linear", "scalings of q.k: none, sqrt, linear"},
             {"dist", "normal", "component distributions: normal, uniform, rademacher, laplace, tNU"},
             {"mu", "0", "mean of every component, |mu| <= 1e6"},
             {"sigma", "1", "standard deviation of every component, 1e-6 to 1e6"}};
  e.default_trials = 1000;
  e.param_names = {"d", "scaling", "dist"};
  e.points = [](const Args& a) {
    check_ints_in(a, "d", 1, 1 << 24);
    check_scalings(a.words("scaling"), {"none", "sqrt", "linear"}, "scaling");
    check_component_moments(a, "mu", "sigma");
    std::vector<std::vector<std::string>> pts;
    for (const auto& name : dist_names(a, "dist")) pts.push_back({name});
    // Each point (a distribution): one q·k a head dimension and trial (the components are drawn as
    // summed, never held).
    const std::size_t ds = a.ints("d").size();
    check_sweep_memory(a, {"trials", "d"},
                       trial_sweep_bytes(a, {.points = pts.size(),
                                             .width = ds,
                                             .rows_per_point = ds * (a.words("scaling").size() + 2)}));
    return pts;
  };
  e.run_point = run;
  return e;
}

}  // namespace attnscale::lab
