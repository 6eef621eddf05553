// bfloat16 calls through the float32 kernels, where the bf16 products would be widened to float32
// anyway (bfdot::Path::widened: Intel's cores without AMX, AVX2 machines).
//
// On that path a bf16 product is a float32 multiply-add on each pair's widened values; the float32
// forward and backward do the same multiply-adds, with their tiles, their causal diagonal tiles
// narrowed and their products at 0.92-0.95 of the FMA peak where the widened tiles reach 0.75-0.78.
// A bfloat16 value widens to float32 exactly, so the float32 kernels over float32 copies of the
// inputs compute the products of the same values: copies made once a call (one pass over the
// inputs) instead of widening each tile's operands wherever a tile is read again (K and V once
// per query block, Q and dO once per key block). What differs from the bf16 kernels: P (and the
// backward's dS) stay float32 instead of being rounded to bfloat16 before their products, so the
// result is closer to float64's, not further; and, as on any path, the order of the sums.
//
// Where few blocks of query rows read each K and V tile (a call of up to 512 rows a head without
// GQA), a bfloat16 forward skips the copies: the float32 kernels widen each tile's rows as they
// pack them, which costs less there than the copies' pass over memory; so does a backward over up
// to 256 keys.
//
// Taken for blocks of query rows (at least kBr rows a head, so that each K and V element is used
// by many rows), and from 16 rows on by the backward and by forwards whose copies are small
// (bf16_as_float.cc), when the copies fit in an eighth of the machine's memory; decode-like calls
// (few rows, many keys) read the bf16 K and V as stored, and very large calls stay on the bf16
// kernels rather than doubling their footprint.
#pragma once
#include <vector>

#include "attention/params.h"
#include "attnscale/attention.h"
#include "attnscale/tensor.h"

namespace attnscale::detail {

// Whether forward() / backward() of p with `compute` run the float32 kernels on float32 copies.
bool runs_as_float(const Params& p, Compute compute);
bool runs_as_float(const BackwardParams& p, Compute compute);
// Whether such a forward reads its bfloat16 q, k, v as stored instead of copying them: few blocks
// of query rows read each K and V tile (bf16_as_float.cc), and no decode takes the call.
bool reads_as_stored(const Params& p);
// Whether such a backward reads its bfloat16 q, k, v and dO as stored: keys of few blocks
// (bf16_as_float.cc).
bool reads_as_stored(const BackwardParams& p);

// p with q, k and v (and, for the backward, dO) replaced by contiguous float32 copies, held in
// `copies`: bfloat16 values widened, float32 values rounded to bfloat16 first (Compute::bf16 asks
// for bfloat16 operands; a finite value beyond bfloat16's range kept, as the bf16 kernels keep it).
// A forward or backward that reads_as_stored keeps its bfloat16 views (the float32 kernels widen
// them as they pack each tile). Outputs stay as given (the float32 kernels write bfloat16 outputs too).
Params float_params(const Params& p, std::vector<Tensor>& copies);
BackwardParams float_params(const BackwardParams& p, std::vector<Tensor>& copies);

}  // namespace attnscale::detail
