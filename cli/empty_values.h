// Refusing an empty value for every option that takes one.
//
// CLI11 stores `--mask ''` as an empty string, which the subcommands read as "flag not given":
// `--causal ''` silently meant no mask, `--lse ''` no output. One check, added to every
// value-taking option of every subcommand after they are all registered, refuses it instead
// ("--mask: empty value ...", exit 2). Each item of a list flag is checked too ("--d 4,,8").
#pragma once
#include <CLI/CLI.hpp>

namespace attnscale::cli {

// Adds the check to every option of `app` and its subcommands, at any depth, that takes a value.
void refuse_empty_values(CLI::App& app);

}  // namespace attnscale::cli
