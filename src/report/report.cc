// `attnscale report`: measure, draw, write. See report.h.
#include "report/report.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "attnscale/error.h"
#include "attnscale/version.h"
#include "common/parallel.h"
#include "common/progress.h"
#include "lab/experiment.h"
#include "report/claims.h"
#include "report/placement.h"
#include "report/plot.h"
#include "report/query.h"
#include "report/templates.h"
#include "report/text_file.h"

namespace attnscale::report {
namespace fs = std::filesystem;
namespace {

// A flag's value as a POSIX shell word: as it is when it is made only of characters no shell
// reads specially, else in single quotes (an empty value too, so that it stays an argument).
std::string shell_word(const std::string& v) {
  const bool plain = !v.empty() && v.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                       "0123456789,._+-/:=@%") == std::string::npos;
  if (plain) return v;
  std::string out = "'";
  for (char c : v) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string reproduce_command(const lab::ResultTable& t) {
  std::string cmd = "attnscale experiment " + t.meta.experiment;
  for (const auto& [k, v] : t.meta.flags) cmd += fmt::format(" --{} {}", k, shell_word(v));
  // An experiment that trains models has no trials and refuses --trials (its --seeds is above).
  if (lab::find_experiment(t.meta.experiment).trials_unused.empty()) cmd += fmt::format(" --trials {}", t.meta.trials);
  return cmd + fmt::format(" --seed {}", t.meta.seed);
}

// The distinct values of one metadata field over the tables, in registry order, joined by ", ".
template <class F>
std::string distinct(const Measurements& m, F field) {
  std::vector<std::string> seen;
  for (const Unit& u : units()) {
    const auto it = m.tables.find(u.name);
    if (it == m.tables.end()) continue;
    const std::string v = field(it->second.meta);
    if (std::find(seen.begin(), seen.end(), v) == seen.end()) seen.push_back(v);
  }
  return fmt::format("{}", fmt::join(seen, ", "));
}

// What measured the data, from the tables' own metadata: a report rewritten --from an earlier one
// names the version, seed, CPU target and threads that measured it, not this run's (nor its --seed).
std::string data_seed(const Measurements& m) {
  return distinct(m, [](const lab::Metadata& x) { return std::to_string(x.seed); });
}

std::string metadata_line(const Measurements& m) {
  const std::string seed = data_seed(m);
  return fmt::format("attnscale {} · seed{} {} · CPU target {} · {} threads · measured in {:.1f} s",
                     distinct(m, [](const lab::Metadata& x) { return x.version + " (git " + x.git_hash + ")"; }),
                     seed.find(',') == std::string::npos ? "" : "s", seed,
                     distinct(m, [](const lab::Metadata& x) { return x.cpu_target; }),
                     distinct(m, [](const lab::Metadata& x) { return std::to_string(x.threads); }), m.seconds);
}

std::string reproducibility_table(const Measurements& m) {
  std::vector<std::vector<std::string>> rows;
  for (const Unit& u : units()) {
    const auto it = m.tables.find(u.name);
    if (it == m.tables.end()) continue;
    const lab::ResultTable& t = it->second;
    rows.push_back({u.name, std::to_string(t.rows.size()), fmt::format("{:.2f}", t.meta.seconds),
                    "`" + reproduce_command(t) + "`"});
  }
  return md_table({"experiment", "rows", "seconds", "command"}, rows);
}

// The units whose tables were measured, in registry order.
std::vector<const Unit*> present(const Measurements& m) {
  std::vector<const Unit*> out;
  for (const Unit& u : units())
    if (m.tables.count(u.name)) out.push_back(&u);
  return out;
}

// Every figure of every unit, drawn by gnuplot (several at once) before any prose is written.
std::map<std::string, std::string> draw_figures(const Measurements& m, const std::string& dir) {
  std::vector<Figure> all;
  for (const Unit* u : present(m))
    if (u->figures)
      for (Figure& f : u->figures(m.tables.at(u->name))) all.push_back(std::move(f));
  std::vector<std::string> svg(all.size());
  const auto n = static_cast<std::int64_t>(all.size());
  parallel_for(n, 1, resolve_threads(m.threads, n), [&](std::int64_t a, std::int64_t b, int) {
    for (std::int64_t i = a; i < b; ++i) svg[i] = render(all[i], (fs::path(dir) / "figures").string());
  });
  std::map<std::string, std::string> out;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (!out.emplace(all[i].name, std::move(svg[i])).second)
      throw Error(fmt::format("report: two figures are named {}", all[i].name));
  return out;
}

}  // namespace

// The tables of an earlier report: DIR/data/<unit>.json of every unit, all read before anything is
// written. Only an optional unit's file may be missing (the unit is then left out).
Measurements read_measurements(const ReportOptions& options) {
  Measurements m;
  m.options = options;
  m.threads = resolve_threads(options.threads);
  std::string missing, needed;
  for (const Unit& u : units()) {
    const fs::path path = fs::path(options.from) / "data" / (u.name + ".json");
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      if (!u.optional) {
        missing += (missing.empty() ? "" : ", ") + path.string();
        needed += (needed.empty() ? "" : ", ") + u.name;
      }
      continue;
    }
    std::ostringstream text;
    text << in.rdbuf();
    m.tables[u.name] = lab::from_json(text.str(), path.string());
    m.seconds += m.tables[u.name].meta.seconds;
  }
  if (m.tables.empty()) throw Error(fmt::format("--from: {} holds no data/<experiment>.json of this build's units", options.from));
  if (!missing.empty())
    throw Error(fmt::format("--from: {}: missing; the report needs the data of the {} experiment{}", missing, needed,
                            needed.find(',') == std::string::npos ? "" : "s"));
  return m;
}

Measurements measure(const ReportOptions& options) {
  if (!options.from.empty()) return read_measurements(options);
  const auto start = std::chrono::steady_clock::now();
  Measurements m;
  m.options = options;
  m.threads = resolve_threads(options.threads);
  const auto& all = units();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Unit& u = all[i];
    const lab::Experiment& e = lab::find_experiment(u.name);
    const Settings& s = u.settings(options.depth);
    std::unique_ptr<ProgressBar> bar;
    if (options.progress) bar = std::make_unique<ProgressBar>(fmt::format("report [{}/{}] {}", i + 1, all.size(), u.name));
    m.tables[u.name] = lab::run_experiment(
        e, s.flags, options.seed, s.trials, m.threads,  // 0: the experiment's default
        [&](std::size_t done, std::size_t total, const std::vector<lab::Row>&) {
          if (bar) bar->update(done, total);
        });
  }
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return m;
}

Page compose(const Measurements& m, const std::string& dir) {
  Page page;
  page.figures = draw_figures(m, dir);

  // Slots: each unit's own, then the report's view of all of them ({{unit.slot}}).
  const std::string metadata = metadata_line(m);
  Slots global{{"seed", data_seed(m)}, {"metadata", metadata},
               {"reproducibility_table", reproducibility_table(m)}};
  std::vector<Evidence> evidence;
  std::vector<std::pair<const Unit*, Slots>> unit_slots;
  int number = 0;
  for (const Unit* u : present(m)) {
    const lab::ResultTable& t = m.tables.at(u->name);
    Slots s = u->slots ? u->slots(t) : Slots{};
    s["trials"] = std::to_string(t.meta.trials);
    s["command"] = "`" + reproduce_command(t) + "`";
    s["section"] = fmt::format("3.{}", ++number);
    global["section." + u->name] = s["section"];
    global["has." + u->name] = "true";
    for (const auto& [k, v] : s) global[u->name + "." + k] = v;
    if (u->claims)
      for (Evidence& e : u->claims(t)) evidence.push_back(std::move(e));
    unit_slots.emplace_back(u, std::move(s));
  }
  const auto claims = join_claims(evidence);
  const ClaimCounts counts = count_claims(claims);
  global["claims_table"] = claims_markdown(claims);
  global["claims.total"] = std::to_string(claims.size());
  global["claims.judged"] = std::to_string(claims.size() - counts.unmeasured);
  global["claims.supported"] = std::to_string(counts.supported);
  global["claims.refuted"] = std::to_string(counts.refuted);
  global["claims.mixed"] = std::to_string(counts.mixed);
  global["claims.unmeasured"] = std::to_string(counts.unmeasured);
  global["claims.any_unmeasured"] = counts.unmeasured > 0 ? "true" : "";
  for (const ClaimRow& r : claims)
    if (r.evidence) {
      const std::string v = verdict_name(r.evidence->verdict);
      global["verdict." + r.claim.id] = v;
      global[v + "." + r.claim.id] = "true";
    }
  // The discussion names Propositions 3 and 4's verdicts in one clause: "Propositions 3 and 4 are
  // both judged supported" when alike, else each with its own ("Proposition 3 is judged mixed and
  // Proposition 4 supported").
  if (global.count("verdict.p3") && global.count("verdict.p4"))
    global["verdict.p3_p4"] = global["verdict.p3"] == global["verdict.p4"]
                                  ? "Propositions 3 and 4 are both judged " + global["verdict.p3"]
                                  : "Proposition 3 is judged " + global["verdict.p3"] + " and Proposition 4 " +
                                        global["verdict.p4"];
  std::string refuted;
  for (const ClaimRow& r : claims)
    if (r.evidence && r.evidence->verdict == Verdict::refuted)
      refuted += fmt::format("{}{} ({})", refuted.empty() ? "" : "; ", r.claim.claim, r.claim.reference);
  global["claims.refuted_list"] = refuted;

  auto report_part = [&](const std::string& name) {
    const std::string path = "report/templates/" + name + ".md";
    return render_template(template_text(path), global, path);
  };
  page.title = "The scaling factor in self-attention, completed";
  page.subtitle = "Chuang (2023) with its empty sections written from measurements\n" + metadata;
  page.abstract = report_part("abstract");
  std::string body = report_part("introduction") + "\n" + report_part("algorithm") + "\n" + report_part("experiments");
  for (auto& [u, s] : unit_slots) {
    for (const auto& [k, v] : global)
      if (!s.count(k)) s.emplace(k, v);
    const std::string path = "lab/experiments/" + u->name + "/section.md";
    body += "\n" + render_template(template_text(path), s, path);
  }
  for (const char* part : {"discussion", "conclusion", "appendix", "references"}) body += "\n" + report_part(part);
  page.body = body;
  return page;
}

// The report is written whole into a temporary folder inside DIR, then its files are put in place
// all or none (report/placement.h; index.html last), so a failure leaves DIR as it was: no partial
// report, no new figures/ or data/ folder. Files of DIR that are not the report's are left alone.
std::string write_report(const Measurements& m) {
  const fs::path dir = m.options.out;
  const fs::path tmp = dir / fmt::format(".report.tmp.{}", static_cast<long>(::getpid()));
  struct Staging {  // removed on every way out
    fs::path path;
    ~Staging() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } staging{tmp};
  std::vector<fs::path> files;  // relative to tmp, in the order they are placed
  // A file of the report, staged; an error names it where it was going (DIR/data/x.csv).
  const auto write = [&](const fs::path& rel, const std::string& text) {
    try {
      write_text_file(tmp / rel, text, dir / rel);
    } catch (const Error& e) {
      throw Error(fmt::format("--out: {}", e.what()));
    }
  };
  try {
    fs::create_directories(tmp / "figures");
    fs::create_directories(tmp / "data");
    for (const auto& [name, t] : m.tables) {
      write(fs::path("data") / (name + ".csv"), lab::to_csv(t));
      write(fs::path("data") / (name + ".json"), lab::to_json(t));
    }
    const Page page = compose(m, tmp.string());
    write("report.md", page.markdown());
    write("index.html", page.html());
    for (const char* sub : {"data", "figures"})
      for (const auto& entry : fs::directory_iterator(tmp / sub)) files.push_back(fs::path(sub) / entry.path().filename());
  } catch (const fs::filesystem_error& e) {
    throw Error(fmt::format("--out: {}: {}", dir.string(), e.code().message()));
  }
  std::sort(files.begin(), files.end());
  files.push_back("report.md");
  files.push_back("index.html");
  try {
    place_files(tmp, dir, files);
  } catch (const Error& e) {
    throw Error(fmt::format("--out: {}", e.what()));
  }
  return (dir / "index.html").string();
}

}  // namespace attnscale::report
