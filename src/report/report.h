// `attnscale report`: runs every unit's experiment, draws the figures and writes Chuang (2023)'s
// note completed.
//
//   DIR/index.html     one self-contained page (figures inlined as SVG, styles embedded)
//   DIR/report.md      the same text, figures linked
//   DIR/figures/       <name>.svg, <name>.png and the gnuplot script <name>.gp of every figure
//   DIR/data/          <experiment>.csv and .json (lab::to_csv / to_json) of every run
//
// The report is a loop over the units of the registry (report/unit.h): measure each, draw every
// figure, write each unit's section and the report's own sections (report/templates/*.md), and
// judge the claims.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "lab/results.h"
#include "report/page.h"
#include "report/unit.h"

namespace attnscale::report {

struct ReportOptions {
  std::string out = "report";
  Depth depth = Depth::standard;
  std::uint64_t seed = 0;
  int threads = 0;  // 0: $ATTNSCALE_THREADS, else every core
  bool progress = true;
  std::string from;  // non-empty: read the tables from FROM/data/<unit>.json instead of measuring
};

// Everything the report is written from: one table per unit, by unit name.
struct Measurements {
  std::map<std::string, lab::ResultTable> tables;
  ReportOptions options;
  int threads = 1;
  double seconds = 0;  // wall time of all measurements
};

// Runs every unit's experiment at options.depth, or with options.from reads the tables an earlier
// report wrote (units without a file there are left out).
Measurements measure(const ReportOptions& options);

// The report's text and figures (drawn into `dir`/figures by gnuplot) from measurements: every
// unit whose table is present contributes its figures, section and claims.
Page compose(const Measurements& m, const std::string& dir);

// Writes DIR from measurements (figures need gnuplot). Returns the path of index.html.
std::string write_report(const Measurements& m);

}  // namespace attnscale::report
