// Result rows of the lab, in the long form of docs/lab.md ("Common contract"), and their CSV/JSON writers.
//
// CSV header: the sweep parameters by name (e.g. n,d,scaling,dist), then
//   metric,mean,ci_low,ci_high,theory
// with `theory` empty where no closed form exists. JSON carries the same rows plus metadata.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace attnscale::lab {

struct Row {
  std::vector<std::string> params;  // values in the order of ResultTable::param_names
  std::string metric;               // e.g. "top_p_95", "var_qk"
  double mean = 0, ci_low = 0, ci_high = 0;  // 95% confidence interval of the mean
  std::optional<double> theory;              // closed-form prediction, when one exists
};

// How a result was made: enough to reproduce it.
struct Metadata {
  std::string experiment;
  std::uint64_t seed = 0;
  std::int64_t trials = 0;
  int threads = 1;
  std::string version, git_hash, cpu_target;
  double seconds = 0;
  std::vector<std::pair<std::string, std::string>> flags;  // every flag as given/defaulted
};

struct ResultTable {
  std::vector<std::string> param_names;
  std::vector<Row> rows;
  Metadata meta;
};

// Numbers are written with 17 significant digits ("%.17g"), so files are bitwise reproducible.
std::string to_csv(const ResultTable& table);
std::string to_json(const ResultTable& table);

// A table back from to_json's text (JSON null, written for non-finite numbers, reads as NaN; a null
// theory as none). Throws Error naming `where` on text that is not such a table.
ResultTable from_json(const std::string& text, const std::string& where);

}  // namespace attnscale::lab
