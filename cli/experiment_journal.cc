#include "experiment_journal.h"

#include <fmt/format.h>

namespace attnscale::cli {

std::string journal_identity(const lab::Experiment& e, std::uint64_t seed, std::int64_t trials,
                             const std::map<std::string, std::string>& values) {
  std::string id = fmt::format("experiment {} seed={} trials={}", e.name, seed, trials);
  for (const auto& [name, value] : values) id += fmt::format(" --{}={}", name, value);
  return id;
}

std::string keep_or_remove_journal(Journal& journal) {
  const std::size_t done = journal.records().size();
  if (done == 0) {
    journal.remove();
    return "";
  }
  return fmt::format("; {} keeps {} finished point{} for --resume", journal.path(), done, done == 1 ? "" : "s");
}

}  // namespace attnscale::cli
