#include "empty_values.h"

#include <string>

namespace attnscale::cli {

void refuse_empty_values(CLI::App& app) {
  // No description: the check adds nothing to --help.
  const CLI::Validator non_empty(
      [](std::string& text) -> std::string {
        return text.empty() ? "empty value; give one, or leave the flag out" : "";
      },
      "");
  for (CLI::Option* opt : app.get_options())
    if (opt->get_type_size_max() > 0) opt->check(non_empty);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_empty_values(*sub);
}

}  // namespace attnscale::cli
