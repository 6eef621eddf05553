// The journal of `attnscale experiment --out FILE`: FILE.partial holds each finished point's rows
// (appended and fsynced as points complete), so `--resume` after a kill runs only the points
// that are missing. Rows are encoded exactly (lab/row_codec.h), so a resumed run writes the same
// bytes as one never interrupted.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "common/journal.h"
#include "lab/experiment.h"
#include "lab/results.h"
#include "lab/row_codec.h"  // encode_rows, decode_rows: the records' payload

namespace attnscale::cli {

// Identifies a run: experiment, seed, trials and every flag value (not threads, not the output
// format: neither changes a row). A journal written under another identity is not resumed.
std::string journal_identity(const lab::Experiment& e, std::uint64_t seed, std::int64_t trials,
                             const std::map<std::string, std::string>& values);

// A run that fails once its journal is open (a full disk under the journal or under FILE, a
// point that throws): a journal holding finished points stays for --resume, and the clause
// returned ends the error line ("; x.csv.partial keeps 2 finished points for --resume"); one
// holding none is removed (nothing to resume, no file left) and the clause is empty.
std::string keep_or_remove_journal(Journal& journal);

}  // namespace attnscale::cli
