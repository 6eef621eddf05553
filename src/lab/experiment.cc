#include "lab/experiment.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <new>

#include "attnscale/error.h"
#include "attnscale/version.h"
#include "common/parallel.h"
#include "lab/point_scheduler.h"
#include "lab/registry.h"
#include "lab/rng.h"

namespace attnscale::lab {
namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    out.push_back(b == std::string::npos ? std::string() : item.substr(b, e - b + 1));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// A sweep list names each value once: a repeated value would repeat its point's rows, and a fit
// across points (variance's log-log slope) would count one measurement twice, as if independent,
// and narrow its interval. `items` are the list's texts, `values` what they parse to.
template <class T>
void require_distinct(const std::string& name, const std::string& text, const std::vector<std::string>& items,
                      const std::vector<T>& values) {
  for (std::size_t i = 1; i < values.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (values[i] == values[j])
        throw Error("--" + name + ": each value may be listed once, got " +
                    (items[i] == items[j] ? items[i] + " twice" : items[j] + " and " + items[i]) + " in '" + text +
                    "'");
}

// Everything a sweep's rows depend on (the thread count is not: rows do not depend on it).
SweepDefinition sweep_definition(const Experiment& e, const Args& args,
                                 const std::vector<std::vector<std::string>>& points) {
  SweepDefinition d = {{"experiment", e.name},
                       {"attnscale", std::string(version()) + " (git " + git_hash() + ")"},
                       {"--seed", std::to_string(args.seed)},
                       {"--trials", std::to_string(args.trials)}};
  for (const auto& [name, value] : args.values) d.emplace_back("--" + name, value);
  std::string list;
  for (const auto& p : points) {
    list += list.empty() ? "" : "; ";
    for (std::size_t i = 0; i < p.size(); ++i) list += (i ? "," : "") + p[i];
  }
  d.emplace_back("points", list);
  return d;
}

// A point whose arrays the machine cannot hold (--trials 2^31 keeps 2^31 results per metric; length
// at N = 2^20, d = 2^16 draws K of 512 GiB): one line naming the trials and the point's parameters,
// in place of std::bad_alloc.
std::string out_of_memory(const Experiment& e, const Args& args, const std::vector<std::string>& point) {
  std::string where;
  for (std::size_t k = 0; k < point.size() && k < e.param_names.size(); ++k)
    where += (k ? ", " : "") + e.param_names[k] + " = " + point[k];
  return "--trials " + std::to_string(args.trials) + " at the point " + where +
         ": more memory than this machine can give; fewer trials or smaller sizes need less";
}

}  // namespace

const std::string& Args::get(const std::string& name) const {
  const auto it = values.find(name);
  if (it == values.end()) throw Error("--" + name + ": not a flag of this experiment");
  return it->second;
}

std::vector<std::int64_t> Args::ints(const std::string& name) const {
  std::vector<std::int64_t> out;
  const auto items = split(get(name));
  for (const auto& item : items) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE)
      throw Error("--" + name + ": expected a comma-separated list of integers, got '" + get(name) + "'");
    out.push_back(v);
  }
  require_distinct(name, get(name), items, out);
  return out;
}

std::vector<double> Args::doubles(const std::string& name) const {
  std::vector<double> out;
  const auto items = split(get(name));
  for (const auto& item : items) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !std::isfinite(v))
      throw Error("--" + name + ": expected a comma-separated list of numbers, got '" + get(name) + "'");
    out.push_back(v);
  }
  require_distinct(name, get(name), items, out);
  return out;
}

std::vector<std::string> Args::words(const std::string& name) const {
  auto out = split(get(name));
  for (const auto& w : out)
    if (w.empty()) throw Error("--" + name + ": empty item in '" + get(name) + "'");
  require_distinct(name, get(name), out, out);
  return out;
}

const std::vector<Experiment>& experiments() {
  static const std::vector<Experiment> all = {
#define ATTNSCALE_UNIT(name, id) make_##name(),
#include "lab/experiments/list.h"
#undef ATTNSCALE_UNIT
  };
  return all;
}

const Experiment& find_experiment(const std::string& name) {
  std::string known;
  for (const auto& e : experiments()) {
    if (e.name == name) return e;
    known += (known.empty() ? "" : ", ") + e.name;
  }
  throw Error("unknown experiment '" + name + "' (known: " + known + ")");
}

Sweep plan_sweep(const Experiment& e, const std::map<std::string, std::string>& given, std::uint64_t seed,
                 std::int64_t trials, int threads) {
  Sweep sweep;
  sweep.start = std::chrono::steady_clock::now();
  // Under an MPI job every rank builds the sweep, then the ranks agree on it (or on the first
  // rank's error building it) before any point runs: see PointScheduler::agree.
  Args& args = sweep.args;
  std::vector<std::vector<std::string>>& points = sweep.points;
  std::string error;
  try {
    for (const auto& f : e.flags) args.values[f.name] = f.default_value;
    for (const auto& [name, value] : given) {
      if (!args.values.count(name)) {
        std::string known;
        for (const auto& f : e.flags) known += (known.empty() ? "--" : ", --") + f.name;
        throw Error("--" + name + ": not a flag of experiment " + e.name + " (its flags: " + known + ")");
      }
      args.values[name] = value;
    }
    if (trials < 0) throw Error("--trials: must be positive, got " + std::to_string(trials));
    if (trials > 0 && !e.trials_unused.empty()) throw Error("--trials: " + e.trials_unused);
    args.seed = seed;
    args.trials = trials > 0 ? trials : e.default_trials;
    if (args.trials > (std::int64_t{1} << 31))
      throw Error("--trials: at most 2^31, got " + std::to_string(args.trials));
    args.threads = resolve_threads(threads);
    points = e.points(args);
  } catch (const Error& x) {
    error = x.what();
  }
  point_scheduler().agree(sweep_definition(e, args, points), error);
  return sweep;
}

ResultTable run_sweep(const Experiment& e, const Sweep& sweep, const Progress& progress,
                      const CompletedPoints& completed) {
  const Args& args = sweep.args;
  const std::vector<std::vector<std::string>>& points = sweep.points;
  const std::size_t n = points.size();
  auto results = point_scheduler().run(
      n, args.threads,
      [&](std::size_t i, int threads) {
        Args mine = args;
        mine.threads = threads;
        try {
          return e.run_point(mine, points[i]);
        } catch (const std::bad_alloc&) {
          throw Error(out_of_memory(e, args, points[i]));
        }
      },
      completed, progress);

  ResultTable table;
  table.param_names = e.param_names;
  for (auto& r : results)
    for (auto& row : r) table.rows.push_back(std::move(row));
  if (e.summarize && !table.rows.empty())
    for (auto& row : e.summarize(args, table.rows)) table.rows.push_back(std::move(row));
  Metadata& m = table.meta;
  m.experiment = e.name;
  m.seed = args.seed;
  m.trials = args.trials;
  m.threads = args.threads;
  m.version = version();
  m.git_hash = git_hash();
  m.cpu_target = cpu_target();
  const Args used = e.resolve ? e.resolve(args) : args;
  for (const auto& f : e.flags) m.flags.emplace_back(f.name, used.values.at(f.name));
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sweep.start).count();
  return table;
}

ResultTable run_experiment(const Experiment& e, const std::map<std::string, std::string>& given,
                           std::uint64_t seed, std::int64_t trials, int threads, const Progress& progress,
                           const CompletedPoints& completed) {
  return run_sweep(e, plan_sweep(e, given, seed, trials, threads), progress, completed);
}

// ---- shared pieces (registry.h) ----

std::vector<std::vector<double>> per_trial(int threads, std::int64_t trials, std::size_t width,
                                           const std::function<void(std::int64_t, double*)>& fn) {
  std::vector<double> flat(static_cast<std::size_t>(trials) * width);
  const std::int64_t chunk = std::max<std::int64_t>(1, trials / (8 * std::max(threads, 1)));
  parallel_for(trials, chunk, threads, [&](std::int64_t b, std::int64_t e, int) {
    for (std::int64_t t = b; t < e; ++t) fn(t, flat.data() + t * width);
  });
  std::vector<std::vector<double>> cols(width, std::vector<double>(trials));
  for (std::int64_t t = 0; t < trials; ++t)
    for (std::size_t c = 0; c < width; ++c) cols[c][t] = flat[t * width + c];
  return cols;
}

Row make_row(std::vector<std::string> params, std::string metric, const Summary& s,
             std::optional<double> theory) {
  return Row{std::move(params), std::move(metric), s.mean, s.ci_low, s.ci_high, theory};
}

std::string format_number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// none: 1;  sqrt: 1/√d;  linear: 1/d;  qk-norm: 1/√d applied to LayerNorm'd q and k;
// log-n: √(ln N)/√d, which puts the logits' standard deviation at √(ln N) = σ_c/√2 for every N.
double scaling_factor(const std::string& rule, std::int64_t d, std::int64_t n) {
  const double dd = static_cast<double>(d);
  if (rule == "none") return 1;
  if (rule == "sqrt" || rule == "qk-norm") return 1 / std::sqrt(dd);
  if (rule == "linear") return 1 / dd;
  if (rule == "log-n") return std::sqrt(std::log(static_cast<double>(n)) / dd);
  throw Error("unknown scaling '" + rule + "'");
}

void check_scalings(const std::vector<std::string>& rules, const std::vector<std::string>& allowed,
                    const std::string& flag) {
  for (const auto& r : rules)
    if (std::find(allowed.begin(), allowed.end(), r) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      throw Error("--" + flag + ": unknown value '" + r + "' (expected " + list + ")");
    }
}

namespace {
std::string bound_text(std::int64_t v) {
  if (v > 65536 && (v & (v - 1)) == 0) {
    int k = 0;
    while ((std::int64_t{1} << k) < v) ++k;
    return "2^" + std::to_string(k);
  }
  return std::to_string(v);
}
}  // namespace

void check_ints_in(const Args& a, const std::string& flag, std::int64_t lo, std::int64_t hi) {
  for (auto v : a.ints(flag))
    if (v < lo || v > hi)
      throw Error("--" + flag + ": each value must be in [" + bound_text(lo) + ", " + bound_text(hi) + "], got " +
                  std::to_string(v));
}

void check_one_number(const Args& a, const std::string& flag, const std::string& what,
                      const std::function<bool(double)>& fits) {
  const auto v = a.doubles(flag);
  if (v.size() != 1 || (fits && !fits(v[0]))) throw Error("--" + flag + ": expected one " + what);
}

void check_component_moments(const Args& a, const std::string& mean_flag, const std::string& std_flag) {
  check_one_number(a, mean_flag, "number in [-1e6, 1e6]", [](double v) { return std::abs(v) <= 1e6; });
  if (!std_flag.empty())
    check_one_number(a, std_flag, "number in [1e-6, 1e6]", [](double v) { return v >= 1e-6 && v <= 1e6; });
}

std::vector<std::string> dist_names(const Args& a, const std::string& flag) {
  const auto items = a.words(flag);
  std::vector<std::string> names;
  for (const auto& item : items) {
    try {
      names.push_back(Dist::parse(item).name());
    } catch (const Error& e) {
      throw Error("--" + flag + ": " + e.what());
    }
  }
  require_distinct(flag, a.get(flag), items, names);
  return names;
}

std::vector<std::vector<std::string>> n_d_points(const Args& a) {
  std::vector<std::vector<std::string>> pts;
  for (auto n : a.ints("n"))
    for (auto d : a.ints("d")) pts.push_back({std::to_string(n), std::to_string(d)});
  return pts;
}

}  // namespace attnscale::lab
