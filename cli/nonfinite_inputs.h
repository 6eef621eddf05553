// Refusing NaN and infinity in input files unless asked to propagate them, and in results that
// finite inputs overflowed.
//
// The library gives NaN semantics (a NaN stays in the rows it touches); on the command line a
// non-finite input is far more often a broken file than an intent, so `attend` refuses it with
// the first offending index, and --allow-nonfinite passes it through. `explain`, which has no such
// flag, refuses them always.
#pragma once
#include <string>

#include "attnscale/tensor.h"

namespace attnscale::cli {

// Throws Error("<flag>: <path> holds nan at [i, j] ...") on the first non-finite element of a
// float tensor. With `minus_inf_ok` (additive masks, where -inf means "hidden") -inf is allowed.
// `can_allow`: the command has --allow-nonfinite, and the message says so.
void require_finite(const std::string& flag, const std::string& path, const Tensor& t, bool minus_inf_ok,
                    bool can_allow = true);

// Throws Error("<flag>: the result holds nan at [...] though every input is finite: ...") on the
// first non-finite element of an output computed from finite inputs: a float32 score past float32's
// range (|s·q·k| above 3.4e38, e.g. entries of 1e20 unscaled) is ±inf in the float32 kernels, and
// its row NaN, as in PyTorch's float32 attention (docs/numerics.md, "Huge logits").
void require_finite_result(const std::string& flag, const Tensor& out);

}  // namespace attnscale::cli
