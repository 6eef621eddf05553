// The machine's compute ceilings, measured: loops of independent multiply-add chains that keep
// every SIMD pipe busy and touch no memory, so their rate is what the cores can do at most. The
// bench (`attnscale bench`, bench/goals.py) reports every flop-bound row as a fraction of the peak
// of its dtype, measured in the same run.
//
// fp32: FMA on the dispatched Highway target (the same one the kernels use), 2 flops per lane.
// bf16: vdpbf16ps (AVX-512 BF16) where the CPU has it — the instruction the bf16 forward uses —
// 4 flops per 32-bit lane (two bf16 products and their two additions); elsewhere Highway's
// ReorderWidenMulAccumulate on the dispatched target, counted the same way.
#pragma once
#include <cstdint>

namespace attnscale::detail::peak {

// Runs `steps` steps of the loop on each of `threads` threads (each thread its own chains) and
// returns the number of floating-point operations done.
double fp32_fma(int threads, std::int64_t steps);
double bf16_dot(int threads, std::int64_t steps);

// What the bf16 loop runs: "vdpbf16ps" or "hwy:<target>".
const char* bf16_instruction();

}  // namespace attnscale::detail::peak
