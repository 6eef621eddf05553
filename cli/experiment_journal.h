// The journal of `attnscale experiment --out FILE`: FILE.partial holds each finished point's rows
// (appended and fsynced as points complete), so `--resume` after a kill runs only the points
// that are missing. Rows are encoded exactly (lab/row_codec.h), so a resumed run writes the same
// bytes as one never interrupted.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "lab/experiment.h"
#include "lab/results.h"
#include "lab/row_codec.h"  // encode_rows, decode_rows: the records' payload

namespace attnscale::cli {

// Identifies a run: experiment, seed, trials and every flag value (not threads, not the output
// format: neither changes a row). A journal written under another identity is not resumed.
std::string journal_identity(const lab::Experiment& e, std::uint64_t seed, std::int64_t trials,
                             const std::map<std::string, std::string>& values);

}  // namespace attnscale::cli
