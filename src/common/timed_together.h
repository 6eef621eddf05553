// time_together: a loop timed while it runs on every thread at once, for the machine's limits
// (`attnscale bench`'s peak loops, copy and read): their rate is the aggregate of all threads
// running side by side, not that of the scheduler's order of wake-ups.
//
// Why a start barrier. parallel_for's caller takes items from the start and does not wait for a
// parked helper (parallel.h). With one long item a thread (a peak loop's ~20 ms), a helper whose
// virtual CPU woke late left both items to the caller, which ran them one after the other: on a
// 2-vCPU guest shared with other tenants the FMA peak read one core's worth (101-104 GFLOP/s
// against 196-199) in about one round of every run, and every ratio divided by it doubled. Three
// ways were weighed:
//   (a) a start barrier: every thread waits until all have arrived, then runs its loop; the rate
//       is the work of all over (last end - first start). A late wake-up delays the start and is
//       not timed.
//   (b) many short items from the counter: a late helper costs only its delay, but that delay is
//       still timed, and the caller's share grows with it.
//   (c) retry a timing whose threads did not overlap: needs the per-thread times of (a) anyway.
// (a) is taken, with (c) behind it: the barrier has a deadline, past which it opens for the
// threads there (so it never hangs on a helper that does not come, and never deadlocks where one
// thread runs several shares), the timing is marked apart and is repeated, up to `attempts`
// times. Per-thread rates measured at different moments are never summed: two threads one after
// the other would read as two running at once.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>

namespace attnscale {

// A one-use barrier for `participants` shares of work. A thread arrives with the shares it will
// run (1, or all of them where one thread runs them all) and waits, spinning then yielding the
// CPU (so that threads outnumbering the cores let the late ones in), until every share has
// arrived or `timeout` has passed since the first arrival; past it the barrier is broken and
// every thread, waiting or still to come, goes through at once.
class StartBarrier {
 public:
  using Clock = std::chrono::steady_clock;
  StartBarrier(int participants, Clock::duration timeout) : participants_(participants), timeout_(timeout) {}
  // True when every share arrived before the deadline (the barrier opened), false when broken.
  bool arrive_and_wait(int shares = 1);
  // From the first arrival to the last one (0 before all have arrived): how late the last was.
  Clock::duration last_arrival_after_first() const;

 private:
  const int participants_;
  const Clock::duration timeout_;
  std::atomic<int> arrived_{0};
  std::atomic<bool> broken_{false};
  std::atomic<Clock::rep> first_{0}, last_{0};  // arrival times (Clock ticks)
};

struct TogetherTiming {
  double seconds = 0;     // from the first thread's start to the last one's end, in the attempt kept
  double start_wait = 0;  // seconds from the first thread's arrival at the barrier to the last one's
  int attempts = 1;       // timings made: more than 1 when one had a thread apart and was repeated
  bool together = true;   // false: every attempt had a thread apart (the fastest is kept)
};

struct TogetherOptions {
  // How long the barrier waits for the last thread: long beside a parked thread's wake-up (0.1-0.2
  // ms on an idle 2-vCPU guest, a few scheduler ticks on a busy one), short beside a run.
  std::chrono::milliseconds timeout{200};
  int attempts = 3;
};

// Runs loop(share) once for each share 0 .. threads-1, each on a thread of its own (parallel_for),
// all started at once after a StartBarrier, and times them: seconds = last end - first start.
// A timing is apart when the barrier broke or a thread started after another had finished; it is
// then repeated, up to options.attempts timings in all. threads < 1 counts as 1.
TogetherTiming time_together(int threads, const std::function<void(int share)>& loop, TogetherOptions options = {});

}  // namespace attnscale
