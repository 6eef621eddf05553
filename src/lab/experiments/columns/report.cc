// The columns experiment in the report: what softmax over each column, Chuang (2023)'s wording,
// would compute instead of attention's softmax over each row.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "report/query.h"
#include "report/unit.h"

namespace attnscale::report {
namespace {

struct Columns {
  std::string n, d;
  const lab::ResultTable* t;
  const lab::Row& get(const char* norm, const char* metric) const {
    return one(*t, metric, {{"n", n}, {"d", d}, {"normalisation", norm}});
  }
};

// A row's mean and interval; "0 in every trial" where every trial measured exactly 0 (the row-wise
// causal leak: a query never sees later positions), which has no interval and needs none.
std::string shown(const lab::Row& r) {
  return r.mean == 0 && std::isnan(r.ci_low) ? std::string("0 in every trial") : fmt_ci(r);
}

// The point the section quotes: the Simulation note's N = 50 when it was run, else the first N.
Columns quoted_point(const lab::ResultTable& t) {
  const auto ns = values(t, "n");
  const bool has50 = std::find(ns.begin(), ns.end(), "50") != ns.end();
  return {has50 ? "50" : ns.front(), values(t, "d").front(), &t};
}

std::vector<Figure> figures(const lab::ResultTable& t) {
  const std::string d = values(t, "d").front();
  Figure f{"columns"};
  f.width = 960;
  f.height = 430;
  LinePanel& a = f.lines("Column-wise P: row sums (rows of attention's P sum to 1)", "N", "row sum of P'");
  a.logx = true;
  a.key_position = "center left";
  a.series.push_back(series(t, "n", "row_sum_max", {{"d", d}, {"normalisation", "column"}}, "largest row sum"));
  a.series.push_back(series(t, "n", "row_sum_min", {{"d", d}, {"normalisation", "column"}}, "smallest row sum"));
  a.refs.push_back({1, "1 (attention)"});
  LinePanel& b = f.lines("Column-wise output against attention's", "N", "");
  b.logx = true;
  b.key_position = "center right";
  b.series.push_back(series(t, "n", "output_rel_diff", {{"d", d}, {"normalisation", "column"}}, "‖O' − O‖/‖O‖"));
  b.series.push_back(series(t, "n", "causal_leak", {{"d", d}, {"normalisation", "column"}}, "causal leak, column-wise"));
  b.series.push_back(series(t, "n", "causal_leak", {{"d", d}, {"normalisation", "row"}}, "causal leak, row-wise"));
  return {f};
}

Slots slots(const lab::ResultTable& t) {
  const Columns c = quoted_point(t);
  const lab::Row &rmin = c.get("column", "row_sum_min"), &rmax = c.get("column", "row_sum_max");
  Slots s{{"n", c.n}, {"d", c.d}, {"row_sum_min", fmt(rmin.mean, 2)}, {"row_sum_max", fmt(rmax.mean, 2)}};
  s["table"] = md_table(
      {"quantity", "row-wise (attention)", "column-wise (Chuang's wording)"},
      {{"rows of P sum to", "1 (max error " + shown(c.get("row", "row_sum_error")) + ")",
        "from " + shown(rmin) + " to " + shown(rmax)},
       {"columns of P sum to",
        "from " + shown(c.get("row", "col_sum_min")) + " to " + shown(c.get("row", "col_sum_max")),
        "1 (max error " + shown(c.get("column", "col_sum_error")) + ")"},
       {"‖O' − O‖_{F} / ‖O‖_{F}", "0", shown(c.get("column", "output_rel_diff"))},
       {"causal mask: largest change of earlier outputs when only the last query changes",
        shown(c.get("row", "causal_leak")), shown(c.get("column", "causal_leak"))}});
  const lab::Row &leak = c.get("column", "causal_leak"), &diff = c.get("column", "output_rel_diff");
  s["leaks"] = leak.ci_low > 0 ? "true" : "";
  s["differs"] = diff.ci_low > 0.01 ? "true" : "";
  // "no longer a weighted average": some row of P' sums to 1 ± 1% at most (CI), not near 1.
  s["not_average"] = rmin.ci_high < 0.99 || rmax.ci_low > 1.01 ? "true" : "";
  return s;
}

std::vector<Evidence> claims(const lab::ResultTable& t) {
  const Columns c = quoted_point(t);
  const lab::Row &diff = c.get("column", "output_rel_diff"), &leak_col = c.get("column", "causal_leak"),
                 &leak_row = c.get("row", "causal_leak");
  const bool differs = diff.ci_low > 0.01 && leak_col.ci_low > 0 && leak_row.mean == 0;  // ≥ 0 in every trial, so 0 in every one
  return {{"columns", "read literally: the columns of P sum to 1, and this is attention",
           fmt::format("N={}, d={}: column-wise P has row sums from {} to {}; its output differs from attention's by "
                       "{} (relative Frobenius); under a causal mask a change to the last query moves earlier outputs "
                       "by {} (row-wise: {})",
                       c.n, c.d, shown(c.get("column", "row_sum_min")), shown(c.get("column", "row_sum_max")),
                       shown(diff), shown(leak_col), shown(leak_row)),
           "refuted as a description of attention when the column-wise output differs from the row-wise one by "
           "more than 1% and leaks future queries into earlier outputs while the row-wise one does not",
           judge(!differs)}};
}

}  // namespace

Unit unit_columns() {
  return {.quick = {{{"n", "8,50"}}, 50},
          .standard = {{{"n", "8,16,32,50,100"}}, 200},
          .full = {{{"n", "8,16,32,50,100,200"}}, 2000},
          .figures = figures, .slots = slots, .claims = claims};
}

}  // namespace attnscale::report
