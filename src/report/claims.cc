// See claims.h.
#include "report/claims.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "attnscale/error.h"
#include "report/query.h"
#include "report/templates.h"

namespace attnscale::report {
namespace {

constexpr const char* kCatalogue = "report/templates/claims.md";

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string verdict_cell(const std::string& css, const std::string& word) {
  return fmt::format("<span class=\"verdict {}\">{}</span>", css, word);
}

}  // namespace

std::vector<CatalogueClaim> claim_catalogue() {
  std::vector<CatalogueClaim> out;
  std::istringstream in(template_text(kCatalogue));
  std::string line;
  int row = 0;
  while (std::getline(in, line)) {
    if (line.rfind("|", 0) != 0) continue;
    if (++row <= 2) continue;  // header and separator
    std::vector<std::string> cells;
    std::size_t start = 1;
    for (std::size_t bar = line.find('|', start); bar != std::string::npos; bar = line.find('|', start)) {
      cells.push_back(trim(line.substr(start, bar - start)));
      start = bar + 1;
    }
    if (cells.size() != 4 || cells[0].empty())
      throw Error(fmt::format("{}: expected | id | claim | reference | measured by |, got: {}", kCatalogue, line));
    out.push_back({cells[0], cells[1], cells[2], cells[3]});
  }
  return out;
}

std::vector<ClaimRow> join_claims(const std::vector<Evidence>& evidence) {
  std::vector<ClaimRow> rows;
  for (auto& c : claim_catalogue()) rows.push_back({std::move(c), std::nullopt});
  for (const Evidence& e : evidence) {
    auto it = std::find_if(rows.begin(), rows.end(), [&](const ClaimRow& r) { return r.claim.id == e.claim; });
    if (it == rows.end())
      throw Error(fmt::format("report: evidence on claim '{}', which {} does not list", e.claim, kCatalogue));
    if (it->evidence) throw Error(fmt::format("report: claim '{}' was judged twice", e.claim));
    it->evidence = e;
  }
  return rows;
}

std::string claims_markdown(const std::vector<ClaimRow>& rows) {
  std::vector<std::vector<std::string>> cells;
  std::string rules;
  for (const ClaimRow& r : rows) {
    if (r.evidence) {
      const Evidence& e = *r.evidence;
      const char* v = verdict_name(e.verdict);
      cells.push_back({r.claim.claim, r.claim.reference, e.prediction, e.measurement, verdict_cell(v, v)});
      rules += fmt::format("- *{}* — {}.\n", r.claim.claim, e.rule);
    } else {
      cells.push_back({r.claim.claim, r.claim.reference, "—",
                       fmt::format("not measured in this report: `attnscale experiment {}`", r.claim.measured_by),
                       verdict_cell("unmeasured", "not measured")});
    }
  }
  return md_table({"claim", "reference", "prediction", "measured (mean [95% CI])", "verdict"}, cells) + "\n" + rules;
}

ClaimCounts count_claims(const std::vector<ClaimRow>& rows) {
  ClaimCounts c;
  for (const ClaimRow& r : rows) {
    if (!r.evidence) ++c.unmeasured;
    else if (r.evidence->verdict == Verdict::supported) ++c.supported;
    else if (r.evidence->verdict == Verdict::refuted) ++c.refuted;
    else ++c.mixed;
  }
  return c;
}

}  // namespace attnscale::report
