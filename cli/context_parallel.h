// `attnscale attend --context-parallel` under mpirun: each rank memory-maps the .npy inputs, copies
// only its shard of rows (distributed::shard along N, the second-to-last dimension), runs ring
// attention (attnscale/distributed.h) and writes its rows of the outputs into one shared file,
// which rank 0 creates under a temporary name and renames when every rank has written. An error on
// any rank is agreed on by all: each prints one line, no output file appears. Before anything else
// the ranks agree on the outputs (--out and --lse name one shared file each) and on the inputs'
// shapes, so that ranks started with different flags stop together instead of waiting.
#pragma once
#include <string>

#include "attnscale/attention.h"

namespace attnscale::cli {

struct ContextParallelFiles {
  std::string q, k, v, out, lse;
  std::string sharding;  // "contiguous", "zigzag", or "" (zigzag for causal masks, else contiguous)
  bool allow_nonfinite = false;
  // This rank's error in the flags read before (paths, mask, transforms), "" when none: agreed on
  // with the other ranks' first, so that every rank stops with one line.
  std::string flags_error;
};

void attend_context_parallel(const ContextParallelFiles& files, const Options& options);

}  // namespace attnscale::cli
