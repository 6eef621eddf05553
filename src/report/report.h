// `attnscale report`: runs every lab experiment, draws the figures and writes seed 000 completed.
//
//   DIR/index.html     one self-contained page (figures inlined as SVG, styles embedded)
//   DIR/report.md      the same text, figures linked
//   DIR/figures/       <name>.svg, <name>.png and the gnuplot script <name>.gp of every figure
//   DIR/data/          <experiment>.csv and .json (lab::to_csv / to_json) of every run
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "lab/results.h"
#include "report/column_softmax.h"

namespace attnscale::report {

enum class Depth { quick, standard, full };  // --quick: for tests; standard: `make report`; --full

struct ReportOptions {
  std::string out = "report";
  Depth depth = Depth::standard;
  std::uint64_t seed = 0;
  int threads = 0;  // 0: $ATTNSCALE_THREADS, else every core
  bool progress = true;
};

// Everything the report is written from: one table per experiment plus the report's own
// column-softmax measurement.
struct Measurements {
  std::map<std::string, lab::ResultTable> tables;
  ColumnSoftmaxEvidence columns;
  ReportOptions options;
  int threads = 1;
  double seconds = 0;  // wall time of all measurements
};

// The experiments' flags and trial counts at each depth.
struct RunPlan {
  std::string experiment;
  std::map<std::string, std::string> flags;
  std::int64_t trials = 0;  // 0: the experiment's default
};
std::vector<RunPlan> plan(Depth depth);

Measurements measure(const ReportOptions& options);

// Writes DIR from measurements (figures need gnuplot). Returns the path of index.html.
std::string write_report(const Measurements& m);

}  // namespace attnscale::report
