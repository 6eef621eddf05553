// Reading the lab's long-form result tables: pick rows by parameter values and metric, and turn
// a sweep into a plot series.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "lab/results.h"
#include "lab/stats.h"
#include "report/plot.h"

namespace attnscale::report {

using Fixed = std::map<std::string, std::string>;  // parameter name → required value

// Rows with this metric whose parameters match every entry of `fixed` (unknown names: Error).
std::vector<const lab::Row*> select(const lab::ResultTable& t, const std::string& metric, const Fixed& fixed);

// The one matching row; throws Error naming the experiment, metric and parameters when there is
// none (the report was asked for a point the run did not measure).
const lab::Row& one(const lab::ResultTable& t, const std::string& metric, const Fixed& fixed);

// The matching rows as a curve against the numeric parameter `x` (rows whose x is not a number,
// such as "all", are skipped), sorted by x, with the CI band and theory.
Series series(const lab::ResultTable& t, const std::string& x, const std::string& metric, const Fixed& fixed,
              const std::string& title);

// The value of parameter `name` in row r.
const std::string& param(const lab::ResultTable& t, const lab::Row& r, const std::string& name);

// Distinct values of a parameter, in order of first appearance.
std::vector<std::string> values(const lab::ResultTable& t, const std::string& name);

// The numerically largest / smallest value of a parameter, as written in the table ("" when none
// is a number).
std::string largest_value(const lab::ResultTable& t, const std::string& name);
std::string smallest_value(const lab::ResultTable& t, const std::string& name);
bool is_number(const std::string& s);

// The value of flag `name` the table was made with (Error when it has none).
const std::string& flag(const lab::ResultTable& t, const std::string& name);

// Whether v lies inside the row's 95% CI.
bool covers(const lab::Row& r, double v);

// How a measurement moves from row `from` to row `to`, told by their 95% CIs: "falls" (to's CI
// wholly below from's), "rises" (wholly above) or "level" (they overlap: no change told apart).
std::string change(const lab::Row& from, const lab::Row& to);
// The slots a section's words are chosen by: NAME_falls, NAME_rises, NAME_level, "true" for the
// change from `from` to `to` and "" for the other two ({{#weight_falls}}falls from ...{{/weight_falls}}).
std::map<std::string, std::string> change_slots(const std::string& name, const lab::Row& from, const lab::Row& to);

// "38.1 [37.9, 38.3]" with `digits` significant digits (more where the ends would read the same);
// "0.42 (no interval)" where the row has none (NaN ends: lab/stats.h kNotComputable).
std::string fmt_ci(const lab::Row& r, int digits = 3);
std::string fmt_ci(const lab::Summary& s, int digits = 3);
std::string fmt(double v, int digits = 3);

// How the figures name a scaling rule of the lab: "none" → "unscaled", "sqrt" → "1/√d", ...
std::string scaling_title(const std::string& rule);

// A Markdown (GitHub) table; "|" inside cells is escaped.
std::string md_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

}  // namespace attnscale::report
