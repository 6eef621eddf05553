// What ring_forward (ring_attention.cc) holds on one rank beside its arguments (the rank's rows of q,
// k, v and of the outputs), from the shapes alone: a caller that allocates the arguments itself
// (`attnscale attend --context-parallel`) adds it to them before it allocates anything.
//   acc_out [B, Hq, q_rows, dv], acc_lse [B, Hq, q_rows]          float64, the running result
//   part_out [B, Hq, q_segment, dv] (q's dtype), part_lse,
//   new_out, new_lse [B, Hq, q_segment(, dv)]                      float64, a block's result merged
//   two K/V buffers, each B · Hkv · max_kv_rows · (dk + dv)       q's dtype, the shards in flight
//   forward()'s scratch for a block of q_segment rows over kv_segment keys (forward_scratch.h)
// A lower bound as forward_scratch_bytes is, and without merge_partials' few rows.
#pragma once
#include <cstdint>

#include "attnscale/tensor.h"

namespace attnscale::distributed {

struct RingShare {
  DType dtype = DType::f32;
  std::int64_t B = 1, Hq = 1, Hkv = 1, dk = 1, dv = 1;
  std::int64_t q_rows = 0;       // this rank's rows of q
  std::int64_t q_segment = 0;    // its longest run of rows (a block's rows)
  std::int64_t max_kv_rows = 0;  // the most rows of k and v any rank holds (a buffer's)
  std::int64_t kv_segment = 0;   // the longest run of k's rows of any rank (a block's keys)
  int threads = 0;               // Options::threads
};

double ring_forward_scratch_bytes(const RingShare& s);

}  // namespace attnscale::distributed
