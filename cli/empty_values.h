// Refusing an empty value for every option that takes one.
//
// CLI11 stores `--mask ''` as an empty string, which the subcommands read as "flag not given":
// `--causal ''` silently meant no mask, `--lse ''` no output. One check, added to every
// value-taking option of every subcommand after they are all registered, refuses it instead
// ("--mask: empty value ...", exit 2). Each item of a list flag is checked too ("--d 4,,8").
// The lab's experiment flags are left to the lab, which checks each value itself and gives ''
// a meaning where one is documented (`experiment training --torch-check ''`: no check runs).
#pragma once
#include <CLI/CLI.hpp>

namespace attnscale::cli {

// Marks `opt` as checked elsewhere: refuse_empty_values leaves it alone. Returns `opt`.
CLI::Option* empty_value_allowed(CLI::Option* opt);

// Adds the check to every option of `app` and its subcommands, at any depth, that takes a value
// and was not marked by empty_value_allowed.
void refuse_empty_values(CLI::App& app);

}  // namespace attnscale::cli
