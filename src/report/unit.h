// A report unit: everything the report knows about one experiment, kept in the experiment's own
// folder src/lab/experiments/<name>/ (report.cc and section.md) and listed once in the registry
// (lab/experiments/list.h). The report is a loop over units: measure (each unit's Settings), draw
// (each unit's figures), write (each unit's section.md with its slots), judge (each unit's claims).
//
// Example (src/lab/experiments/variance/report.cc):
//   Unit unit_variance() {
//     Unit u;
//     u.quick = {{{"d", "1,4,16,64,256,1024"}}, 300};
//     u.standard = {{}, 2000};
//     u.full = {{}, 20000};
//     u.figures = [](const lab::ResultTable& t) { ... return std::vector<Figure>{f}; };
//     u.slots = [](const lab::ResultTable& t) { return Slots{{"slope", fmt_ci(...)}, ...}; };
//     u.claims = [](const lab::ResultTable& t) { ... return std::vector<Evidence>{...}; };
//     return u;
//   }
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lab/results.h"
#include "report/plot.h"

namespace attnscale::report {

enum class Depth { quick, standard, full };  // --quick: for tests; standard: `make report`; --full

// How the report runs a unit's experiment at one depth.
struct Settings {
  std::map<std::string, std::string> flags;  // flags not listed keep the experiment's defaults
  std::int64_t trials = 0;                   // 0: the experiment's default
};

// Values of a template's slots, by name (report/template.h).
using Slots = std::map<std::string, std::string>;

enum class Verdict { supported, refuted, mixed };
const char* verdict_name(Verdict v);  // "supported", "refuted", "mixed"

// The evidence on one claim of the references, judged by a rule on the unit's own rows.
struct Evidence {
  std::string claim;        // the claim's id in the catalogue (report/templates/claims.md)
  std::string prediction;   // what the claim predicts in this setting, in numbers where it has them
  std::string measurement;  // what was measured, mean [95% CI], with the conditions
  std::string rule;         // the rule and its thresholds, in words (printed under the claims table)
  Verdict verdict = Verdict::mixed;  // computed from the rows by that rule, never written by hand
};

// The verdict of a rule: supported when `ok`, refuted otherwise.
inline Verdict judge(bool ok) { return ok ? Verdict::supported : Verdict::refuted; }

// The most misses of a true value that 95% intervals in n independent settings give with a
// probability of at least 1%: the largest k with P(Binomial(n, 0.05) ≥ k) ≥ 0.01 (1 of 1 to 3,
// 2 of 4 to 9, 3 of 10 to 17).
int misses_chance_allows(int n);

// Whether the misses of `value` by the rows' intervals are what chance gives a true value: no more
// of them than misses_chance_allows, and none with the value further outside its interval than
// twice the half-width (a true value lands there about once in 10⁴). Rows without an interval (NaN
// ends) are left out of both functions: no evidence either way.
bool misses_are_chance(const std::vector<std::pair<const lab::Row*, double>>& rows);

// A claim that a value holds in every setting, judged by how many settings' intervals contain it:
// supported when ≥ 80% of them do, refuted when the misses are more or further than chance gives a
// true value (misses_are_chance), mixed in between: an "inside at < 80%" rule alone refutes true
// statements (with 4 settings, one miss in five runs).
Verdict coverage_verdict(const std::vector<std::pair<const lab::Row*, double>>& rows);
inline constexpr const char* kCoverageRule =
    "refuted when it misses the CI more often or further than chance explains for a true value (more misses "
    "than 95% intervals give a true value with a probability of at least 1%, which allows 1 of 1–3 settings "
    "and 2 of 4–9; or one miss by more than twice the CI's half-width); mixed otherwise";

struct Unit {
  std::string name;  // the experiment's (and the folder's) name
  // The experiment's flags and trials for `attnscale report --quick` (tests: seconds), the default
  // (`make report`: a minute or two for everything) and --full.
  Settings quick, standard, full;
  // Figures from the unit's table, all drawn before any prose is written. section.md places each
  // with a line ![caption](figure:NAME).
  std::function<std::vector<Figure>(const lab::ResultTable&)> figures;
  // The values of section.md's slots; the report's own templates see them as {{<name>.<slot>}}.
  std::function<Slots(const lab::ResultTable&)> slots;
  // Evidence on claims of the references, each judged next to the rows it reads.
  std::function<std::vector<Evidence>(const lab::ResultTable&)> claims;
  // Its experiment needs an optional dependency (libtorch): an earlier report that `report --from`
  // reads may lack its data (written by a build without it), and the report is then written without
  // it. Every other unit's data is required.
  bool optional = false;

  const Settings& settings(Depth depth) const;
};

// Every unit of the registry, in its order.
const std::vector<Unit>& units();

}  // namespace attnscale::report
