// attnscale experiment NAME [flags]: run one of the lab's experiments, CSV or JSON out.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "attnscale/error.h"
#include "common/journal.h"
#include "common/progress.h"
#include "empty_values.h"
#include "experiment_journal.h"
#include "lab/experiment.h"
#include "lab/point_scheduler.h"
#include "output_files.h"
#include "standard_output.h"
#include "subcommands.h"

namespace attnscale::cli {
namespace {

struct ExperimentFlags {
  std::uint64_t seed = 0;
  std::int64_t trials = 0;
  int threads = 0;
  std::string format = "csv";
  std::string out;
  bool resume = false;
  std::map<std::string, std::string> values;
};

// The command line of a sweep as given, flag by flag: under mpirun every rank must be started
// with the same one (not --threads: a rank's thread count changes no row), --out naming the same
// file however it is spelt.
lab::SweepDefinition command_line(const lab::Experiment& e, const ExperimentFlags& f) {
  lab::SweepDefinition d = {{"experiment", e.name},
                            {"--seed", std::to_string(f.seed)},
                            {"--trials", f.trials > 0 ? std::to_string(f.trials) : ""},
                            {"--format", f.format},
                            {"--out", canonical_path(f.out)},
                            {"--resume", f.resume ? "given" : ""}};
  for (const auto& [name, value] : f.values) d.emplace_back("--" + name, value);
  return d;
}

// The sweep's points run (those not in `completed`), each finished point's rows journaled, then
// the table written to stdout or --out.
void run_and_write(const lab::Experiment& e, const ExperimentFlags& f, const lab::Sweep& sweep, Journal* journal,
                   const lab::CompletedPoints& completed) {
  const bool writer = lab::point_scheduler().writes_results();
  std::optional<ProgressBar> bar;
  if (writer) bar.emplace(fmt::format("experiment {}", e.name));
  const auto table = lab::run_sweep(
      e, sweep,
      [&](std::size_t done, std::size_t total, const std::vector<lab::Row>& rows) {
        const std::size_t point = done - 1;  // points are reported in order
        if (journal && !completed.count(point)) {
          try {
            journal->append(static_cast<std::int64_t>(point), lab::encode_rows(rows));
          } catch (const Error& x) {
            throw Error(fmt::format("--out: {}", x.what()));
          }
        }
        if (bar) bar->update(done, total);
      },
      completed);
  if (!writer) return;
  bar->finish();
  // Say so when a row has no interval, and why: a row of one point has too few trials for it; a row
  // over every point (a parameter "all": variance's log-log slope, training's summary over seeds)
  // has too few points behind it, whatever the trials.
  // A row whose statistic itself is NaN over 2 or more trials (nothing to measure at its settings,
  // e.g. projections' correlation between components at d = 1) has no interval whatever the trials:
  // it is told apart. (Over 1 trial a variance is NaN too, for want of trials.)
  std::ptrdiff_t per_point = 0, across = 0, undefined = 0;
  for (const lab::Row& r : table.rows)
    if (std::isnan(r.mean) && table.meta.trials >= 2)
      ++undefined;
    else if (std::isnan(r.ci_low))
      ++(std::find(r.params.begin(), r.params.end(), "all") != r.params.end() ? across : per_point);
  if (undefined > 0)
    std::fprintf(stderr,
                 "attnscale: note: %td of %zu rows are nan: their statistic is not defined at their point's settings\n",
                 undefined, table.rows.size());
  if (per_point + across > 0) {
    // Over 2 or more trials (runs) a row also has none when every one gave the same value and its
    // metric has no bound to reach from (lab/stats.h): said as the other possible cause.
    const std::string trials = table.meta.trials == 1
                                   ? std::string("1 trial is too few for it")
                                   : fmt::format("{} trials are too few for it, or all gave the same value", table.meta.trials);
    // Training and recall (no trials) summarise over their runs, one a seed.
    std::set<std::string> seeds;
    const auto seed_at = std::find(table.param_names.begin(), table.param_names.end(), "seed") - table.param_names.begin();
    for (const lab::Row& r : table.rows)
      if (static_cast<std::size_t>(seed_at) < r.params.size() && r.params[seed_at] != "all") seeds.insert(r.params[seed_at]);
    const std::string points = e.trials_unused.empty() ? "too few sweep points behind it, or they lie on one line"
                               : seeds.size() < 2     ? "too few runs (--seeds) behind it"
                                                      : "too few runs (--seeds) behind it, or all ended at the same value";
    const std::string why = across == 0      ? trials
                            : per_point == 0 ? points
                                             : fmt::format("{}: {}; {}: {}", per_point, trials, across, points);
    std::fprintf(stderr,
                 "attnscale: note: %td of %zu rows have no confidence interval (%s); their ci_low and ci_high are "
                 "nan\n",
                 per_point + across, table.rows.size(), why.c_str());
  }
  const std::string text = f.format == "csv" ? lab::to_csv(table) : lab::to_json(table);
  if (f.out.empty()) {
    write_stdout(text);
  } else {
    OutputFiles file;  // complete or not at all: a temporary beside it, then renamed
    file.add("--out", f.out, text);
    file.place();
    journal->remove();
  }
}

void run(const lab::Experiment& e, const ExperimentFlags& f) {
  // Checked, then agreed on by every rank under mpirun, before the journal is opened or a point run.
  std::string error;
  try {
    if (f.format != "csv" && f.format != "json")
      throw Error(fmt::format("--format: expected csv or json, got '{}'", f.format));
    if (f.resume && f.out.empty()) throw Error("--resume: needs --out FILE (the journal is FILE.partial)");
    require_writable({{"--out", f.out}});  // before the sweep, not after it
  } catch (const Error& x) {
    error = x.what();
  }
  lab::point_scheduler().agree(command_line(e, f), error);
  // The experiment's own flags checked (and agreed on) before the journal is opened: a refused
  // value leaves no FILE.partial behind.
  const lab::Sweep sweep = lab::plan_sweep(e, f.values, f.seed, f.trials, f.threads);
  // With --out, every finished point's rows go to the journal FILE.partial as they complete, so
  // that a killed run can be resumed; it is removed once FILE is in place.
  // Under mpirun only rank 0 keeps the journal and writes; the other ranks run their share of the
  // points (lab/mpi_points.h).
  const bool writer = lab::point_scheduler().writes_results();
  std::optional<Journal> journal;
  lab::CompletedPoints completed;
  if (writer && !f.out.empty()) {
    try {
      journal.emplace(Journal::open(f.out + ".partial", journal_identity(e, f.seed, f.trials, f.values), f.resume));
    } catch (const Error& x) {
      throw Error(fmt::format("--out: {}", x.what()));
    }
    for (const auto& [point, payload] : journal->records()) {
      try {
        completed[static_cast<std::size_t>(point)] = lab::decode_rows(payload);
      } catch (const Error& err) {
        throw Error(fmt::format("--resume: {}: {}", journal->path(), err.what()));
      }
    }
    if (journal->damaged() > 0)
      std::fprintf(stderr, "attnscale: warning: %s: skipped %zu damaged record%s; %s run again\n",
                   journal->path().c_str(), journal->damaged(), journal->damaged() == 1 ? "" : "s",
                   journal->damaged() == 1 ? "its point is" : "their points are");
    if (f.resume && !completed.empty())
      std::fprintf(stderr, "attnscale: resuming %s: %zu point%s already done\n", e.name.c_str(), completed.size(),
                   completed.size() == 1 ? "" : "s");
  }
  try {
    run_and_write(e, f, sweep, journal ? &*journal : nullptr, completed);
  } catch (const Error& x) {
    if (!journal) throw;
    throw Error(x.what() + keep_or_remove_journal(*journal));
  }
}

}  // namespace

void add_experiment(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "experiment",
      "Run one of the lab's experiments; CSV in long form (or JSON with metadata) on stdout or --out.\n"
      "Every experiment takes --seed --trials --threads --format --out; sweeps take comma-separated lists.\n"
      "Example: attnscale experiment saturation --n 50 --d 16,64,128 --trials 200");
  sub->require_subcommand(0, 1);
  auto unknown = std::make_shared<std::string>();
  sub->add_option("name", *unknown, "experiment name (see the list below)");
  for (const auto& e : lab::experiments()) {
    auto flags = std::make_shared<ExperimentFlags>();
    CLI::App* x = sub->add_subcommand(e.name, e.summary);
    x->add_option("--seed", flags->seed, "master seed of the random streams, 0 to 2^64-1")->capture_default_str()->check(seed_range());
    // Given, it must be positive: 0 is not a way to ask for the default (leave the flag out).
    x->add_option("--trials", flags->trials,
                  e.trials_unused.empty()
                      ? fmt::format("Monte Carlo trials per point (default {}), 1 to 2^31; a sweep whose arrays and rows\n"
                                    "would need more memory than the machine has (RAM + swap) is refused before it runs",
                                    e.default_trials)
                      : "not taken: " + e.trials_unused)
        ->check(integer_in<std::int64_t>(1, std::int64_t{1} << 31));
    x->add_option("--threads", flags->threads, "threads, 0 to 4096 (0: $ATTNSCALE_THREADS, else all cores)")
        ->capture_default_str()
        ->check(threads_range());
    x->add_option("--format", flags->format, "csv or json")->capture_default_str();
    x->add_option("--out", flags->out, "write to FILE (atomically) instead of stdout")->type_name("FILE");
    x->add_flag("--resume", flags->resume,
                "continue an interrupted run of the same flags from FILE.partial (needs --out)");
    for (const auto& spec : e.flags) {
      flags->values[spec.name] = spec.default_value;
      // The lab checks its flags' values, '' included (lab::Args).
      empty_value_allowed(x->add_option("--" + spec.name, flags->values[spec.name], spec.help))->capture_default_str();
    }
    const lab::Experiment* ep = &e;
    x->callback([ep, flags] { run(*ep, *flags); });
  }
  sub->callback([sub, unknown] {
    if (!unknown->empty()) lab::find_experiment(*unknown);  // throws: unknown experiment, names the known
    if (sub->get_subcommands().empty())
      throw Error("experiment: name one of the experiments (attnscale experiment --help lists them)");
  });
}

}  // namespace attnscale::cli
