#include "common/parallel.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attnscale/error.h"

namespace attnscale {

int resolve_threads(int requested, std::int64_t items) {
  int t = requested;
  if (t <= 0) {
    if (const char* env = std::getenv("ATTNSCALE_THREADS"); env && *env) {
      char* end = nullptr;
      long v = std::strtol(env, &end, 10);
      if (*end != '\0' || v <= 0 || v > 4096)
        throw Error(std::string("ATTNSCALE_THREADS: expected a positive integer, got '") + env + "'");
      t = static_cast<int>(v);
    } else {
      // Read once: std::thread::hardware_concurrency() reads /sys each time (sysconf), which took
      // about 10 µs a call on a 2-core virtual machine, 20 times a small call's own work.
      static const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      t = cores;
    }
  }
  return static_cast<int>(std::clamp<std::int64_t>(items, 1, t));
}

namespace {

// One parallel_for call: its chunks, the counter threads take them from, and its first error.
struct Job {
  std::int64_t n = 0, chunk = 1, chunks = 0;
  const ChunkFn* fn = nullptr;
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;

  void work(int t) {
    try {
      for (std::int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;)
        (*fn)(c * chunk, std::min(n, (c + 1) * chunk), t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(chunks);
    }
  }
};

// The persistent workers. Worker w runs as thread index w + 1 of a job that asks for more than
// w + 1 threads; the caller is thread 0. A generation counter announces each job. A worker joins
// it while it is open (`entry`: the job's generation, a closed flag and the count of workers that
// joined, changed by one atomic operation, so joining takes no lock). Once the caller has run out
// of chunks it waits for the helpers that were awake (spinning) when it posted the job to join,
// closes the job, and waits for the workers that joined to finish (`finished`; the Job lives on
// the caller's stack). A helper that was parked is not waited for: woken after the chunks ran
// out, it finds the job closed and parks again (on a 2-core guest a parked thread took 0.1-0.2 ms
// to wake, several times a small call's work; docs/performance.md).
class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = new Pool;  // never destroyed: workers may be parked at exit
    return *pool;
  }
  std::mutex& owner() { return owner_; }

  void run(Job& job, int threads) {
    const int helpers = threads - 1;
    if (pid_ != getpid()) {  // a forked child: the parent's workers do not exist here
      workers_.clear();
      parked_.clear();
      pid_ = getpid();
    }
    while (static_cast<int>(workers_.size()) < helpers) {
      const int w = static_cast<int>(workers_.size());
      {
        std::lock_guard<std::mutex> lock(mutex_);
        parked_.push_back(0);
      }
      workers_.emplace_back([this, w] { loop(w); });
      workers_.back().detach();
    }
    std::uint64_t awake = 0;  // helpers of this job not parked: they come within microseconds
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      wanted_ = helpers;
      for (int w = 0; w < helpers; ++w) awake += parked_[static_cast<std::size_t>(w)] == 0;
      const std::uint64_t generation = generation_.load(std::memory_order_relaxed) + 1;
      finished_.store(0, std::memory_order_relaxed);
      entry_.store(generation << 32, std::memory_order_release);  // open, nobody joined yet
      generation_.store(generation, std::memory_order_release);
    }
    wake_.notify_all();
    job.work(0);
    // The awake helpers join even when the chunks ran out (as they would have taken some had the
    // caller been slower): waiting the moment that takes keeps them in step with the caller's next
    // job, where a helper left behind would park and miss the jobs after. The parked ones are not
    // waited for. Then closed: the workers that joined are all there will be.
    for (int spin = 0; spin < kSpins && (entry_.load(std::memory_order_acquire) & kJoined) < awake; ++spin) pause();
    const std::uint64_t joined = entry_.fetch_or(kClosed, std::memory_order_acq_rel) & kJoined;
    // Wait for them: spin briefly (they finish with the caller when work is balanced), then block.
    for (int spin = 0; spin < kSpins && finished_.load(std::memory_order_acquire) != joined; ++spin) pause();
    if (finished_.load(std::memory_order_acquire) != joined) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return finished_.load(std::memory_order_acquire) == joined; });
    }
  }

 private:
  static void pause() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }

  void loop(int w) {
    std::uint64_t seen = 0;
    for (;;) {
      // A short spin catches back-to-back calls without a sleep; then park.
      for (int spin = 0; spin < kSpins && generation_.load(std::memory_order_acquire) == seen; ++spin) pause();
      Job* job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (generation_.load(std::memory_order_relaxed) == seen) {
          parked_[static_cast<std::size_t>(w)] = 1;
          wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
          parked_[static_cast<std::size_t>(w)] = 0;
        }
        seen = generation_.load(std::memory_order_acquire);
        if (w >= wanted_) continue;
        job = job_;
      }
      if (!join(seen)) continue;  // the caller ran out of chunks before this worker came
      job->work(w + 1);
      const std::uint64_t done = finished_.fetch_add(1, std::memory_order_acq_rel) + 1;
      const std::uint64_t entry = entry_.load(std::memory_order_acquire);
      if ((entry & kClosed) && done == (entry & kJoined)) {  // the last one the caller waits for
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_all();
      }
    }
  }

  // Joins the job of `generation` if it is still open (counted in entry_).
  bool join(std::uint64_t generation) {
    std::uint64_t entry = entry_.load(std::memory_order_acquire);
    do {
      if ((entry >> 32) != (generation & 0xffffffffu) || (entry & kClosed)) return false;
    } while (!entry_.compare_exchange_weak(entry, entry + 1, std::memory_order_acq_rel, std::memory_order_acquire));
    return true;
  }

  // Spins of `pause` before a worker parks, and a caller's wait for the awake ones to join (4000:
  // about 60 us on an Intel Xeon of 2023).
  static constexpr int kSpins = 4000;
  static constexpr std::uint64_t kClosed = std::uint64_t{1} << 31;  // entry_: the job takes no one more
  static constexpr std::uint64_t kJoined = kClosed - 1;             // entry_: the workers that joined

  std::mutex owner_;  // held by the caller whose job the pool runs
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<std::uint64_t> entry_{kClosed};  // generation << 32 | kClosed | workers joined
  std::atomic<std::uint64_t> finished_{0};     // workers of the job done with it
  Job* job_ = nullptr;
  int wanted_ = 0;
  std::vector<std::thread> workers_;  // detached; kept for their count
  std::vector<char> parked_;           // per worker, under mutex_: blocked on wake_
  pid_t pid_ = getpid();
};

}  // namespace

void parallel_for(std::int64_t n, std::int64_t chunk, int threads, ChunkFn fn) {
  if (n <= 0) return;
  chunk = std::max<std::int64_t>(chunk, 1);
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  threads = static_cast<int>(std::clamp<std::int64_t>(threads, 1, chunks));
  if (threads == 1) {
    fn(0, n, 0);
    return;
  }
  Job job;
  job.n = n;
  job.chunk = chunk;
  job.chunks = chunks;
  job.fn = &fn;
  Pool& pool = Pool::instance();
  std::unique_lock<std::mutex> owner(pool.owner(), std::try_to_lock);
  if (owner.owns_lock()) {
    pool.run(job, threads);
  } else {  // the pool is busy (another caller, or a call from inside a work item)
    std::vector<std::thread> extra;
    extra.reserve(threads - 1);
    for (int t = 1; t < threads; ++t) extra.emplace_back([&job, t] { job.work(t); });
    job.work(0);
    for (auto& th : extra) th.join();
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace attnscale
