// gnuplot scripts for the report's figures. See plot.h.
#include "report/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "attnscale/error.h"
#include "report/text_file.h"

namespace attnscale::report {
namespace {

// Okabe–Ito colours: distinguishable under the common colour-vision deficiencies.
constexpr const char* kColours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000", "#F0E442"};

// Viridis, sampled at nine stops (from matplotlib's published table): perceptually uniform and
// readable in grey.
constexpr const char* kViridis =
    "set palette defined (0 '#440154', 0.125 '#472c7a', 0.25 '#3b518b', 0.375 '#2c718e', "
    "0.5 '#21908d', 0.625 '#27ad81', 0.75 '#5cc863', 0.875 '#aadc32', 1 '#fde725')\n";

std::string quote(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

std::string num(double v) {
  if (!std::isfinite(v)) return "NaN";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

double at(const std::vector<double>& v, std::size_t i) {
  return i < v.size() ? v[i] : std::nan("");
}

bool any_finite(const std::vector<double>& v) {
  return std::any_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

// Whether the dashed theory curve can be seen: somewhere it is finite and off the measured curve
// (a theory equal to the data everywhere, such as an exact 0, is hidden beneath it, so the legend
// must not promise it).
bool theory_visible(const Series& s) {
  for (std::size_t i = 0; i < s.theory.size() && i < s.y.size(); ++i)
    if (std::isfinite(s.theory[i]) && std::abs(s.theory[i] - s.y[i]) > 1e-9 * std::max(1.0, std::abs(s.y[i])))
      return true;
  return false;
}

// Tic marks at the data's own x values on a log axis (d = 1, 2, 4, ...), thinned to at most 8.
std::string log_xtics(const LinePanel& p) {
  std::set<double> xs;
  for (const Series& s : p.series)
    for (double x : s.x)
      if (x > 0 && std::isfinite(x)) xs.insert(x);
  if (xs.empty()) return "";
  std::vector<double> v(xs.begin(), xs.end());
  const std::size_t step = (v.size() + 7) / 8;
  std::string out = "set xtics (";
  for (std::size_t i = 0; i < v.size(); i += step) {
    if (i) out += ", ";
    out += quote(num(v[i])) + " " + num(v[i]);
  }
  return out + ")\n";
}

// The data's y extent (curves and bands) and the reference lines'.
std::pair<double, double> y_extent(const LinePanel& p) {
  double lo = INFINITY, hi = -INFINITY;
  auto add = [&](double v) {
    if (std::isfinite(v) && (!p.logy || v > 0)) lo = std::min(lo, v), hi = std::max(hi, v);
  };
  for (const Series& s : p.series)
    for (const auto* v : {&s.y, &s.lo, &s.hi, &s.theory})
      for (double x : *v) add(x);
  for (const RefLine& r : p.refs) add(r.y);
  return {lo, hi};
}

// A panel with reference lines gets an explicit range with room around them, so a line on the
// data's edge is not drawn on the axis itself; otherwise gnuplot's autoscale (NaN: "*"). A labelled
// line beyond every curve gets a tenth of the height more on its side, room for its label there.
bool label_beyond_curves(const LinePanel& p, bool low) {
  double curves_lo = INFINITY, curves_hi = -INFINITY;
  for (const Series& s : p.series)
    for (double v : s.y)
      if (std::isfinite(v) && (!p.logy || v > 0)) curves_lo = std::min(curves_lo, v), curves_hi = std::max(curves_hi, v);
  for (const RefLine& r : p.refs)
    if (!r.label.empty() && (low ? r.y <= curves_lo : r.y >= curves_hi)) return true;
  return false;
}
double y_low(const LinePanel& p) {
  if (p.ymin) return *p.ymin;
  if (p.refs.empty()) return NAN;
  const auto [lo, hi] = y_extent(p);
  if (!std::isfinite(lo)) return NAN;
  if (label_beyond_curves(p, true)) return p.logy ? lo / std::max(1.6, std::pow(hi / lo, 0.12)) : lo - 0.12 * (hi - lo);
  return p.logy ? lo / 1.6 : lo - 0.06 * std::max(hi - lo, 1e-12);
}
double y_high(const LinePanel& p) {
  if (p.ymax) return *p.ymax;
  if (p.refs.empty()) return NAN;
  const auto [lo, hi] = y_extent(p);
  if (!std::isfinite(hi)) return NAN;
  if (label_beyond_curves(p, false)) return p.logy ? hi * std::max(1.6, std::pow(hi / lo, 0.12)) : hi + 0.12 * (hi - lo);
  return p.logy ? hi * 1.6 : hi + 0.06 * std::max(hi - lo, 1e-12);
}
std::string num_or_auto(double v) { return std::isnan(v) ? "*" : num(v); }

// Where a reference line's label goes: of the right end, the left end and the middle, above or
// below the line, the box the label's text takes (about 2.4% of the width a character, at least a
// quarter; 1.5% to 9% of the height off the line) that the fewest curve samples fall in (curves
// sampled between their points, in the axes' own scales; a curve on the line itself does not
// count); ties go to the earlier of right, left, middle and of above, below.
std::string label_place(const LinePanel& p, double y, const std::string& label) {
  double xlo = INFINITY, xhi = -INFINITY;
  for (const Series& s : p.series)
    for (double x : s.x)
      if (std::isfinite(x) && (!p.logx || x > 0)) xlo = std::min(xlo, x), xhi = std::max(xhi, x);
  const double ylo = y_low(p), yhi = y_high(p);
  const double chars =
      static_cast<double>(std::count_if(label.begin(), label.end(), [](char c) { return (c & 0xC0) != 0x80; }));
  const double w = std::min(1.0, std::max(0.25, 0.024 * chars));
  struct Spot {
    double x0, x1;  // the box's horizontal extent, as a fraction of the width
    const char* at;
  };
  const Spot kSpots[] = {{1 - w, 1.0, "at graph 0.99, first {} right offset 0, {}"},
                         {0.0, w, "at graph 0.01, first {} left offset 0, {}"},
                         {0.5 - w / 2, 0.5 + w / 2, "at graph 0.5, first {} center offset 0, {}"}};
  const auto place = [&](const Spot& spot, bool above) {
    return fmt::format(fmt::runtime(spot.at), num(y), above ? "0.7" : "-0.7");
  };
  if (!(xhi > xlo) || !std::isfinite(ylo) || !(yhi > ylo)) return place(kSpots[0], true);
  const auto frac = [](double v, double lo, double hi, bool log) {
    return log ? (std::log(v) - std::log(lo)) / (std::log(hi) - std::log(lo)) : (v - lo) / (hi - lo);
  };
  const double fy0 = frac(y, ylo, yhi, p.logy);
  int best = -1, best_hits = INT_MAX;
  for (int c = 0; c < 6; ++c) {
    const Spot& spot = kSpots[c / 2];
    const bool above = c % 2 == 0;
    const double y0 = above ? fy0 + 0.015 : fy0 - 0.09, y1 = above ? fy0 + 0.09 : fy0 - 0.015;
    int hits = y0 < 0 || y1 > 1 ? 1000 : 0;  // a label beside the frame would sit on the axis
    for (const Series& s : p.series)
      for (std::size_t i = 0; i + 1 < s.x.size(); ++i)
        for (int t = 0; t < 16; ++t) {  // the segment from point i to i + 1
          const double ax = frac(s.x[i], xlo, xhi, p.logx), bx = frac(s.x[i + 1], xlo, xhi, p.logx);
          const double ay = frac(s.y[i], ylo, yhi, p.logy), by = frac(s.y[i + 1], ylo, yhi, p.logy);
          const double fx = ax + (bx - ax) * t / 16, fy = ay + (by - ay) * t / 16;
          hits += fx >= spot.x0 && fx <= spot.x1 && fy >= y0 && fy <= y1;
        }
    if (hits < best_hits) best = c, best_hits = hits;
  }
  return place(kSpots[best / 2], best % 2 == 0);
}

void line_panel(std::ostringstream& gp, const LinePanel& p, int index, const std::string& key_override) {
  gp << "set title " << quote(p.title) << "\n"
     << "set xlabel " << quote(p.xlabel) << "\n"
     << "set ylabel " << quote(p.ylabel) << "\n"
     << (!key_override.empty() ? key_override
         : p.key_position == "off" ? std::string("unset key\n")
                                 : "set key " + p.key_position + " opaque box lc rgb '#cccccc' samplen 2.5 spacing 1.1\n")
     << "set grid back lc rgb '#e6e6e6' lw 1\n"
     << "set border 3 lc rgb '#444444'\nset tics nomirror\n";
  if (p.logx) gp << "set logscale x 2\n" << log_xtics(p);
  if (p.logy) gp << "set logscale y 10\nset format y '%g'\n";
  gp << "set yrange [" << num_or_auto(y_low(p)) << ":" << num_or_auto(y_high(p)) << "]\n";
  // The x axis spans the data (plus the 2% offsets), not the next tic beyond it: steps 0..100
  // otherwise drew from -20 to 120.
  gp << "set autoscale xfix\nset offsets graph 0.02, graph 0.02, 0, 0\n";

  bool theory = false;
  for (std::size_t s = 0; s < p.series.size(); ++s) {
    const Series& ser = p.series[s];
    gp << "$p" << index << "s" << s << " << EOD\n";
    for (std::size_t i = 0; i < ser.x.size(); ++i) {
      double lo = at(ser.lo, i), hi = at(ser.hi, i);
      // A log axis cannot show a band reaching 0 or below; clip it just under the curve.
      if (p.logy && std::isfinite(lo) && lo <= 0) lo = ser.y[i] * 1e-3;
      gp << num(ser.x[i]) << " " << num(ser.y[i]) << " " << num(lo) << " " << num(hi) << " "
         << num(at(ser.theory, i)) << "\n";
    }
    gp << "EOD\n";
    theory = theory || theory_visible(ser);
  }
  int arrow = 1;
  for (const RefLine& r : p.refs) {
    gp << "set arrow " << arrow++ << " from graph 0, first " << num(r.y) << " to graph 1, first "
       << num(r.y) << " nohead dt 3 lw 1.4 lc rgb '" << r.colour << "' front\n";
    if (!r.label.empty())
      gp << "set label " << arrow << " " << quote(r.label) << " " << label_place(p, r.y, r.label) << " tc rgb '" << r.colour
         << "'\n";
  }

  std::vector<std::string> plots;
  for (std::size_t s = 0; s < p.series.size(); ++s) {
    const Series& ser = p.series[s];
    const std::string data = "$p" + std::to_string(index) + "s" + std::to_string(s);
    const std::size_t ci = ser.colour >= 0 ? static_cast<std::size_t>(ser.colour) : s;
    const std::string colour = std::string("'") + kColours[ci % std::size(kColours)] + "'";
    if (any_finite(ser.lo) && any_finite(ser.hi))
      plots.push_back(data + " using 1:3:4 with filledcurves fc rgb " + colour +
                      " fs transparent solid 0.22 noborder notitle");
    if (any_finite(ser.theory))
      plots.push_back(data + " using 1:5 with lines dt (6,4) lw 1.6 lc rgb " + colour + " notitle");
    plots.push_back(data + " using 1:2 with linespoints " + (ser.secondary ? "lw 1.2 pt 6 ps 0.7" : "lw 2 pt 7 ps 0.55") +
                    " lc rgb " + colour +
                    " title " + quote(ser.title));
  }
  if (theory) plots.push_back("keyentry with lines dt (6,4) lw 1.6 lc rgb '#555555' title " + quote(p.theory_title));
  if (plots.empty()) throw Error(fmt::format("figure panel '{}' has no data", p.title));
  gp << "plot ";
  for (std::size_t i = 0; i < plots.size(); ++i) gp << (i ? ", \\\n     " : "") << plots[i];
  gp << "\n";
}

void heat_panel(std::ostringstream& gp, const HeatPanel& h, int index) {
  gp << "set title " << quote(h.title) << "\n"
     << "set xlabel " << quote(h.xlabel) << "\n"
     << "set ylabel " << quote(h.ylabel) << "\n"
     << kViridis << "set cbrange [" << num(h.cbmin) << ":" << num(h.cbmax) << "]\n"
     << (h.logcb ? "set logscale cb 10\nset format cb '10^{%L}'\n" : "")
     << "set xrange [-0.5:" << num(h.cols - 0.5) << "]\n"
     << "set yrange [" << num(h.rows - 0.5) << ":-0.5]\n"
     << "set size ratio -1\nset tics out nomirror\nset border lc rgb '#444444'\nunset key\nunset grid\n"
     << (h.colorbox ? "" : "unset colorbox\n");
  gp << "$h" << index << " << EOD\n";
  for (int r = 0; r < h.rows; ++r) {
    for (int c = 0; c < h.cols; ++c) {
      const double v = h.values[static_cast<std::size_t>(r) * h.cols + c];
      gp << (c ? " " : "") << num(h.logcb ? std::max(v, h.cbmin) : v);
    }
    gp << "\n";
  }
  gp << "EOD\nplot $h" << index << " matrix with image notitle\n";
}

// The shared legend: a plot of key entries only, across the figure's full width.
void legend_strip(std::ostringstream& gp, const LinePanel& p, double height) {
  gp << "reset\nset encoding utf8\nset origin 0,0\nset size 1," << num(height) << "\n"
     << "unset border\nunset tics\nunset grid\nset xrange [0:1]\nset yrange [0:1]\n"
     << "set key center center horizontal maxrows 1 samplen 2.5 width 1 box lc rgb '#cccccc'\n";
  std::vector<std::string> items;
  bool theory = false;
  for (std::size_t s = 0; s < p.series.size(); ++s) {
    const Series& ser = p.series[s];
    const std::size_t ci = ser.colour >= 0 ? static_cast<std::size_t>(ser.colour) : s;
    items.push_back(std::string("keyentry with linespoints ") + (ser.secondary ? "lw 1.2 pt 6 ps 0.7" : "lw 2 pt 7 ps 0.55") +
                    " lc rgb '" + kColours[ci % std::size(kColours)] + "' title " + quote(ser.title));
    theory = theory || theory_visible(p.series[s]);
  }
  if (theory) items.push_back("keyentry with lines dt (6,4) lw 1.6 lc rgb '#555555' title " + quote(p.theory_title));
  gp << "plot NaN notitle";
  for (const auto& i : items) gp << ", \\\n     " << i;
  gp << "\n";
}

std::string body(const Figure& f) {
  std::ostringstream gp;
  gp << "set encoding utf8\nset datafile missing 'NaN'\n";
  const std::size_t cols = f.columns > 0 ? static_cast<std::size_t>(f.columns) : f.panels.size();
  const LinePanel* legend = f.panels.empty() ? nullptr : std::get_if<LinePanel>(&f.panels[0]);
  const bool below = f.legend_below && cols == f.panels.size() && legend != nullptr;
  // With a legend strip the panels are placed by hand above it; otherwise gnuplot's layout.
  const double strip = 64.0 / f.height;
  if (below)
    gp << "set multiplot\n";
  else
    gp << "set multiplot layout " << (f.panels.size() + cols - 1) / cols << "," << cols << "\n";
  for (std::size_t i = 0; i < f.panels.size(); ++i) {
    gp << "reset\nset encoding utf8\nset datafile missing 'NaN'\n";
    if (below)
      gp << "set origin " << num(static_cast<double>(i) / cols) << "," << num(strip) << "\nset size "
         << num(1.0 / cols) << "," << num(1 - strip) << "\n";
    if (const auto* lp = std::get_if<LinePanel>(&f.panels[i]))
      line_panel(gp, *lp, static_cast<int>(i), below ? "unset key\n" : "");
    else
      heat_panel(gp, std::get<HeatPanel>(f.panels[i]), static_cast<int>(i));
  }
  if (below) legend_strip(gp, *legend, strip);
  gp << "unset multiplot\n";
  return gp.str();
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

LinePanel& Figure::lines(std::string title, std::string xlabel, std::string ylabel) {
  LinePanel p;
  p.title = std::move(title);
  p.xlabel = std::move(xlabel);
  p.ylabel = std::move(ylabel);
  panels.emplace_back(std::move(p));
  return std::get<LinePanel>(panels.back());
}

HeatPanel& Figure::heat(std::string title, std::string xlabel, std::string ylabel) {
  HeatPanel h;
  h.title = std::move(title);
  h.xlabel = std::move(xlabel);
  h.ylabel = std::move(ylabel);
  panels.emplace_back(std::move(h));
  return std::get<HeatPanel>(panels.back());
}

std::string gnuplot_script(const Figure& figure, const std::string& terminal, const std::string& output) {
  return "set terminal " + terminal + "\nset output " + quote(output) + "\n" + body(figure) + "unset output\n";
}

std::string render(const Figure& figure, const std::string& dir) {
  namespace fs = std::filesystem;
  if (figure.panels.empty()) throw Error(fmt::format("figure {}: no panels", figure.name));
  fs::create_directories(dir);
  const fs::path base = fs::path(dir) / figure.name;
  const std::string svg = base.string() + ".svg", png = base.string() + ".png";
  // The script names its outputs relative to its own folder (and gnuplot runs there), so it is the
  // same for any --out and redraws the figure wherever the report has been copied or moved.
  const std::string header = "# Figure " + figure.name + " of attnscale's report. Redraw it from this folder: gnuplot " +
                             figure.name + ".gp (writes " + figure.name + ".svg and " + figure.name + ".png here)\n";
  const std::string size = std::to_string(figure.width) + "," + std::to_string(figure.height);
  // The PNG is drawn at twice the size (with doubled fonts and lines), for sharp print.
  const std::string png_size = std::to_string(2 * figure.width) + "," + std::to_string(2 * figure.height);
  const std::string script =
      header +
      gnuplot_script(figure, "svg size " + size + " dynamic enhanced font 'Helvetica,15' background rgb 'white'",
                     figure.name + ".svg") +
      gnuplot_script(figure,
                     "pngcairo size " + png_size +
                         " enhanced font 'Helvetica,24' linewidth 2 pointscale 2 background rgb 'white'",
                     figure.name + ".png");
  const fs::path gp_path = base.string() + ".gp", log_path = base.string() + ".log";
  write_text_file(gp_path, script);
  const std::string cmd = "cd -- " + shell_quote(dir) + " && gnuplot " + shell_quote(figure.name + ".gp") + " > " +
                          shell_quote(figure.name + ".log") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::string log = slurp(log_path);
  fs::remove(log_path);
  if (rc != 0 || !fs::exists(svg) || !fs::exists(png)) {
    if (log.size() > 600) log = log.substr(log.size() - 600);
    // One line: gnuplot's lines joined; the figure named, not the folder it was drawn in.
    log = std::regex_replace(log, std::regex(R"(\s*\n\s*)"), " ");
    while (!log.empty() && std::isspace(static_cast<unsigned char>(log.back()))) log.pop_back();
    throw Error(fmt::format("gnuplot failed on figure {} (is gnuplot-nox installed?): {}", figure.name, log));
  }
  // Heatmaps reach the SVG as embedded PNG images; keep their cells sharp when scaled up.
  std::string text = slurp(svg);
  text = std::regex_replace(text, std::regex("<image "), "<image style='image-rendering:pixelated' ");
  write_text_file(svg, text);
  return text;
}

std::string inline_svg(const std::string& svg, const std::string& prefix) {
  std::string s = svg;
  const auto start = s.find("<svg");
  if (start == std::string::npos) throw Error("not an SVG document");
  s = s.substr(start);
  s = std::regex_replace(s, std::regex(R"(\bid=(['"]))"), "id=$1" + prefix);
  s = std::regex_replace(s, std::regex(R"(href=(['"])#)"), "href=$1#" + prefix);
  s = std::regex_replace(s, std::regex(R"(url\(#)"), "url(#" + prefix);
  return s;
}

}  // namespace attnscale::report
