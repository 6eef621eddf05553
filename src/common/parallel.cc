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
// w + 1 threads; the caller is thread 0. A generation counter announces each job; `pending`
// counts the workers still inside it, and the caller returns only when it reaches 0 (the Job
// lives on the caller's stack).
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
      pid_ = getpid();
    }
    while (static_cast<int>(workers_.size()) < helpers) {
      const int w = static_cast<int>(workers_.size());
      workers_.emplace_back([this, w] { loop(w); });
      workers_.back().detach();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      wanted_ = helpers;
      pending_.store(helpers, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    job.work(0);
    // Wait for the helpers: spin briefly (they finish with the caller when work is balanced),
    // then block.
    for (int spin = 0; spin < 4000 && pending_.load(std::memory_order_acquire) != 0; ++spin) pause();
    if (pending_.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
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
      for (int spin = 0; spin < 4000 && generation_.load(std::memory_order_acquire) == seen; ++spin) pause();
      Job* job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        seen = generation_.load(std::memory_order_acquire);
        if (w >= wanted_) continue;
        job = job_;
      }
      job->work(w + 1);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_all();
      }
    }
  }

  std::mutex owner_;  // held by the caller whose job the pool runs
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  Job* job_ = nullptr;
  int wanted_ = 0;
  std::vector<std::thread> workers_;  // detached; kept for their count
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
