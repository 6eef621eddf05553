// One function per subcommand; each registers itself on the top-level app.
#pragma once
#include <CLI/CLI.hpp>

namespace attnscale::cli {

void add_attend(CLI::App& app);
void add_explain(CLI::App& app);
void add_bench(CLI::App& app);
void add_experiment(CLI::App& app);
void add_report(CLI::App& app);

}  // namespace attnscale::cli
