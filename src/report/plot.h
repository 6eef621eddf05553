// Figures for the report, drawn by gnuplot (the figure specs live in the units, report/unit.h).
//
// A Figure is one or more panels side by side: line panels (measured curves with 95% confidence
// bands and dashed theory curves) or heatmaps (viridis colour map). render() writes a gnuplot
// script with the data inlined as datablocks, runs gnuplot twice (SVG and PNG via pngcairo), and
// returns the SVG text.
//
// Example:
//   Figure f{"variance"};
//   LinePanel& p = f.lines("Var(q·k) against d", "d", "Var(q·k)");
//   p.logx = p.logy = true;
//   p.series.push_back({"unscaled", {1, 2, 4}, {1, 2, 4}, {0.9, 1.8, 3.7}, {1.1, 2.2, 4.3}, {1, 2, 4}});
//   std::string svg = render(f, "out/figures");
#pragma once
#include <deque>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace attnscale::report {

// One measured curve. `lo`/`hi` (the CI band) and `theory` are optional: empty, or one per x
// (NaN where a value is missing).
struct Series {
  std::string title;
  std::vector<double> x, y, lo, hi, theory;
  int colour = -1;           // palette index; -1: the series' position in the panel
  bool secondary = false;    // drawn thinner with open points (e.g. a mean beside its median)
};

// A horizontal reference line, e.g. a target ("1") or a value a reference quotes ("38 of 50"),
// dotted, in its own colour (theory curves are dashed in their series' colour). The panel's y range
// always includes it, clear of the axes.
struct RefLine {
  double y = 0;
  std::string label;
  std::string colour = "#666666";
};

struct LinePanel {
  std::string title, xlabel, ylabel;
  bool logx = false, logy = false;
  std::optional<double> ymin, ymax;
  std::vector<Series> series;
  std::vector<RefLine> refs;
  std::string key_position = "top left";  // gnuplot `set key` position, or "off"
  std::string theory_title = "theory";     // legend entry of the dashed curves
};

// A row-major matrix drawn with the viridis palette; row 0 at the top.
struct HeatPanel {
  std::string title, xlabel, ylabel;
  int rows = 0, cols = 0;
  std::vector<double> values;
  double cbmin = 0, cbmax = 1;
  bool logcb = false;  // logarithmic colour scale (values below cbmin drawn as cbmin)
  bool colorbox = true;  // off for all but the last of several panels sharing one scale
};

struct Figure {
  std::string name;  // file stem: figures/<name>.svg and .png
  int width = 760, height = 430;
  int columns = 0;  // panels per row; 0: all in one row
  // One legend under the panels (taken from the first line panel) instead of one inside each;
  // for panels that share their series. Single-row figures only.
  bool legend_below = false;
  std::deque<std::variant<LinePanel, HeatPanel>> panels;  // deque: lines()/heat() references stay valid

  LinePanel& lines(std::string title, std::string xlabel, std::string ylabel);
  HeatPanel& heat(std::string title, std::string xlabel, std::string ylabel);
};

// The gnuplot script drawing `figure` to `output` with `terminal` (e.g. "svg ...", "pngcairo ...").
std::string gnuplot_script(const Figure& figure, const std::string& terminal, const std::string& output);

// Writes dir/<name>.svg and dir/<name>.png (and dir/<name>.gp, the script, which names them relative
// to its own folder: `gnuplot <name>.gp` run there redraws them) and returns the SVG.
// Throws Error when gnuplot is missing or fails (its message included).
std::string render(const Figure& figure, const std::string& dir);

// The SVG made safe to inline next to other figures in one HTML page: no XML prolog or DOCTYPE,
// every id prefixed with `prefix` (gnuplot reuses the same ids in every file).
std::string inline_svg(const std::string& svg, const std::string& prefix);

}  // namespace attnscale::report
