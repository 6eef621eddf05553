// What one `attend` call holds at once, checked against the machine's memory before any input is
// read or output written.
//
// Every tensor is checked alone where it is allocated (common/memory.h), but a call holds them
// together: its inputs --mask, --alibi-slopes, --sinks, q, k, v, then its output and, when asked,
// --lse and --probs, and while it computes the library's scratch (attention/forward_scratch.h: the
// kernels' per-thread tiles, the split-key decode's partials, the aligned copies of V rows off
// 64-byte lines; under --reference one head's float64 score matrices, 25 bytes a score). Inputs
// that passed one by one were read in full, and the call could then end in std::bad_alloc or the
// kernel's OOM killer. The sizes come from the files' headers (their data is not read), so the
// refusal takes a moment (inputs of 30% of 23.5 GiB each, as sparse files, on 2 threads: 13 ms, the
// median of 21 runs, load average 4.6, 2026-12-08 01:45 UTC):
//   --q [29620540, 64] float32, --k [29620540, 64] float32, --v [29620540, 64] float32, --out
//   [29620540, 64] float32, the kernels' scratch 164.5 KiB: the call needs about 28.2 GiB, more
//   than the 23.5 GiB of memory (RAM + swap) this machine has; smaller arrays need less
// An array that alone exceeds the memory is refused with its own allocation's message, as before
// ("--probs: tensor [1000000, 1000000] float32 needs 3.6 TiB, more than ..."; "reference: one
// head's 1000000 x 1000000 score matrix needs ...").
//
// Under --context-parallel each rank checks what it holds (its rows of q, k, v, out and lse, and
// ring attention's buffers and scratch: distributed/ring_memory.h), and the ranks on one machine
// the sum of theirs, which share its memory (check_context_parallel_share and check_machine_share,
// called by context_parallel.cc after the ranks agree on the inputs' shapes, before any row is
// copied).
//
// The sum is still a lower bound, so a refused call could not have run: left out are what the
// library's estimate leaves out (forward_scratch.h: the KV-cache decode's few rows per chunk of 1024
// keys, which also makes a call that may take that route count no scratch), the few KiB of the
// headers, flags and messages, and the pages of the files the ranks map under --context-parallel
// (the page cache, which the kernel reclaims).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/npy_header.h"

namespace attnscale::cli {

// One call by its files and the flags that change what it holds; an empty path is a flag not given.
struct AttendCall {
  std::string q, k, v, mask, alibi_slopes, sinks;
  std::string lse, probs;  // outputs: only whether they are asked for counts
  bool reference = false;
  int threads = 0;              // --threads (0: $ATTNSCALE_THREADS or all cores)
  bool window = false;          // --window with a bound (L or R >= 0)
  bool dropout = false;         // --dropout > 0
  std::vector<std::int64_t> cu_seqlens_q, cu_seqlens_k;  // packed sequences
};

// Reads the inputs' headers (read_input_header: a bad file is refused as read_input() would) and
// throws Error, naming the flags and shapes, when what the call holds exceeds the memory.
void check_attend_memory(const AttendCall& call);

// --context-parallel: what this rank holds, from the headers of q, k, v (which every rank reads)
// and its share of the rows: each array checked alone (as its allocation will be), then the sum,
// named by the arrays ("--q [2, 8, 1024, 64] float32, ..., ring attention's buffers and scratch
// 4.1 MiB"), against the memory. Returns the sum and its names for the machine's check below.
struct ContextParallelShare {
  const detail::NpyHeader *q = nullptr, *k = nullptr, *v = nullptr;
  bool lse = false;
  int threads = 0;
  std::int64_t q_rows = 0;       // this rank's rows of q (and of out and lse)
  std::int64_t q_segment = 0;    // its longest run of rows
  std::int64_t kv_rows = 0;      // this rank's rows of k and v
  std::int64_t max_kv_rows = 0;  // the most rows of k and v any rank holds
  std::int64_t kv_segment = 0;   // the longest run of k's rows of any rank
};
struct HeldSum {
  std::string named;  // "--q [..] float32, ..."
  double bytes = 0;
};
HeldSum check_context_parallel_share(const ContextParallelShare& share);

// The ranks on this machine (`local_ranks`, `local_bytes` their sums added) share its memory:
// Error("<this rank's names>, on each of the 3 ranks on this machine: the call needs about ...").
void check_machine_share(const HeldSum& rank, int local_ranks, double local_bytes);

}  // namespace attnscale::cli
