// The memory a sweep would hold, estimated from its flags before any point runs.
//
// Each flag has its own range (check_ints_in), but their product can still ask for more than any
// machine has: `experiment variance --trials 2147483647` keeps 2^31 results per head dimension
// (416 GiB at the 13 default dimensions), `saturation --n 8192 --d 1048576` draws Q and K of 64 GiB
// a trial, `heatmap --n 1024 --trials 100` makes 4·10^8 rows. Run as given, such a sweep ended in
// std::bad_alloc or, with overcommitted pages, in the kernel's OOM killer. Each experiment's points()
// estimates its sweep's peak from the flags (the larger arrays it holds, the rows it keeps; for the
// usual trial sweep through trial_sweep_bytes) and calls check_sweep_memory, which refuses it with
// one line naming the flags that set the size. The estimates count the large arrays only, so they
// are lower bounds: a refused sweep could not run.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lab/experiment.h"

namespace attnscale::lab {

// One result row kept in the table and written out: its parameter strings, metric, four numbers
// and its CSV or JSON text.
inline constexpr double kRowBytes = 512;

// per_trial's arrays for `trials` trials of `width` results each: the flat array and its columns.
double per_trial_bytes(std::int64_t trials, std::size_t width);

// The largest value of the integer list flag `flag` (checked already), as a double: sizes multiply
// past int64 in the estimates.
double largest(const Args& a, const std::string& flag);

// Points that may run at once (local_points runs points side by side, one a thread at most).
double concurrent_points(const Args& a, std::size_t points);

// What the usual trial sweep holds at its peak, each part a flag-derived size in bytes.
struct TrialSweep {
  std::size_t points = 0;          // the sweep's points
  std::size_t width = 0;           // results a trial each point keeps (per_trial's width)
  double trial_extra_bytes = 0;    // more a point holds a trial beside per_trial's arrays (a copy, derived columns)
  double thread_bytes = 0;         // the arrays each thread holds while it runs a trial
  std::size_t rows_per_point = 0;  // result rows a point keeps; 0: one a result (width)
};

// The peak of such a sweep: concurrent_points points at once, each with per_trial's arrays for
// a.trials trials of `width` results (and trial_extra_bytes a trial), a.threads threads each with
// thread_bytes, and every point's rows kept until the end:
//   concurrent_points · (per_trial_bytes(trials, width) + trials · trial_extra_bytes)
//     + threads · thread_bytes + points · rows_per_point · kRowBytes.
double trial_sweep_bytes(const Args& a, const TrialSweep& sweep);

// Throws Error("--trials T --n 1024 --d 64: the sweep needs about X, more than the Y of memory
// (RAM + swap) this machine has; fewer trials or smaller sizes need less") when `bytes` exceeds
// what the machine has (detail::memory_limit_bytes, the limit every tensor is checked against).
// `flags` name the flags that set the size, without dashes, as given; "trials" (Args::trials) first
// where the experiment has trials (the advice then names them).
void check_sweep_memory(const Args& a, const std::vector<std::string>& flags, double bytes);

}  // namespace attnscale::lab
