#include "experiment_journal.h"

namespace attnscale::cli {

std::string journal_identity(const lab::Experiment& e, std::uint64_t seed, std::int64_t trials,
                             const std::map<std::string, std::string>& values) {
  std::string id = "experiment " + e.name + " seed=" + std::to_string(seed) + " trials=" + std::to_string(trials);
  for (const auto& [name, value] : values) id += " --" + name + "=" + value;
  return id;
}

}  // namespace attnscale::cli
