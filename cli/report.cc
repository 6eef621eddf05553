// attnscale report: runs every lab experiment and writes Chuang (2023) completed (HTML, Markdown,
// figures, data) into --out. See src/report/report.h.
#include <chrono>
#include <cstdio>

#include "attnscale/error.h"
#include "lab/point_scheduler.h"
#include "new_folder.h"
#include "report/report.h"
#include "subcommands.h"

namespace attnscale::cli {

void add_report(CLI::App& app) {
  auto opts = std::make_shared<report::ReportOptions>();
  auto quick = std::make_shared<bool>(false);
  auto full = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand(
      "report", "Run every experiment and write the completed paper: DIR/index.html (self-contained), "
                "DIR/report.md, DIR/figures/, DIR/data/");
  sub->add_option("--out", opts->out, "output folder (created if missing)")->capture_default_str();
  auto* seed = sub->add_option("--seed", opts->seed, "master seed of every random stream, 0 to 2^64-1")
                   ->capture_default_str()
                   ->check(seed_range());
  sub->add_option("--threads", opts->threads, "threads, 0 to 4096 (0: $ATTNSCALE_THREADS, else every core)")
      ->check(threads_range());
  sub->add_option("--from", opts->from,
                  "write the report from the data/*.json of an earlier report in this folder, measuring nothing")
      ->type_name("DIR")
      ->check(CLI::Validator(CLI::ExistingDirectory).description(""));
  auto* q = sub->add_flag("--quick", *quick, "small sweeps and few trials (seconds; used by tests)");
  auto* f = sub->add_flag("--full", *full,
                          "more trials, each experiment its own (most ten times the default); training and "
                          "recall run their --grid full, of the order of 100 CPU-hours (lab.md: docs/ in the source, "
                          "share/doc/attnscale/ installed)");
  q->excludes(f);
  sub->callback([opts, quick, full, seed] {
    opts->depth = *quick ? report::Depth::quick : *full ? report::Depth::full : report::Depth::standard;
    // --from measures nothing: a seed or depth given with it would change nothing but could be
    // taken for the data's (the report names the seed the data were measured with).
    if (!opts->from.empty() && (seed->count() > 0 || *quick || *full))
      throw Error(fmt::format("{}: not used with --from, which rewrites the report from data already measured",
                              seed->count() > 0 ? "--seed" : *quick ? "--quick" : "--full"));
    if (opts->out.empty()) throw Error("--out: expected a folder");
    // Checked before the measurements start, so a bad folder fails in a second, not after minutes.
    NewFolder folder("--out", opts->out);
    const auto start = std::chrono::steady_clock::now();
    std::string index;
    int threads = 1;
    try {
      opts->progress = lab::point_scheduler().writes_results();
      const report::Measurements m = report::measure(*opts);
      if (!lab::point_scheduler().writes_results()) return;  // under mpirun, rank 0 writes the report
      index = report::write_report(m);
      threads = m.threads;
    } catch (...) {
      // No partial output: the folders made above go again (write_report places all or nothing).
      folder.undo();
      throw;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "attnscale report: wrote %s (%.1f s, %d threads)\n", index.c_str(), secs, threads);
  });
}

}  // namespace attnscale::cli
