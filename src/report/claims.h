// The table of every claim in the seeds: what each predicts, what was measured (± 95% CI), and a
// verdict computed from the data by a rule stated next to it.
#pragma once
#include <string>
#include <vector>

#include "report/report.h"

namespace attnscale::report {

struct Claim {
  std::string claim;        // quoted or paraphrased from the seed
  std::string source;       // "000", "001–004", ...
  std::string prediction;   // what it predicts, in numbers where it has them
  std::string measurement;  // mean [95% CI], with the conditions
  std::string verdict;      // "supported", "refuted", "mixed", "not testable here"
  std::string css;          // supported | refuted | mixed | untestable
  std::string rule;         // how the verdict was decided (shown under the table)
};

std::vector<Claim> evaluate_claims(const Measurements& m);

}  // namespace attnscale::report
