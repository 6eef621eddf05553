// attnscale: the command-line tool.
// Exit codes: 0 success, 2 bad input (flags, files, shapes), 1 anything unexpected.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "attnscale/error.h"
#include "attnscale/version.h"
#include "empty_values.h"
#include "flag_suggestion.h"
#include "mpi_job.h"
#include "openblas_core.h"
#ifdef ATTNSCALE_HAVE_MPI
#include "attnscale/distributed.h"
#endif
#include "standard_output.h"
#include "subcommands.h"

namespace {

// One line on stderr for this rank; under mpirun with several ranks, the others are stopped too
// (they may be waiting for this one), so no rank hangs, unless every rank has the same error.
int fail(int code, const char* kind, const std::string& what, bool every_rank = false) {
  std::fprintf(stderr, "attnscale: %s%s: %s\n", every_rank ? "" : attnscale::cli::mpi_job::prefix().c_str(), kind,
               what.c_str());
  std::fflush(stderr);
  if (every_rank) attnscale::cli::mpi_job::said_why(code);
  else attnscale::cli::mpi_job::stop_others(code);
  attnscale::cli::mpi_job::finish();
  return code;
}

// Under mpirun, this rank's outcome of its command line agreed on with the other ranks (each either
// failed alike or waits in the same agreement, mpi_job.h): the error every rank stops with, or ""
// when every rank may go on.
std::string agreed_command_line(const std::string& error, const std::string& asked = "") {
#ifdef ATTNSCALE_HAVE_MPI
  try {
    attnscale::cli::mpi_job::agree_on_command_line(error, asked);
  } catch (const attnscale::distributed::AgreedError& e) {
    return e.what();
  }
#else
  (void)error;
  (void)asked;
#endif
  return "";
}

// A command line that did not parse: agreed on first, so each rank prints one line and none is aborted.
int refuse(const std::string& what) {
  if (const std::string agreed = agreed_command_line(what); !agreed.empty())
    return fail(2, "error", agreed, /*every_rank=*/true);
  return fail(2, "error", what);
}

}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) reached is a write error like a full disk (EFBIG): reported on
  // one line, with the temporary files removed. Left to SIGXFSZ's default, the process died there
  // and left its temporary output and journal behind.
  std::signal(SIGXFSZ, SIG_IGN);
  attnscale::cli::restart_with_openblas_core(argv);
  attnscale::cli::mpi_job::start(&argc, &argv);
  CLI::App app{"attnscale: scaled dot-product attention, softmax(Q K^T * s) V, and a lab that measures\n"
               "why s = 1/sqrt(dk)."};
  app.name("attnscale");
  app.set_version_flag("--version", fmt::format("{} ({})", attnscale::version(), attnscale::git_hash()));
  app.require_subcommand(1);
  app.fallthrough(false);
  attnscale::cli::add_attend(app);
  attnscale::cli::add_explain(app);
  attnscale::cli::add_bench(app);
  attnscale::cli::add_experiment(app);
  attnscale::cli::add_report(app);
  attnscale::cli::refuse_empty_values(app);
  // Parsed on every rank: agree before any command runs (a rank whose line failed agrees in refuse()).
  app.parse_complete_callback([] { attnscale::cli::mpi_job::agree_on_command_line(""); });
  try {
    // Name an unknown command plainly instead of CLI11's "A subcommand is required".
    if (argc > 1 && argv[1][0] != '-') {
      bool known = false;
      std::vector<std::string> names;
      for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
        known = known || sub->get_name() == argv[1];
        names.push_back(sub->get_name());
      }
      if (!known) return refuse(fmt::format("unknown command '{}' (expected one of: {})", argv[1], fmt::join(names, ", ")));
    }
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    // --help, --version: printed once every rank asked alike; a rank given it alone stops them all.
    const std::string asked = e.get_name() == "CallForVersion" ? "--version" : "--help";
    if (const std::string agreed = agreed_command_line("", asked); !agreed.empty())
      return fail(2, "error", agreed, /*every_rank=*/true);
    const int code = app.exit(e);
    if (const std::string err = attnscale::cli::stdout_error(); !err.empty()) return fail(2, "error", err);
    attnscale::cli::mpi_job::finish();
    return code;
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    if (what.empty()) what = e.get_name();
    // Point at the help of the subcommand that was given, if any.
    std::string help = "attnscale";
    const CLI::App* given = &app;
    for (const CLI::App* sub : app.get_subcommands())
      for (const CLI::App* s = sub; s != nullptr; s = s->get_subcommands().empty() ? nullptr : s->get_subcommands()[0]) {
        help += " " + s->get_name();
        given = s;
      }
    // A flag the subcommand does not know is the likelier cause than what CLI11 reports first
    // (`--outt o.npy` makes "--out is required"): name it, with the nearest known flag.
    for (const std::string& arg : given->remaining()) {
      if (arg.size() < 2 || arg[0] != '-' || (arg[1] != '-' && !std::isalpha(static_cast<unsigned char>(arg[1]))))
        continue;
      const std::string flag = arg.substr(0, arg.find('='));
      const std::string guess = attnscale::cli::closest_flag(*given, flag);
      what = guess.empty() ? fmt::format("unknown flag {}", flag)
                           : fmt::format("unknown flag {} (did you mean {}?)", flag, guess);
      break;
    }
    return refuse(fmt::format("{} (see {} --help)", what, help));
#ifdef ATTNSCALE_HAVE_MPI
  } catch (const attnscale::distributed::AgreedError& e) {
    return fail(2, "error", e.what(), /*every_rank=*/true);
#endif
  } catch (const attnscale::Error& e) {
    return fail(2, "error", e.what());
  } catch (const std::exception& e) {
    return fail(1, "internal error", e.what());
  }
  if (const std::string err = attnscale::cli::stdout_error(); !err.empty()) return fail(2, "error", err);
  attnscale::cli::mpi_job::finish();
  return 0;
}
