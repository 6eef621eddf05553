// Values every rank of a communicator must be given alike (the output path of a shared file, the
// definition of a sweep), compared before any collective that depends on them, so that ranks given
// different commands stop together with one line instead of waiting for each other.
//
//   distributed::agree_on_values(comm, "the arguments", {{"--out", out}, {"--lse", lse}}, error);
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "attnscale/distributed.h"

namespace attnscale::distributed {

struct NamedValue {
  std::string name;   // as the user knows it: "--out", "experiment"
  std::string value;  // compared; "" means not given
  std::string shown;  // what a message shows for it, when not the value itself ("q.npy: 12 rows")
};

// Every rank passes its own values (the same names in the same order) and its own error ("" when
// it has none). If any rank has an error, every rank throws AgreedError with the lowest failing
// rank's ("rank R: ..." when there are several ranks); else, if a rank's values differ from rank
// 0's, every rank throws AgreedError "the ranks disagree on WHAT: NAME: A on rank 0, B on rank R
// (HINT)". Nothing is thrown when all agree.
void agree_on_values(MPI_Comm comm, const std::string& what, const std::vector<NamedValue>& mine,
                     const std::string& local_error = "",
                     const std::string& hint = "start every rank with the same command");

}  // namespace attnscale::distributed
