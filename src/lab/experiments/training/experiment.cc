// The training experiment: small decoder-only Transformers trained on the fortunes text or on
// MQAR, one run per point of the sweep task × attention × scaling × d_head × lr × seed.
//
// Rows (param columns task, attention, scaling, d_head, lr, seed, step, layer; every run is one
// sample, so ci_low = ci_high = mean):
//   step s, layer all   train_loss (every step); on logged steps also lr, val_loss,
//                       val_accuracy (mqar), grad_norm (all parameters, before clipping)
//   step s, layer l     max_logit, entropy, grad_q, grad_k (attention_function.h, train_run.h)
//   step final          initial_val_loss, final_val_loss, final_val_accuracy (mqar), val_queries
//                       (mqar: the recalled values the accuracy counts), diverged, steps_run
// Summary rows (seed all), written once every run is done:
//   lr η, step final    final_loss: min(final_val_loss, initial) with its 95% CI over seeds (a
//                       diverged run counts as its initial loss; the t interval kept ≥ 0),
//                       diverged: the fraction of seeds (Clopper–Pearson over the seeds);
//                       mqar also final_accuracy (stats.h: runs_proportion_ci over the seeds and
//                       their val_queries validation queries each)
//   lr all, step final  lr_sensitivity: Wortsman et al.'s  mean_η min(L(η), L₀) − min_η L(η),
//                       per seed, then its mean and CI over seeds; best_loss: min_η L(η) (both ≥ 0)
//   attention both      loss_rel_diff at every step: |L_attnscale − L_torch| / L_torch of the same
//                       run (seed s), where both attentions were run
//
// The sweep needs no libtorch: its flags, their checks and the rows are the lab's; each run is
// train() in the libtorch module (torch_module.h), opened by the first run.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "attnscale/error.h"
#include "lab/registry.h"
#include "lab/rng.h"
#include "lab/sweep_memory.h"
#include "lab/experiments/training/model_config.h"
#include "lab/experiments/training/sweep.h"
#include "lab/experiments/training/task_config.h"
#include "lab/experiments/training/torch_module.h"
#include "lab/experiments/training/train_run.h"

namespace attnscale::lab {
namespace {

using training::RunConfig;

using training::Presets;

// The value of a flag after --grid: its own value unless it is "grid".
std::string value(const Presets& grids, const Args& a, const std::string& name) {
  const std::string& v = a.get(name);
  if (v != "grid") return v;
  const auto it = grids.find(a.get("grid"));
  if (it == grids.end()) throw Error("--grid: expected quick, default or full, got '" + a.get("grid") + "'");
  return it->second.at(name);
}
Args resolved(const Presets& grids, const Args& a) {
  Args r = a;
  for (auto& [name, v] : r.values)
    if (name != "grid") v = value(grids, a, name);
  return r;
}

std::int64_t single_int(const Args& a, const std::string& name, std::int64_t lo, std::int64_t hi) {
  check_ints_in(a, name, lo, hi);
  const auto v = a.ints(name);
  if (v.size() != 1) throw Error("--" + name + ": expected one integer, got '" + a.get(name) + "'");
  return v[0];
}

// The 64-bit seed of run `replicate`: a pure function of (--seed, the experiment's stream, replicate).
std::uint64_t run_seed(std::uint64_t seed, std::uint32_t experiment, std::int64_t replicate) {
  const auto b = Stream(seed, stream_id(experiment, {3}), static_cast<std::uint32_t>(replicate)).block(0);
  return (static_cast<std::uint64_t>(b[0]) << 32) | b[1];
}

RunConfig run_config(const Args& r, std::uint32_t experiment, const std::vector<std::string>& point) {
  RunConfig c;
  c.task.task = point[0];
  c.model.attention = point[1];
  c.model.scaling = point[2];
  c.model.d_head = std::stoll(point[3]);
  c.model.positions = r.get("positions");
  c.lr = std::stod(point[4]);
  c.seed = run_seed(r.seed, experiment, std::stoll(point[5]));
  c.task.corpus = r.get("corpus");
  c.task.seq_len = single_int(r, "seq-len", 2, 4096);
  c.task.batch = single_int(r, "batch", 1, 4096);
  c.model.d_model = single_int(r, "d-model", 1, 4096);
  c.model.n_layers = single_int(r, "layers", 1, 64);
  c.model.n_heads = single_int(r, "heads", 1, 64);
  c.steps = single_int(r, "steps", 1, 1000000);
  c.log_every = single_int(r, "log-every", 1, 1000000);
  return c;
}

std::vector<std::vector<std::string>> training_points(const training::Sweep& sweep, const Args& a) {
  const Args r = resolved(sweep.grids, a);
  const auto tasks = r.words("task"), attentions = r.words("attention"), scalings = r.words("scaling");
  check_scalings(tasks, {"lm", "mqar"}, "task");
  check_scalings(attentions, {"attnscale", "torch"}, "attention");
  check_scalings(scalings, training::scaling_rules(), "scaling");
  check_ints_in(r, "d-head", 1, 1024);
  check_scalings({r.get("positions")}, {"learned", "rotary"}, "positions");
  if (r.get("positions") == "rotary")
    for (auto d : r.ints("d-head"))
      if (d % 2 != 0) throw Error("--positions: rotary needs even head dimensions, got --d-head " + std::to_string(d));
  const auto lrs = r.doubles("lr");
  // At most 1e6, far past divergence (every rule diverges by η = 1): libtorch's AdamW takes its steps
  // in float32, and η = 1e38 ended in "internal error: value cannot be converted to type float
  // without overflow" with the journal left.
  for (double lr : lrs)
    if (!(lr > 0) || lr > 1e6) throw Error("--lr: each value must be in (0, 1e6], got " + format_number(lr));
  const std::int64_t seeds = single_int(r, "seeds", 1, 1000);
  std::vector<std::string> checked = r.get("torch-check") == "" ? std::vector<std::string>{} : r.words("torch-check");
  check_scalings(checked, training::scaling_rules(), "torch-check");
  // A reference run is compared with the run of the same scaling: a rule --scaling leaves out has
  // none. The grid's list is cut to the rules run; a list given explicitly must be among them.
  const bool checked_by_grid = a.get("torch-check") == "grid";
  std::vector<std::string> kept;
  for (const auto& sc : checked) {
    if (std::find(scalings.begin(), scalings.end(), sc) != scalings.end())
      kept.push_back(sc);
    else if (!checked_by_grid)
      throw Error("--torch-check: " + sc + " is not among --scaling '" + r.get("scaling") +
                  "'; its reference run would have no run to be compared with");
  }
  checked = kept;
  const bool torch_listed = std::find(attentions.begin(), attentions.end(), "torch") != attentions.end();
  std::vector<std::vector<std::string>> pts;
  for (const auto& task : tasks) {
    training::TaskConfig check = run_config(r, sweep.stream, {task, "attnscale", "sqrt", "1", "1", "0"}).task;
    training::check_task(check);  // --seq-len, --batch, --corpus for this task
    for (const auto& att : attentions)
      for (const auto& sc : scalings)
        for (auto d : r.ints("d-head"))
          for (double lr : lrs)
            for (std::int64_t s = 0; s < seeds; ++s)
              pts.push_back({task, att, sc, std::to_string(d), format_number(lr), std::to_string(s)});
    // The reference runs of --torch-check: PyTorch's attention on seed 0 of the same configurations.
    if (!torch_listed)
      for (const auto& sc : checked)
        for (auto d : r.ints("d-head"))
          for (double lr : lrs) pts.push_back({task, "torch", sc, std::to_string(d), format_number(lr), "0"});
  }
  // Each run at once (one a thread) holds its model's float32 parameters with their gradients and
  // AdamW's two moments (16 bytes a parameter) and a batch's activations kept for the backward
  // (per layer and token: q, k, v, the attention output and about 10 widths of d_model, and a row
  // of scores and probabilities per head); each run keeps a row a step, more at logged steps.
  const RunConfig big = run_config(r, sweep.stream, {"lm", "attnscale", "sqrt", "1", "1", "0"});
  const double layers = double(big.model.n_layers), heads = double(big.model.n_heads), dm = double(big.model.d_model),
               seq = double(big.task.seq_len), batch = double(big.task.batch), steps = double(big.steps);
  const double dh = largest(r, "d-head"), vocab = 256;  // the lm's bytes; mqar's vocabulary is smaller
  const double parameters = layers * (4 * dm * heads * dh + 8 * dm * dm) + (2 * vocab + seq) * dm;
  const double activations = 4 * batch * seq * (layers * (4 * heads * dh + 10 * dm + 3 * heads * seq) + 3 * vocab);
  const double rows = steps + steps / double(big.log_every) * (5 + 4 * layers) + 8;
  check_sweep_memory(r, {"batch", "seq-len", "d-model", "layers", "heads", "d-head", "steps", "log-every", "seeds"},
                     concurrent_points(r, pts.size()) * (16 * parameters + activations) +
                         double(pts.size()) * rows * kRowBytes);
  return pts;
}

Row one(std::vector<std::string> params, std::string metric, double v) {
  return Row{std::move(params), std::move(metric), v, v, v, std::nullopt};
}

std::vector<Row> training_run(const training::Sweep& sweep, const Args& a, const std::vector<std::string>& point) {
  const Args r = resolved(sweep.grids, a);
  const RunConfig c = run_config(r, sweep.stream, point);
  const training::RunRecord run = training::train_in_torch_module(c);
  std::vector<Row> rows;
  auto params = [&](const std::string& step, const std::string& layer) {
    auto p = point;
    p.push_back(step);
    p.push_back(layer);
    return p;
  };
  const bool mqar = c.task.task == "mqar";
  for (const auto& s : run.steps) {
    const std::string step = std::to_string(s.step);
    rows.push_back(one(params(step, "all"), "train_loss", s.train_loss));
    if (!s.logged) continue;
    rows.push_back(one(params(step, "all"), "lr", s.lr));
    if (s.evaluated) {
      rows.push_back(one(params(step, "all"), "val_loss", s.val_loss));
      if (mqar) rows.push_back(one(params(step, "all"), "val_accuracy", s.val_accuracy));
    }
    rows.push_back(one(params(step, "all"), "grad_norm", s.grad_norm));
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      const auto& L = s.layers[l];
      const std::string layer = std::to_string(l);
      rows.push_back(one(params(step, layer), "max_logit", L.max_logit));
      rows.push_back(one(params(step, layer), "entropy", L.entropy));
      rows.push_back(one(params(step, layer), "grad_q", L.grad_q));
      rows.push_back(one(params(step, layer), "grad_k", L.grad_k));
    }
  }
  rows.push_back(one(params("final", "all"), "initial_val_loss", run.initial_val_loss));
  rows.push_back(one(params("final", "all"), "final_val_loss", run.final_val_loss));
  if (mqar) rows.push_back(one(params("final", "all"), "final_val_accuracy", run.final_val_accuracy));
  // The recalled values the accuracy counts: P = N/4 a validation sequence (tasks.h).
  if (mqar)
    rows.push_back(one(params("final", "all"), "val_queries",
                       static_cast<double>(c.task.val_sequences * (c.task.seq_len / 4))));
  rows.push_back(one(params("final", "all"), "diverged", run.diverged ? 1 : 0));
  rows.push_back(one(params("final", "all"), "steps_run", static_cast<double>(run.steps.size())));
  return rows;
}

// Column positions of the param columns (training_points and training_run).
enum Col { kTask, kAttention, kScaling, kDHead, kLr, kSeed, kStep, kLayer };

std::vector<Row> training_summary(const Args&, const std::vector<Row>& rows) {
  // Per run (point): its capped final loss L = min(final, initial) (non-finite: initial) and more.
  struct RunEnd {
    double initial = 0, final_loss = 0, accuracy = 0, diverged = 0, queries = 0;
    bool has_accuracy = false;
  };
  using Config = std::tuple<std::string, std::string, std::string, std::string>;  // task, attention, scaling, d
  std::map<std::vector<std::string>, RunEnd> ends;  // by point
  std::map<std::vector<std::string>, std::map<std::int64_t, double>> losses;  // point → step → train loss
  for (const auto& row : rows) {
    const std::vector<std::string> point(row.params.begin(), row.params.begin() + kStep);
    if (row.params[kStep] != "final") {
      if (row.metric == "train_loss" && row.params[kLayer] == "all")
        losses[point][std::stoll(row.params[kStep])] = row.mean;
      continue;
    }
    RunEnd& e = ends[point];
    if (row.metric == "initial_val_loss") e.initial = row.mean;
    if (row.metric == "final_val_loss") e.final_loss = row.mean;
    if (row.metric == "diverged") e.diverged = row.mean;
    if (row.metric == "val_queries") e.queries = row.mean;
    if (row.metric == "final_val_accuracy") {
      e.accuracy = row.mean;
      e.has_accuracy = true;
    }
  }
  // config → lr (in sweep order) → seed → run end
  std::map<Config, std::vector<std::pair<std::string, std::map<std::string, RunEnd>>>> by_config;
  std::vector<Config> config_order;
  for (const auto& [point, e] : ends) {
    const Config cfg{point[kTask], point[kAttention], point[kScaling], point[kDHead]};
    if (!by_config.count(cfg)) config_order.push_back(cfg);
    auto& lrs = by_config[cfg];
    auto it = std::find_if(lrs.begin(), lrs.end(), [&](const auto& p) { return p.first == point[kLr]; });
    if (it == lrs.end()) it = lrs.insert(lrs.end(), {point[kLr], {}});
    RunEnd capped = e;
    capped.final_loss = std::isfinite(e.final_loss) ? std::min(e.final_loss, e.initial) : e.initial;
    it->second[point[kSeed]] = capped;
  }
  std::vector<Row> out;
  for (auto& [cfg, lrs] : by_config) {
    const auto& [task, attention, scaling, d] = cfg;
    std::sort(lrs.begin(), lrs.end(), [](const auto& x, const auto& y) { return std::stod(x.first) < std::stod(y.first); });
    auto params = [&](const std::string& lr) {
      return std::vector<std::string>{task, attention, scaling, d, lr, "all", "final", "all"};
    };
    std::map<std::string, std::vector<double>> per_seed;  // seed → L(η) over the LR grid
    std::map<std::string, double> initial;
    for (const auto& [lr, seeds] : lrs) {
      std::vector<double> loss, acc;
      std::int64_t diverged = 0, queries = 0;
      for (const auto& [seed, e] : seeds) {
        loss.push_back(e.final_loss);
        diverged += e.diverged > 0;
        if (e.has_accuracy) acc.push_back(e.accuracy);
        queries = static_cast<std::int64_t>(e.queries);  // the same for every seed of a config
        per_seed[seed].push_back(e.final_loss);
        initial[seed] = e.initial;
      }
      // Bounds: a cross-entropy is ≥ 0; an accuracy is a count of the validation queries (binomial,
      // pooled over seeds, joined with the spread between seeds); divergence a count of seeds.
      out.push_back(make_row(params(lr), "final_loss", bounded_mean_ci(loss, 0, INFINITY)));
      out.push_back(make_row(params(lr), "diverged", proportion_ci(diverged, static_cast<std::int64_t>(seeds.size()))));
      if (!acc.empty()) out.push_back(make_row(params(lr), "final_accuracy", runs_proportion_ci(acc, queries)));
    }
    // Wortsman et al.'s LR sensitivity, per seed over the LRs that seed ran (losses already capped
    // at L₀): mean_η L(η) − min_η L(η).
    std::vector<double> sensitivity, best;
    for (const auto& [seed, l] : per_seed) {
      if (l.size() != lrs.size()) continue;  // a seed missing some LR: not comparable
      const double lo = *std::min_element(l.begin(), l.end());
      sensitivity.push_back(sample_mean(l.data(), l.size()) - lo);
      best.push_back(lo);
    }
    if (!sensitivity.empty()) {
      // Both ≥ 0: the mean of losses over η is at least their minimum, and a loss is ≥ 0.
      out.push_back(make_row(params("all"), "lr_sensitivity", bounded_mean_ci(sensitivity, 0, INFINITY)));
      out.push_back(make_row(params("all"), "best_loss", bounded_mean_ci(best, 0, INFINITY)));
    }
  }
  // Drift between the two attentions on the same run.
  for (const auto& [point, steps] : losses) {
    if (point[kAttention] != "attnscale") continue;
    auto other = point;
    other[kAttention] = "torch";
    const auto it = losses.find(other);
    if (it == losses.end()) continue;
    for (const auto& [step, l] : steps) {
      const auto t = it->second.find(step);
      if (t == it->second.end()) break;
      auto p = point;
      p[kAttention] = "both";
      p.push_back(std::to_string(step));
      p.push_back("all");
      out.push_back(one(p, "loss_rel_diff", std::abs(l - t->second) / std::abs(t->second)));
    }
  }
  return out;
}

}  // namespace

Experiment training::sweep_experiment(const training::Sweep& sweep) {
  Experiment e;
  e.name = sweep.name;
  e.summary = sweep.summary;
  e.default_trials = 1;
  e.trials_unused = "experiment " + sweep.name + " trains models, it has no trials; --seeds sets the runs per configuration";
  e.param_names = {"task", "attention", "scaling", "d_head", "lr", "seed", "step", "layer"};
  e.flags = {
      {"grid", "default", "preset of the sweep flags left at 'grid': quick (< 1 min), default, full"},
      {"task", "grid", "lm (fortunes text, bytes) and/or mqar (associative recall)"},
      {"attention", "attnscale", "attnscale (its fused kernels) and/or torch (PyTorch's math, the reference)"},
      {"scaling", sweep.scalings, "scaling rules (see lab.md: docs/ in the source, share/doc/attnscale/ installed)"},
      {"d-head", "grid", "head dimensions, each 1 to 1024"},
      {"lr", "grid", "peak learning rates of AdamW, each in (0, 1e6]"},
      {"seeds", "grid", "runs per configuration (seed 0 .. seeds-1, each derived from --seed), 1 to 1000"},
      {"steps", "grid", "optimiser steps per run, 1 to 10^6"},
      {"seq-len", "grid", "sequence length N (mqar: 4 x key-value pairs), 2 to 4096"},
      {"batch", "grid", "sequences per step, 1 to 4096"},
      {"d-model", "grid", "width of the residual stream, 1 to 4096"},
      {"positions", "learned", "learned (position embeddings added to the input) or rotary (RoPE on q and k)"},
      {"layers", "grid", "Transformer blocks, 1 to 64"},
      {"heads", "grid", "attention heads per block, 1 to 64"},
      {"log-every", "grid", "steps between logged steps (validation, logits, entropy, gradients), 1 to 10^6"},
      {"torch-check", "grid",
       "scalings also run with PyTorch's attention (seed 0, every LR) for the loss_rel_diff rows; '' for none"},
      {"corpus", "/usr/share/games/fortunes", "folder of the fortunes text (Debian package fortunes)"},
  };
  e.points = [sweep](const Args& a) { return training_points(sweep, a); };
  e.run_point = [sweep](const Args& a, const std::vector<std::string>& point) { return training_run(sweep, a, point); };
  e.summarize = training_summary;
  e.resolve = [sweep](const Args& a) { return resolved(sweep.grids, a); };
  return e;
}

Experiment make_training() {
  training::Sweep sweep;
  sweep.name = "training";
  sweep.summary = "small pre-LN Transformers trained with each scaling rule: loss, logits, entropy, LR sensitivity";
  sweep.stream = k_training;
  sweep.scalings = "none,sqrt,linear,qk-norm,folded,learned,additive";
  sweep.grids = {
      {"quick", {{"torch-check", "sqrt"}, {"task", "lm"}, {"d-head", "16"}, {"lr", "0.001,0.01,0.1"}, {"seeds", "2"},
                 {"steps", "30"}, {"seq-len", "32"}, {"batch", "8"}, {"d-model", "32"}, {"layers", "2"}, {"heads", "2"},
                 {"log-every", "5"}}},
      {"default", {{"torch-check", "none,sqrt"}, {"task", "lm"}, {"d-head", "64"},
                   {"lr", "0.001,0.003,0.01,0.03,0.1,0.3,1"}, {"seeds", "3"}, {"steps", "100"}, {"seq-len", "64"},
                   {"batch", "8"}, {"d-model", "64"}, {"layers", "2"}, {"heads", "2"}, {"log-every", "10"}}},
      {"full", {{"torch-check", "none,sqrt"}, {"task", "lm,mqar"}, {"d-head", "16,64,256"},
                {"lr", "0.0001,0.0003,0.001,0.003,0.01,0.03,0.1,0.3,1"}, {"seeds", "5"}, {"steps", "1000"},
                {"seq-len", "128"}, {"batch", "32"}, {"d-model", "128"}, {"layers", "2"}, {"heads", "2"},
                {"log-every", "25"}}},
  };
  return training::sweep_experiment(sweep);
}

}  // namespace attnscale::lab
