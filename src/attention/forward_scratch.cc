// forward_scratch_bytes: the route forward() takes for a shape, and that route's scratch (see
// forward_scratch.h; each route's part is defined next to its allocations).
#include "attention/forward_scratch.h"

namespace attnscale::detail {

ForwardShape forward_shape(const Params& p) {
  ForwardShape s;
  s.dtype = p.dtype;
  s.B = p.B, s.Hq = p.Hq, s.Hkv = p.Hkv, s.Nq = p.Nq, s.Nkv = p.Nkv, s.dk = p.dk, s.dv = p.dv;
  s.threads = p.threads;
  s.probs = !p.probs.empty(), s.mask = !p.mask.empty(), s.sinks = !p.sinks.empty(), s.dropout = p.has_dropout();
  s.window = p.window_left >= 0 || p.window_right >= 0;
  return s;
}

double forward_scratch_bytes(const ForwardShape& s, Kernel kernel) {
  if (kernel == Kernel::reference) return reference_scratch_bytes(s.Nq, s.Nkv);
  // The KV-cache decode's route (cache_decode; bfloat16 calls count as float32 ones) counts none:
  // where it may be taken, nothing.
  if (cache_route_may_take(s)) return 0;
  return uses_split_decode(s) ? split_decode_scratch_bytes(s) : tiled_forward_scratch_bytes(s);
}

}  // namespace attnscale::detail
