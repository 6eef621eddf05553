// Fuzz target: command-line parsing. The input is a newline-separated argument list; its first
// byte (mod 3) picks what parses it:
//   0: the whole `attnscale` command line (every subcommand and experiment, every flag and value
//      check), stopped before the chosen subcommand runs, so no file is read or written;
//   1: the shared attention flags (--scale, --causal, --window, --align, --threads) turned into
//      Options and run through forward() on a small problem;
//   2: the lab's experiment flags: the second byte picks an experiment, the arguments are
//      name/value pairs put into lab::Args, and the experiment's points() parses and checks them
//      (ints, doubles, words, sweep lists) without running a trial.
// Bad input must end in CLI::ParseError or attnscale::Error, nothing else.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "cli/empty_values.h"
#include "cli/mask_options.h"
#include "cli/subcommands.h"
#include "lab/experiment.h"

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
  cli::add_bench(app);
  cli::add_experiment(app);
  cli::add_report(app);
  cli::refuse_empty_values(app);
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

void experiment_flags(const std::uint8_t* data, std::size_t size, const std::vector<std::string>& args) {
  const auto& all = lab::experiments();
  const lab::Experiment& e = all[(size > 1 ? data[1] : 0) % all.size()];
  lab::Args a;
  for (const auto& f : e.flags) a.values[f.name] = f.default_value;
  // args[0] is the program name and args[1] starts with the experiment byte: pairs from args[2].
  for (std::size_t i = 2; i + 1 < args.size(); i += 2) {
    const std::string name = args[i].rfind("--", 0) == 0 ? args[i].substr(2) : args[i];
    if (a.values.count(name)) a.values[name] = args[i + 1];
  }
  a.seed = 1;
  a.trials = 1;
  a.threads = 1;
  e.points(a);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::vector<std::string> args = split_args(data, size);
  try {
    if (data[0] % 3 == 0)
      whole_command_line(args);
    else if (data[0] % 3 == 1)
      attention_flags(args);
    else
      experiment_flags(data, size, args);
  } catch (const ParsedOk&) {
  } catch (const CLI::ParseError&) {
  } catch (const Error&) {
  }
  return 0;
}
