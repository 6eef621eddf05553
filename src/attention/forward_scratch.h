// What forward() and reference::forward() allocate beside their arguments, from the shapes alone.
//
// A caller that allocates a call's arrays itself (the command line's attend, from its files'
// headers) adds this to them and refuses a call that cannot fit before it allocates anything. Each
// part is computed next to the allocation it sizes, from the same constants:
//   tiled forward (forward.cc)    threads · ForwardScratch (flash_forward.h: a block's Qᵀ, one score
//                                 tile, o, one K and one V tile, m, l), and the threads' 64-byte-
//                                 aligned copies of V where its rows are off line boundaries (float32,
//                                 dv · 4 not a multiple of 64), within AlignedRows::kBudgetBytes
//   split-key decode (decode.cc)  threads · ForwardScratch, each chunk's partial (o, m, l) and the
//                                 merge's rows
//   reference (reference.cc)      one head's score matrices at once: P, the soft-capping factors and
//                                 the dropout factors in float64, the visibility flags, lse
// threads = resolve_threads(Options::threads, the call's work items), as the kernels resolve them,
// never more threads than items; each thread allocates its part when it takes its first item, so
// the count holds where every thread takes one (a thread that finds the items all taken allocates
// nothing: at most threads − 1 parts fewer, tens of KiB each).
// It is a lower bound: the KV-cache decode's partials and per-thread scratch (kv_decode.cc: a few
// rows per chunk of 1024 keys or more, tens of KiB a thread) count as nothing, so a call that may
// take that route counts none; a bfloat16 call counts the float32 kernels' scratch only, not the
// float32 copies of q, k, v that bf16_as_float.h makes; K copied for gapped rows (views, never
// the contiguous arrays a caller allocates) and V copied for data off a 64-byte line (Tensor's
// blocks start on one) are not counted; the few hundred bytes of a thread's stack are not either.
#pragma once
#include <cstdint>

#include "attention/params.h"
#include "attnscale/tensor.h"

namespace attnscale::detail {

// One call of forward() by its shapes (after rank padding: [B, H, N, d]); for packed sequences, one
// sequence's (B = 1), as varlen.cc runs them one after another.
struct ForwardShape {
  DType dtype = DType::f32;  // q's (and k's, v's)
  std::int64_t B = 1, Hq = 1, Hkv = 1, Nq = 1, Nkv = 1, dk = 1, dv = 1;
  int threads = 0;  // Options::threads (0: $ATTNSCALE_THREADS or every hardware thread)
  bool probs = false, mask = false, sinks = false, dropout = false;
  bool window = false;  // a sliding window (Mask::window_left or window_right >= 0)
  std::int64_t group() const { return Hq / Hkv; }
};

// The shape of a validated call.
ForwardShape forward_shape(const Params& p);

// Bytes the call holds at its peak beside q, k, v, the mask, the options' arrays and the outputs.
double forward_scratch_bytes(const ForwardShape& s, Kernel kernel);

// The split-key decode's route (decode.cc: use_decode) by shape.
bool uses_split_decode(const ForwardShape& s);
// Whether the KV-cache decode's route pays for these shapes (decode.cc: cache_route_pays); the call
// takes it where nothing else excludes it (cache_decode).
bool cache_route_pays(const ForwardShape& s);
// Whether forward() may take that route by shape and options (it pays, no probabilities, mask, sinks
// or dropout, float32 or bfloat16); cache_decode adds the conditions of the arrays' layout.
bool cache_route_may_take(const ForwardShape& s);

// The tiled forward's and the split-key decode's parts (forward.cc, decode.cc).
double tiled_forward_scratch_bytes(const ForwardShape& s);
double split_decode_scratch_bytes(const ForwardShape& s);

// The reference's scratch: one head's Nq × Nkv score matrices (P, 1 − tanh², the dropout factors in
// float64, the visibility flags) and its lse row, held at once while it computes a head.
double reference_scratch_bytes(std::int64_t Nq, std::int64_t Nkv);
// Throws Error("reference: one head's <Nq> x <Nkv> score matrix needs ..., more than ...") where
// that scratch alone exceeds RAM + swap (the check reference::forward and backward make first).
void check_reference_scratch(std::int64_t Nq, std::int64_t Nkv);

}  // namespace attnscale::detail
