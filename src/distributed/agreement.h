// Errors agreed on by every rank of a communicator, so that no rank waits for one that gave up.
//
//   distributed::agreed(comm, [&] { open_my_shard(); });  // throws on every rank if any rank threw
#pragma once
#include <mpi.h>

#include <string>

#include "attnscale/distributed.h"
#include "attnscale/error.h"

namespace attnscale::distributed {

// Every rank passes its own error ("" when it has none). If any rank has one, every rank throws
// AgreedError: the lowest failing rank's message, prefixed "rank R: " when there are several ranks.
void agree(MPI_Comm comm, const std::string& local_error);

// Runs fn on this rank and agrees on the Error it may throw.
template <class F>
void agreed(MPI_Comm comm, F&& fn) {
  std::string error;
  try {
    fn();
  } catch (const AgreedError&) {
    throw;  // already thrown by every rank
  } catch (const Error& e) {
    error = e.what();
    if (error.empty()) error = "error";
  }
  agree(comm, error);
}

}  // namespace attnscale::distributed
