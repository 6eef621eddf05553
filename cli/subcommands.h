// One function per subcommand; each registers itself on the top-level app.
#pragma once
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>

namespace attnscale::cli {

void add_attend(CLI::App& app);
void add_explain(CLI::App& app);
void add_bench(CLI::App& app);
void add_experiment(CLI::App& app);
void add_report(CLI::App& app);

// The check of an integer flag (each item of a list flag): the whole text is one integer in
// [lo, hi], else "expected an integer from lo to hi, got 'text'", which CLI11 prints after the
// flag's name. Its own checks said "Value abc not in range" of words, printed 1.8e308 as the
// bound of PositiveNumber, and let an unsigned flag take "-5" as 2^64 - 5. It adds nothing to the
// flag's --help line (CLI11 would append "INT in [lo - hi]" to the type name): each flag's help
// text states its range in words.
template <class T>
CLI::Validator integer_in(T lo, T hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        T value{};
        const char* end = text.data() + text.size();
        const auto [at, ec] = std::from_chars(text.data(), end, value);
        if (ec == std::errc() && at == end && value >= lo && value <= hi) return {};
        return fmt::format("expected an integer from {} to {}, got '{}'", lo, hi, text);
      },
      "");
}

// The check of a float flag: the whole text is one finite number, else "expected a finite number,
// got 'text'" with the text as given (CLI11 reads 1e999 as inf, which the library then reported
// as "got inf"). A subnormal number is finite and passes.
inline CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (!text.empty() && !std::isspace(static_cast<unsigned char>(text[0])) && end == text.c_str() + text.size() &&
            std::isfinite(value))
          return {};
        return fmt::format("expected a finite number, got '{}'", text);
      },
      "");
}

// The check of every --threads flag: 0 (ATTNSCALE_THREADS, else every core) up to 4096, the bound
// ATTNSCALE_THREADS has too. A thread is started for each (and keeps its own scratch) where the
// work has as many chunks: 2^20 of them, once allowed, failed to start ("internal error") or took
// gigabytes of stacks and scratch before any work was done.
inline constexpr std::int64_t kMaxThreads = 4096;
inline CLI::Validator threads_range() { return integer_in<std::int64_t>(0, kMaxThreads); }

// The check of every seed flag: any unsigned 64-bit integer.
inline CLI::Validator seed_range() { return integer_in<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max()); }

}  // namespace attnscale::cli
