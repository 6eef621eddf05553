#include "lab/experiments/training/model_config.h"

#include <cmath>

#include "attnscale/error.h"

namespace attnscale::lab::training {

const std::vector<std::string>& scaling_rules() {
  static const std::vector<std::string> rules = {"none", "sqrt", "linear", "qk-norm", "folded", "learned", "additive"};
  return rules;
}

double scaling_factor(const std::string& rule, std::int64_t d_head) {
  const double d = static_cast<double>(d_head);
  if (rule == "none" || rule == "folded" || rule == "additive") return 1;
  if (rule == "sqrt" || rule == "qk-norm" || rule == "learned") return 1 / std::sqrt(d);
  if (rule == "linear") return 1 / d;
  throw Error("--scaling: unknown rule '" + rule + "'");
}

}  // namespace attnscale::lab::training
