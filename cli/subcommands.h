// One function per subcommand; each registers itself on the top-level app.
#pragma once
#include <CLI/CLI.hpp>

namespace attnscale::cli {

void add_attend(CLI::App& app);
void add_explain(CLI::App& app);
void add_bench(CLI::App& app);
void add_experiment(CLI::App& app);
void add_report(CLI::App& app);

// The check of every --threads flag: 0 (ATTNSCALE_THREADS, else every core) up to 2^20.
inline CLI::Validator threads_range() { return CLI::Range(0, 1 << 20); }

}  // namespace attnscale::cli
