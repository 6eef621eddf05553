// OpenBLAS's kernels for this CPU, for `attnscale bench`'s sgemm row and libtorch's products in
// the lab's training runs.
//
// OpenBLAS picks its kernels by CPU model when it is loaded, and Debian 12's (0.3.21) takes its
// SSE3 ones ("Prescott") for a model it does not know: on an Emerald Rapids guest (family 6,
// model 207) sgemm 2048^3 ran at 65 GFLOP/s on two threads, and at 287 with OPENBLAS_CORETYPE
// naming its AVX-512 kernels; a training step of the lab took 150 ms against 74 (libtorch's
// products are OpenBLAS's; docs/performance.md). It reads that variable only as it is loaded, so
// the commands that use it (bench, report, experiment training and recall) open it at their start
// (openblas_library.h; the lab's libtorch module, opened later, finds it loaded), and set the
// variable and run themselves again where OpenBLAS chose kernels narrower than the library's own
// SIMD target and the variable was not set. Other commands load no OpenBLAS.
#pragma once
#include <string>

namespace attnscale::cli {

// For `attnscale bench|report ...` and `attnscale experiment training|recall ...` only; returns
// unless it restarts the process.
void restart_with_openblas_core(char** argv);

// The same for any program whose time OpenBLAS's kernels decide (bench/training_step.cc): runs
// argv again with OPENBLAS_CORETYPE set where OpenBLAS took kernels narrower than the library's
// SIMD target and the variable was not set; returns otherwise.
void restart_with_openblas_kernels(char** argv);

// The kernels OpenBLAS runs, and, after a restart, the ones it had chosen itself.
std::string openblas_core_note();

}  // namespace attnscale::cli
