// The lab's experiments behind one interface, shared by the CLI (`attnscale experiment NAME`),
// the report and the Python module (attnscale.lab).
//
// An experiment declares its flags (each a string; sweeps are comma-separated lists such as
// "1,2,4,8"), splits its sweep into independent points, and runs one point into rows. Every
// random number is drawn from lab::Stream(seed, stream, trial), so a point's rows depend only on
// (seed, flags, point): the same for any thread count, any order, and after a resumed run.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lab/results.h"

namespace attnscale::lab {

struct FlagSpec {
  std::string name;           // without dashes, e.g. "d"
  std::string default_value;  // e.g. "1,2,4,8,16,32,64,128"
  std::string help;
};

// The flag values of one run (every declared flag present, defaults filled in) plus the common
// ones: seed, trials, threads.
struct Args {
  std::map<std::string, std::string> values;
  std::uint64_t seed = 0;
  std::int64_t trials = 0;  // already resolved: > 0
  int threads = 1;

  const std::string& get(const std::string& name) const;       // throws Error if undeclared
  // Lists: "1,2,4" → {1,2,4}; Error naming --name for an item that does not parse, or one that
  // repeats an earlier one ("1,4,4", "0.5,5e-1"): a sweep lists each value once.
  std::vector<std::int64_t> ints(const std::string& name) const;
  std::vector<double> doubles(const std::string& name) const;
  std::vector<std::string> words(const std::string& name) const;  // "none,sqrt" → {"none","sqrt"}
};

struct Experiment {
  std::string name;     // "saturation"
  std::string summary;  // one line for --help
  std::vector<FlagSpec> flags;
  std::int64_t default_trials = 100;
  // Non-empty for an experiment without Monte Carlo trials (training runs): why, and what sets its
  // repetitions instead. A --trials it would ignore is refused with it.
  std::string trials_unused;
  std::vector<std::string> param_names;  // the CSV's sweep columns
  // The sweep's points: units of work, each a list of values (by convention a prefix of param_names;
  // a point may produce rows for several values of the remaining parameters, e.g. every scaling
  // on the same Q and K). Validates the flags (Error naming the flag).
  std::function<std::vector<std::vector<std::string>>(const Args&)> points;
  // Rows of one point. Must be a pure function of (args, point).
  std::function<std::vector<Row>(const Args&, const std::vector<std::string>& point)> run_point;
  // Optional: rows computed from every point's rows once all are done (e.g. a summary over
  // random seeds), appended after them. Must be a pure function of (args, rows).
  std::function<std::vector<Row>(const Args&, const std::vector<Row>& rows)> summarize;
  // Optional: the flags as the run used them (e.g. a preset's values filled in where a flag says
  // "grid"); the metadata records these, so a result file says what was run.
  std::function<Args(const Args&)> resolve;
};

const std::vector<Experiment>& experiments();
const Experiment& find_experiment(const std::string& name);  // Error lists the known names

// Called after each finished point with (done, total, that point's rows), always in point order
// (point i is reported once points 0..i are done) and never concurrently; used for progress bars and
// incremental (resumable) output.
using Progress = std::function<void(std::size_t done, std::size_t total, const std::vector<Row>& rows)>;

// Rows of points finished by an earlier, interrupted run of the same flags, by point index
// (`attnscale experiment --resume` reads them back from its journal).
using CompletedPoints = std::map<std::size_t, std::vector<Row>>;

// A run's flags, checked, and its points, before any point runs.
struct Sweep {
  Args args;
  std::vector<std::vector<std::string>> points;
  std::chrono::steady_clock::time_point start;  // the metadata's seconds count from here
};

// Fills defaults into `given` and checks every flag (unknown names, bad values: Error naming the
// flag), so that a caller can make its outputs ready (a journal) only once the flags are good.
// Under an MPI job the ranks agree on the sweep (or on the first rank's error) here.
Sweep plan_sweep(const Experiment& e, const std::map<std::string, std::string>& given, std::uint64_t seed,
                 std::int64_t trials, int threads);

// Runs every point of the sweep and returns the table with its metadata. Rows come out in point
// order whatever the thread count. Points found in `completed` are not run again: their rows are
// used as given (and reported to `progress` in order like the others), which gives the same table
// because a point's rows are a pure function of (seed, flags, point).
ResultTable run_sweep(const Experiment& e, const Sweep& sweep, const Progress& progress = {},
                      const CompletedPoints& completed = {});

// plan_sweep, then run_sweep.
ResultTable run_experiment(const Experiment& e, const std::map<std::string, std::string>& given,
                           std::uint64_t seed, std::int64_t trials, int threads,
                           const Progress& progress = {}, const CompletedPoints& completed = {});

}  // namespace attnscale::lab
