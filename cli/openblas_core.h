// OpenBLAS's kernels for this CPU, for `attnscale bench`'s sgemm row.
//
// OpenBLAS picks its kernels by CPU model when it is loaded, and Debian 12's (0.3.21) takes its
// SSE3 ones ("Prescott") for a model it does not know: on an Emerald Rapids guest (family 6,
// model 207) sgemm 2048^3 ran at 65 GFLOP/s on two threads, and at 287 with OPENBLAS_CORETYPE
// naming its AVX-512 kernels (docs/performance.md). It reads that variable only as it is loaded,
// at the start of every process of the CLI (libtorch links it), so the bench sets it and runs
// itself again where OpenBLAS chose kernels narrower than the library's own SIMD target and the
// variable was not set.
#pragma once
#include <string>

namespace attnscale::cli {

// For `attnscale bench ...` (argv[1] == "bench") only; returns unless it restarts the process.
void restart_bench_with_openblas_core(char** argv);

// The kernels OpenBLAS runs, and, after a restart, the ones it had chosen itself.
std::string openblas_core_note();

}  // namespace attnscale::cli
