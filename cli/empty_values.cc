#include "empty_values.h"

#include <mutex>
#include <set>
#include <string>

namespace attnscale::cli {
namespace {

std::mutex marked_mutex;
std::set<const CLI::Option*>& marked() {
  static std::set<const CLI::Option*> options;
  return options;
}

}  // namespace

CLI::Option* empty_value_allowed(CLI::Option* opt) {
  const std::lock_guard lock(marked_mutex);
  marked().insert(opt);
  return opt;
}

void refuse_empty_values(CLI::App& app) {
  // No description: the check adds nothing to --help.
  const CLI::Validator non_empty(
      [](std::string& text) -> std::string {
        return text.empty() ? "empty value; give one, or leave the flag out" : "";
      },
      "");
  for (CLI::Option* opt : app.get_options()) {
    bool allowed = false;
    {
      const std::lock_guard lock(marked_mutex);
      allowed = marked().erase(opt) > 0;  // one app, one walk: the mark is not needed again
    }
    if (!allowed && opt->get_type_size_max() > 0) opt->check(non_empty);
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_empty_values(*sub);
}

}  // namespace attnscale::cli
