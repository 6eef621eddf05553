// Fuzz target: command-line parsing. The input is a newline-separated argument list; its first
// byte picks what parses it:
//   even: the whole `attnscale` command line (every subcommand, every flag and value check),
//         stopped before the chosen subcommand runs, so no file is read or written;
//   odd:  the shared attention flags (--scale, --causal, --window, --align, --threads) turned
//         into Options and run through forward() on a small problem.
// Bad input must end in CLI::ParseError or attnscale::Error, nothing else.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "cli/mask_options.h"
#include "cli/subcommands.h"

namespace {
using namespace attnscale;

std::vector<std::string> split_args(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args{"attnscale"};
  std::string cur;
  for (std::size_t i = 1; i < size; ++i) {
    if (data[i] == '\n') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  if (!cur.empty()) args.push_back(cur);
  return args;
}

void parse(CLI::App& app, std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
}

// Every flag parsed and checked; thrown instead of running the chosen subcommand.
struct ParsedOk {};

// CLI11 calls pre_callback() on the top-level app after every option is parsed, converted and
// validated, and before any subcommand's action: the place to stop.
class NoActionApp : public CLI::App {
 public:
  using CLI::App::App;
  void pre_callback() override { throw ParsedOk{}; }
};

void whole_command_line(std::vector<std::string>& args) {
  NoActionApp app{"attnscale"};
  app.name("attnscale");
  app.require_subcommand(1);
  app.fallthrough(false);
  app.set_version_flag("--version", "fuzz");
  cli::add_attend(app);
  cli::add_explain(app);
  parse(app, args);
}

void attention_flags(std::vector<std::string>& args) {
  CLI::App app{"flags"};
  cli::MaskFlags flags;
  flags.add_to(app, /*with_mask_file=*/false);
  parse(app, args);
  Tensor storage;
  Options opt = flags.options(storage);
  opt.threads = opt.threads % 4;  // the value is validated above; keep the run small
  float qd[2 * 3 * 2] = {0.5f, -1, 2, 0, 1, 1, -0.25f, 3, 1, 1, 0, 2};
  float out[2 * 3 * 2];
  const TensorView q = TensorView::contiguous(qd, DType::f32, {1, 3, 2, 2});
  const TensorView o = TensorView::contiguous(out, DType::f32, {1, 3, 2, 2});
  forward(q, q, q, Outputs{o}, opt);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::vector<std::string> args = split_args(data, size);
  try {
    if (data[0] % 2 == 0)
      whole_command_line(args);
    else
      attention_flags(args);
  } catch (const ParsedOk&) {
  } catch (const CLI::ParseError&) {
  } catch (const Error&) {
  }
  return 0;
}
