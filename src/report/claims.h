// The claims table: every claim of the references (the catalogue, report/templates/claims.md) with
// the evidence the units judged it on. Units give Evidence by claim id (report/unit.h); this joins
// them, refuses evidence on a claim the catalogue does not hold, and lists the claims no unit of this
// build judged as not measured.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "report/unit.h"

namespace attnscale::report {

struct CatalogueClaim {
  std::string id, claim, reference, measured_by;
};

// The catalogue, in its order (parsed from the embedded template; Error on a malformed row).
std::vector<CatalogueClaim> claim_catalogue();

struct ClaimRow {
  CatalogueClaim claim;
  std::optional<Evidence> evidence;  // none: no unit of this build measured it
};

// Joins evidence (from every unit) with the catalogue. Error when evidence names an unknown claim
// or a claim gets evidence twice.
std::vector<ClaimRow> join_claims(const std::vector<Evidence>& evidence);

// The claims as a Markdown table followed by the rules, one bullet per judged claim.
std::string claims_markdown(const std::vector<ClaimRow>& rows);

// Counts of verdicts (supported, refuted, mixed) and of claims not measured.
struct ClaimCounts {
  int supported = 0, refuted = 0, mixed = 0, unmeasured = 0;
};
ClaimCounts count_claims(const std::vector<ClaimRow>& rows);

}  // namespace attnscale::report
