// The training experiment in the report: loss curves per scaling, final loss against the learning
// rate (Wortsman et al.'s LR-sensitivity picture), logit growth and entropy collapse during
// training, the drift between attnscale's and PyTorch's attention, and the three claims of the
// references that only training can test.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "lab/experiments/training/model_config.h"
#include "report/query.h"
#include "report/unit.h"

namespace attnscale::report {
namespace {

// The seed and step counts the runs used, read from the rows: the recorded flags keep "grid"
// where a --grid preset supplied the value.
std::string seeds_used(const lab::ResultTable& t) {
  std::int64_t n = 0;
  for (const std::string& v : values(t, "seed")) n += v != "all";
  return std::to_string(n);
}
std::string steps_used(const lab::ResultTable& t) {
  std::int64_t last = -1;
  for (const lab::Row& r : t.rows)
    if (r.metric == "train_loss" && is_number(param(t, r, "step"))) last = std::max<std::int64_t>(last, std::stoll(param(t, r, "step")));
  return std::to_string(last + 1);
}

// The configuration the section reads: the first task and the largest head dimension of the run,
// attnscale's attention.
struct Slice {
  std::string task, d, lr_mid, lr_top;
  std::vector<std::string> scalings, lrs;
  Fixed fixed(const std::string& scaling) const {
    return {{"task", task}, {"attention", "attnscale"}, {"scaling", scaling}, {"d_head", d}};
  }
};

Slice slice(const lab::ResultTable& t) {
  Slice s;
  const auto tasks = values(t, "task");
  s.task = std::find(tasks.begin(), tasks.end(), "lm") != tasks.end() ? "lm" : tasks.front();
  s.d = largest_value(t, "d_head");
  for (const auto& sc : values(t, "scaling")) s.scalings.push_back(sc);
  for (const auto& lr : values(t, "lr"))
    if (is_number(lr)) s.lrs.push_back(lr);
  std::sort(s.lrs.begin(), s.lrs.end(), [](const auto& a, const auto& b) { return std::stod(a) < std::stod(b); });
  s.lr_mid = s.lrs[s.lrs.size() / 2];
  s.lr_top = s.lrs.back();
  return s;
}

const lab::Row& summary(const lab::ResultTable& t, const Slice& s, const std::string& scaling, const std::string& metric,
                        const std::string& lr = "all") {
  Fixed f = s.fixed(scaling);
  f.insert({{"lr", lr}, {"seed", "all"}, {"step", "final"}, {"layer", "all"}});
  return one(t, metric, f);
}

// The last logged step of seed 0's run at `lr` (a diverged run stops early).
std::string last_logged_step(const lab::ResultTable& t, const Slice& s, const std::string& scaling,
                             const std::string& lr) {
  Fixed f = s.fixed(scaling);
  f.insert({{"lr", lr}, {"seed", "0"}, {"layer", "0"}});
  std::int64_t last = 0;
  for (const auto* r : select(t, "max_logit", f)) last = std::max<std::int64_t>(last, std::stoll(param(t, *r, "step")));
  return std::to_string(last);
}

std::vector<Figure> figures(const lab::ResultTable& t) {
  const Slice s = slice(t);
  std::vector<Figure> out;
  {
    Figure f{"training_loss"};
    f.width = 960;
    f.legend_below = true;
    LinePanel& a = f.lines("Validation loss, η = " + s.lr_mid + ", seed 0", "step", "loss (nats)");
    LinePanel& b = f.lines("Final loss against η (mean of seeds, 95% CI)", "peak learning rate η", "final loss");
    b.logx = true;
    int colour = 0;
    for (const auto& sc : s.scalings) {
      Fixed fa = s.fixed(sc);
      fa.insert({{"lr", s.lr_mid}, {"seed", "0"}, {"layer", "all"}});
      Series sa = series(t, "step", "val_loss", fa, scaling_title(sc));
      sa.colour = colour;
      a.series.push_back(std::move(sa));
      Fixed fb = s.fixed(sc);
      fb.insert({{"seed", "all"}, {"step", "final"}, {"layer", "all"}});
      Series sb = series(t, "lr", "final_loss", fb, scaling_title(sc));
      sb.colour = colour++;
      b.series.push_back(std::move(sb));
    }
    out.push_back(std::move(f));
  }
  {
    Figure f{"training_logits"};
    f.width = 960;
    f.legend_below = true;
    LinePanel& a = f.lines("Largest attention logit, layer 0, η = " + s.lr_mid, "step", "max_{ij} s q_{i}·k_{j}");
    LinePanel& b = f.lines("Mean attention entropy, layer 0, η = " + s.lr_mid, "step", "entropy (nats)");
    int colour = 0;
    for (const auto& sc : s.scalings) {
      Fixed fx = s.fixed(sc);
      fx.insert({{"lr", s.lr_mid}, {"seed", "0"}, {"layer", "0"}});
      for (auto [panel, metric] : {std::pair<LinePanel*, const char*>{&a, "max_logit"}, {&b, "entropy"}}) {
        if (select(t, metric, fx).empty()) continue;  // additive attention has them too; a guard for partial tables
        Series ser = series(t, "step", metric, fx, scaling_title(sc));
        ser.colour = colour;
        panel->series.push_back(std::move(ser));
      }
      ++colour;
    }
    out.push_back(std::move(f));
  }
  const auto drift_rows = select(t, "loss_rel_diff", {{"task", s.task}, {"attention", "both"}, {"d_head", s.d}});
  if (!drift_rows.empty()) {
    Figure f{"training_drift"};
    f.legend_below = true;
    LinePanel& p = f.lines("attnscale against PyTorch's attention: |ΔL| / L per step, seed 0", "step",
                           "relative difference of the training loss");
    p.logy = true;
    int colour = 0;
    for (const auto& sc : values(t, "scaling")) {
      for (const auto& lr : {s.lrs.front(), s.lr_top}) {
        Fixed fx{{"task", s.task}, {"attention", "both"}, {"scaling", sc}, {"d_head", s.d}, {"lr", lr}, {"seed", "0"}};
        if (select(t, "loss_rel_diff", fx).empty()) continue;
        Series ser = series(t, "step", "loss_rel_diff", fx, scaling_title(sc) + ", η = " + lr);
        // A zero difference has no place on a log axis: it is drawn at 1e-9, below every other point.
        for (auto* v : {&ser.y, &ser.lo, &ser.hi})
          for (auto& y : *v) y = std::max(y, 1e-9);
        ser.colour = colour++;
        p.series.push_back(std::move(ser));
      }
    }
    p.refs.push_back({1e-4, "1e-4 (the check)", "#aa3333"});
    out.push_back(std::move(f));
  }
  return out;
}

// Comparisons on CIs: "apart" only when the intervals do not overlap.
bool below(const lab::Row& a, const lab::Row& b) { return a.ci_high < b.ci_low; }

struct Judged {
  const lab::Row *best_none, *best_sqrt, *best_folded, *sens_none, *sens_sqrt;
  double div_none = 0, div_sqrt = 0;  // LRs of the grid at which some seed diverged
};

Judged judged(const lab::ResultTable& t, const Slice& s) {
  Judged j;
  j.best_none = &summary(t, s, "none", "best_loss");
  j.best_sqrt = &summary(t, s, "sqrt", "best_loss");
  j.best_folded = &summary(t, s, "folded", "best_loss");
  j.sens_none = &summary(t, s, "none", "lr_sensitivity");
  j.sens_sqrt = &summary(t, s, "sqrt", "lr_sensitivity");
  for (const auto& lr : s.lrs) {
    j.div_none += summary(t, s, "none", "diverged", lr).mean > 0;
    j.div_sqrt += summary(t, s, "sqrt", "diverged", lr).mean > 0;
  }
  return j;
}

// At most 2% above the 1/√d loss (or below it): the tolerance of "trains as well" (a difference a
// reader would not act on at this size). One-sided: a rule that trains better is as good.
bool as_good(const lab::Row& x, const lab::Row& ref) { return x.mean <= ref.mean * 1.02; }

// "16% below (CIs apart)", "within 2% of", "more than 2% above": the unscaled best loss against the
// scaled one's, for "the unscaled attention's best loss is {{none_vs_sqrt}} the scaled one's".
// as_good alone said "within 2% of" for a loss 16% below whose interval overlapped the other's.
std::string none_vs_sqrt(const lab::Row& none, const lab::Row& sqrt) {
  const double rel = none.mean / sqrt.mean - 1;
  if (below(none, sqrt)) return fmt::format("{}% below (CIs apart)", fmt(-100 * rel, 2));
  if (std::abs(rel) <= 0.02) return "within 2% of";
  if (rel < 0) return fmt::format("{}% below (CIs overlapping)", fmt(-100 * rel, 2));
  return "more than 2% above";
}

// The scaling rules the run trained, in the experiment's order, as the section describes them:
// "unscaled (s = 1), 1/√d, *folded* (...) and additive attention ...".
std::string rules_run(const std::vector<std::string>& scalings) {
  static const std::map<std::string, std::string> described = {
      {"none", "unscaled (s = 1)"},
      {"sqrt", "1/√d"},
      {"linear", "1/d (μP, Yang et al. (2022))"},
      {"qk-norm", "qk-norm (LayerNorm on q and k, then 1/√d)"},
      {"folded", "*folded* (s = 1 with W_{q}'s initialisation divided by √d, as T5 does, Raffel et al. (2020))"},
      {"learned", "a learned per-head temperature starting at 1/√d"},
      {"additive", "additive attention vₐᵀ tanh(W q + U k)"}};
  std::vector<std::string> parts;
  for (const auto& rule : lab::training::scaling_rules())
    if (std::find(scalings.begin(), scalings.end(), rule) != scalings.end()) parts.push_back(described.at(rule));
  std::string text;
  for (std::size_t i = 0; i < parts.size(); ++i)
    text += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
  return text;
}

// Every task × head dimension of the run (the full grid sweeps both; the default one of each):
// per scaling the best loss over η and, for MQAR, the best validation accuracy over η.
std::string sweep_table(const lab::ResultTable& t, const Slice& s) {
  std::vector<std::string> header{"scaling"};
  std::vector<std::pair<std::string, std::string>> cols;  // task, d_head
  for (const auto& task : values(t, "task"))
    for (const auto& d : values(t, "d_head")) {
      cols.push_back({task, d});
      header.push_back(fmt::format("{}, d_head = {}", task == "lm" ? "fortunes" : "MQAR", d));
    }
  std::vector<std::vector<std::string>> rows;
  for (const auto& sc : s.scalings) {
    std::vector<std::string> row{scaling_title(sc)};
    for (const auto& [task, d] : cols) {
      const Fixed f{{"task", task}, {"attention", "attnscale"}, {"scaling", sc}, {"d_head", d},
                    {"seed", "all"}, {"step", "final"}, {"layer", "all"}};
      Fixed fb = f;
      fb.insert({"lr", "all"});
      const auto best = select(t, "best_loss", fb);
      std::string cell = best.empty() ? "not run" : fmt_ci(*best.front());
      if (task == "mqar") {
        double acc = 0;
        for (const auto* r : select(t, "final_accuracy", f)) acc = std::max(acc, r->mean);
        cell += fmt::format(" (accuracy {})", fmt(acc, 2));
      }
      row.push_back(cell);
    }
    rows.push_back(std::move(row));
  }
  return md_table(header, rows);
}

// The growth of an unstable run's drift: least-squares slope b of ln(|ΔL|/L) against the step over
// the growth phase, from the first step where the two losses differ to the first where they differ
// by 1e-3 or more (past it the two runs no longer resemble each other and the difference wanders),
// reported as the factor e^b per step. Steps with no difference inside the phase are skipped (ln 0).
// Needs 3 points.
struct Drift {
  double factor = 0, r2 = 0;  // r2: the fit's coefficient of determination
  int points = 0;
};
Drift drift_growth(const lab::ResultTable& t, const Slice& s, const std::string& scaling, const std::string& lr) {
  std::vector<std::pair<double, double>> steps;  // step, |ΔL|/L
  const Fixed f{{"task", s.task}, {"attention", "both"}, {"scaling", scaling}, {"d_head", s.d}, {"lr", lr}, {"seed", "0"}};
  for (const auto* r : select(t, "loss_rel_diff", f))
    if (is_number(param(t, *r, "step"))) steps.push_back({std::stod(param(t, *r, "step")), r->mean});
  std::sort(steps.begin(), steps.end());
  std::vector<std::pair<double, double>> xy;
  for (auto [step, diff] : steps) {
    if (diff > 0) xy.push_back({step, std::log(diff)});
    if (diff >= 1e-3) break;
  }
  Drift d;
  d.points = static_cast<int>(xy.size());
  if (d.points < 3) return d;
  double mx = 0, my = 0;
  for (auto [x, y] : xy) mx += x / d.points, my += y / d.points;
  double sxy = 0, sxx = 0, syy = 0;
  for (auto [x, y] : xy) sxy += (x - mx) * (y - my), sxx += (x - mx) * (x - mx), syy += (y - my) * (y - my);
  d.factor = std::exp(sxy / sxx);
  d.r2 = syy > 0 ? sxy * sxy / (sxx * syy) : 1;
  return d;
}

Slots slots(const lab::ResultTable& t) {
  const Slice s = slice(t);
  const Judged j = judged(t, s);
  std::vector<std::vector<std::string>> table;
  for (const auto& sc : s.scalings) {
    std::vector<std::string> row{scaling_title(sc)};
    for (const auto& lr : s.lrs) {
      const auto& r = summary(t, s, sc, "final_loss", lr);
      const double div = summary(t, s, sc, "diverged", lr).mean;
      row.push_back(fmt(r.mean, 3) + (div > 0 ? " †" : ""));
    }
    row.push_back(fmt_ci(summary(t, s, sc, "best_loss")));
    row.push_back(fmt_ci(summary(t, s, sc, "lr_sensitivity"), 2));
    table.push_back(std::move(row));
  }
  std::vector<std::string> header{"scaling"};
  for (const auto& lr : s.lrs) header.push_back("η = " + lr);
  header.push_back("best loss");
  header.push_back("LR sensitivity");

  auto at = [&](const std::string& sc, const std::string& metric, const std::string& step) {
    Fixed f = s.fixed(sc);
    f.insert({{"lr", s.lr_mid}, {"seed", "0"}, {"layer", "0"}, {"step", step}});
    return one(t, metric, f).mean;
  };
  const std::string last_none = last_logged_step(t, s, "none", s.lr_mid),
                    last_sqrt = last_logged_step(t, s, "sqrt", s.lr_mid);
  const double ent0_none = at("none", "entropy", "0"), ent0_sqrt = at("sqrt", "entropy", "0");
  const double logit_none = at("none", "max_logit", last_none), logit_sqrt = at("sqrt", "max_logit", last_sqrt);
  const double logit_folded = at("folded", "max_logit", last_logged_step(t, s, "folded", s.lr_mid));
  const double gq0_none = at("none", "grad_q", "0"), gq0_sqrt = at("sqrt", "grad_q", "0");

  Slots out{{"task", s.task == "lm" ? "next-byte prediction on the fortunes text" : "multi-query associative recall"},
            {"d", s.d},
            {"lr_mid", s.lr_mid},
            {"lr_low", s.lrs.front()},
            {"lr_top", s.lr_top},
            {"lrs", fmt::format("{}", fmt::join(s.lrs, ", "))},
            {"seeds", seeds_used(t)},
            {"steps", steps_used(t)},
            {"grid", flag(t, "grid")},
            {"loss_table", md_table(header, table)},
            {"best_none", fmt_ci(*j.best_none)},
            {"best_sqrt", fmt_ci(*j.best_sqrt)},
            {"best_folded", fmt_ci(*j.best_folded)},
            {"sens_none", fmt_ci(*j.sens_none, 2)},
            {"sens_sqrt", fmt_ci(*j.sens_sqrt, 2)},
            {"sens_none_lower", below(*j.sens_none, *j.sens_sqrt) ? "true" : ""},
            {"sens_sqrt_lower", below(*j.sens_sqrt, *j.sens_none) ? "true" : ""},
            {"div_none", fmt(j.div_none, 2)},
            {"div_sqrt", fmt(j.div_sqrt, 2)},
            {"none_as_good", as_good(*j.best_none, *j.best_sqrt) ? "true" : ""},
            {"none_vs_sqrt", none_vs_sqrt(*j.best_none, *j.best_sqrt)},
            {"rules", rules_run(s.scalings)},
            {"every_rule", s.scalings.size() == lab::training::scaling_rules().size() ? "true" : ""},
            {"rule_count", std::to_string(s.scalings.size())},
            {"sens_words", below(*j.sens_sqrt, *j.sens_none)   ? ": the scale makes the loss less sensitive to η"
                           : below(*j.sens_none, *j.sens_sqrt) ? ": the unscaled model is the less sensitive one"
                                                               : ", the two intervals overlapping"},
            {"task_words", values(t, "task").size() > 1 ? "two tasks" : "one task"},
            {"folded_as_good", as_good(*j.best_folded, *j.best_sqrt) ? "true" : ""},
            // "Starts saturated" when the unscaled model's rows begin (step 0, layer 0) with less than
            // half the scaled model's row entropy; the abstract and the discussion tell the saturated
            // start only then.
            {"starts_saturated", ent0_none < 0.5 * ent0_sqrt ? "true" : ""},
            {"ent0_none", fmt(ent0_none, 3)},
            {"ent0_sqrt", fmt(ent0_sqrt, 3)},
            {"logit_none", fmt(logit_none, 3)},
            {"logit_sqrt", fmt(logit_sqrt, 3)},
            {"logit_folded", fmt(logit_folded, 3)},
            // "Grows" when the folded model's largest logit ends above twice the scaled one's.
            {"folded_logits_grow", logit_folded > 2 * logit_sqrt ? "true" : ""},
            {"gq0_ratio", fmt(gq0_none / gq0_sqrt, 3)},
            {"has_drift", select(t, "loss_rel_diff", {{"attention", "both"}}).empty() ? "" : "true"}};
  const auto drift = select(t, "loss_rel_diff", {{"task", s.task}, {"attention", "both"}, {"d_head", s.d},
                                                 {"lr", s.lrs.front()}, {"scaling", "sqrt"}, {"seed", "0"}});
  double worst = 0;
  for (const auto* r : drift)
    if (param(t, *r, "step") != "final" && std::stoll(param(t, *r, "step")) < 20) worst = std::max(worst, r->mean);
  out["has_drift_low"] = drift.empty() ? "" : "true";
  out["drift_words"] = worst == 0 ? "give the same loss at every step"
                                  : fmt::format("differ by at most {} (relative), {} the 1e-4 the tests require",
                                                fmt(worst, 2), worst <= 1e-4 ? "inside" : "*above*");
  // The drift's growth at the largest η, for each scaling that ran against PyTorch's attention.
  // "Steady" when the straight line explains at least 90% of the variance of ln |ΔL|/L; the
  // sentence says which rules grew steadily and which did not.
  std::vector<std::string> growth, steady, unsteady;
  for (const auto& sc : values(t, "scaling")) {
    const Drift g = drift_growth(t, s, sc, s.lr_top);
    if (g.points < 3) continue;
    growth.push_back(fmt::format("×{} per step for {} ({} steps fitted, R² = {})", fmt(g.factor, 3), scaling_title(sc),
                                 g.points, fmt(g.r2, 2)));
    (g.r2 >= 0.9 ? steady : unsteady).push_back(scaling_title(sc));
  }
  out["drift_growth"] = fmt::format("{}", fmt::join(growth, ", "));
  out["has_drift_growth"] = growth.empty() ? "" : "true";
  out["drift_steady"] = unsteady.empty() ? "by a steady factor"
                        : steady.empty() ? "by a factor that is not steady (R² below 0.9)"
                                         : fmt::format("by a steady factor for {}, not for {} (R² below 0.9)",
                                                       fmt::join(steady, ", "), fmt::join(unsteady, ", "));
  const bool sweep = values(t, "task").size() > 1 || values(t, "d_head").size() > 1;
  out["has_sweep"] = sweep ? "true" : "";
  if (sweep) out["sweep_table"] = sweep_table(t, s);
  if (std::find(s.scalings.begin(), s.scalings.end(), "additive") != s.scalings.end())
    out["best_additive"] = fmt_ci(summary(t, s, "additive", "best_loss"));
  return out;
}

std::vector<Evidence> claims(const lab::ResultTable& t) {
  const Slice s = slice(t);
  const Judged j = judged(t, s);
  const std::string where =
      fmt::format("{} steps of {}, d_head = {}, η ∈ {{{}}}, {} seeds", steps_used(t), s.task, s.d,
                  fmt::join(s.lrs, ", "), seeds_used(t));
  std::vector<Evidence> out;
  // Stabilise: a lower LR sensitivity (CIs apart) or fewer diverging learning rates with the scale.
  {
    const bool calmer = below(*j.sens_sqrt, *j.sens_none) || j.div_sqrt < j.div_none;
    const bool worse = below(*j.sens_none, *j.sens_sqrt) || j.div_sqrt > j.div_none;
    out.push_back({"stabilise-training",
                   "with s = 1/√d_{k} training is less sensitive to the learning rate and diverges at fewer of them "
                   "than with s = 1",
                   fmt::format("LR sensitivity (Wortsman et al. (2023)) 1/√d {} vs unscaled {}; LRs with a diverged seed: "
                               "{} vs {} ({})",
                               fmt_ci(*j.sens_sqrt, 2), fmt_ci(*j.sens_none, 2), fmt(j.div_sqrt, 2),
                               fmt(j.div_none, 2), where),
                   "supported when 1/√d's LR sensitivity is below the unscaled one's (CIs apart) or it diverges at "
                   "fewer LRs, without the other going the opposite way; refuted when the opposite holds; mixed "
                   "otherwise",
                   calmer && !worse ? Verdict::supported : worse && !calmer ? Verdict::refuted : Verdict::mixed});
  }
  // Not used nowadays: a pre-LN model without the explicit factor (s = 1, or folded into W_q as T5
  // does) reaches the loss of 1/√d.
  {
    const bool none_ok = as_good(*j.best_none, *j.best_sqrt), folded_ok = as_good(*j.best_folded, *j.best_sqrt);
    out.push_back({"not-used-nowadays",
                   "in a pre-LN Transformer the explicit 1/√d_{k} is dispensable: s = 1, or the factor folded into "
                   "W_{q}'s initialisation (T5), reaches the same loss",
                   fmt::format("best loss over η: 1/√d {}, unscaled {}, folded {} ({})", fmt_ci(*j.best_sqrt),
                               fmt_ci(*j.best_none), fmt_ci(*j.best_folded), where),
                   "supported when both the unscaled and the folded best losses are at most 2% above 1/√d's; refuted "
                   "when neither is; mixed when one is",
                   none_ok && folded_ok ? Verdict::supported : none_ok || folded_ok ? Verdict::mixed : Verdict::refuted});
  }
  if (std::find(s.scalings.begin(), s.scalings.end(), "additive") != s.scalings.end()) {
    const lab::Row& add = summary(t, s, "additive", "best_loss");
    out.push_back({"additive",
                   "at large d_{k} additive attention reaches a lower loss than unscaled dot-product attention",
                   fmt::format("best loss over η at d_head = {}: additive {}, unscaled dot product {} ({})", s.d,
                               fmt_ci(add), fmt_ci(*j.best_none), where),
                   "supported when additive's best loss is below the unscaled one's (CIs apart); refuted when it "
                   "is above (CIs apart); mixed when the CIs overlap",
                   below(add, *j.best_none) ? Verdict::supported
                   : below(*j.best_none, add) ? Verdict::refuted
                                              : Verdict::mixed});
  }
  return out;
}

}  // namespace

Unit unit_training() {
  Unit u;
  u.quick = {{{"grid", "quick"}, {"scaling", "none,sqrt,folded,additive"}, {"lr", "0.003,0.3"}, {"seeds", "2"},
              {"steps", "12"}, {"seq-len", "16"}, {"batch", "4"}, {"d-model", "16"}, {"d-head", "8"},
              {"log-every", "4"}},
             0};
  u.standard = {{{"grid", "default"}}, 0};
  u.full = {{{"grid", "full"}}, 0};
  u.figures = figures;
  u.slots = slots;
  u.claims = claims;
  u.optional = true;  // libtorch
  return u;
}

}  // namespace attnscale::report
