// The flag a misspelt one was probably meant to be: `--outt` -> `--out`, `--casual` -> `--causal`.
#pragma once
#include <CLI/CLI.hpp>

#include <string>

namespace attnscale::cli {

// The long flag of `app` nearest to `given` (a "--name" as typed), or "" when none is close: an
// edit distance (insertions, deletions, substitutions, swaps of neighbours) of at most 2, and at
// most a third of the name's length.
std::string closest_flag(const CLI::App& app, const std::string& given);

}  // namespace attnscale::cli
