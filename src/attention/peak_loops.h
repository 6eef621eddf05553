// The machine's compute ceilings, measured: loops of independent multiply-add chains that keep
// every SIMD pipe busy and touch no memory, so their rate is what the cores can do at most; and
// its read ceiling, a loop that only loads. The
// bench (`attnscale bench`, bench/goals.py) reports every flop-bound row as a fraction of the peak
// of its dtype, measured in the same run.
//
// fp32: FMA on the dispatched Highway target (the same one the kernels use), 2 flops per lane.
// bf16: vdpbf16ps (AVX-512 BF16) where the CPU has it — the instruction of the bf16 products'
// avx512-bf16 path (bf16_kernels.h) — 4 flops per 32-bit lane (two bf16 products and their two
// additions); elsewhere Highway's
// ReorderWidenMulAccumulate on the dispatched target, counted the same way.
// amx: tdpbf16ps (AMX-BF16) where the bf16 products may use it (bfdot::amx_usable): each 16 x 16
// float32 tile += a 16 x 32 bf16 tile times a 32 x 16 one, 8192 products and as many additions,
// 16384 flops an instruction.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/timed_together.h"

namespace attnscale::detail::peak {

// Floating-point operations one step of each loop does on one thread (every thread runs its own
// chains): what a caller multiplies by threads · steps to count a run before timing it. The AMX
// loop's is 0 where AMX is not usable (its loop then runs nothing).
double fp32_flops_per_step();
double bf16_flops_per_step();
double amx_flops_per_step();
// Runs `steps` steps of the loop on each of `threads` threads, all threads started at once
// (common/timed_together.h), and times it: the flops of all threads in the timing kept and its time,
// from the first thread's start to the last one's end once all had arrived at the start barrier
// (a timing whose threads did not all run at once repeated, up to options.attempts in all).
// The peak is flops / time.seconds: a helper thread woken late delays the start, where a clock
// around the whole call timed it (or the caller's running of its loop after its own).
struct Timing {
  double flops = 0;
  TogetherTiming time;
};
Timing timed_fp32_fma(int threads, std::int64_t steps, TogetherOptions options = {});
Timing timed_bf16_dot(int threads, std::int64_t steps, TogetherOptions options = {});
Timing timed_amx_bf16(int threads, std::int64_t steps, TogetherOptions options = {});
bool amx_available();

// What the bf16 loop runs: "vdpbf16ps" or "hwy:<target>".
const char* bf16_instruction();

// Reads bytes [0, bytes / 64 · 64) of a and of b, a vector of each in turn (two streams, as decode
// reads K and V), by whole vectors of the dispatched target, and returns the sum (mod 2^64) of the
// 64-bit words it read.
// Vector loads: on an Intel Xeon (Emerald Rapids, two threads over 1 GiB) 8-byte loads read
// 24-25 GB/s where vectors read 32-33.
std::uint64_t read_two_streams(const char* a, const char* b, std::size_t bytes);

}  // namespace attnscale::detail::peak
