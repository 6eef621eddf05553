// attnscale: the command-line tool.
// Exit codes: 0 success, 2 bad input (flags, files, shapes), 1 anything unexpected.
#include <cstdio>
#include <string>

#include "attnscale/error.h"
#include "attnscale/version.h"
#include "subcommands.h"

int main(int argc, char** argv) {
  CLI::App app{"attnscale: scaled dot-product attention, softmax(Q K^T * s) V, and a lab that measures\n"
               "why s = 1/sqrt(dk)."};
  app.name("attnscale");
  app.set_version_flag("--version", std::string(attnscale::version()) + " (" + attnscale::git_hash() + ")");
  app.require_subcommand(1);
  app.fallthrough(false);
  attnscale::cli::add_attend(app);
  attnscale::cli::add_explain(app);
  try {
    // A first word that is neither a flag nor a subcommand: name it (CLI11 only says one is required).
    if (argc > 1 && argv[1][0] != '-' &&
        app.get_subcommands([&](const CLI::App* s) { return s->check_name(argv[1]); }).empty()) {
      std::string names;
      for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
        names += (names.empty() ? "" : ", ") + s->get_name();
      throw CLI::ParseError("unknown subcommand '" + std::string(argv[1]) + "' (expected one of: " + names + ")",
                            CLI::ExitCodes::ExtrasError);
    }
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    if (what.empty()) what = e.get_name();
    std::fprintf(stderr, "attnscale: error: %s (see attnscale --help)\n", what.c_str());
    return 2;
  } catch (const attnscale::Error& e) {
    std::fprintf(stderr, "attnscale: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnscale: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
