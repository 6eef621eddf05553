#include "common/parallel.h"

#include <algorithm>
#include <atomic>
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
      t = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    }
  }
  return static_cast<int>(std::clamp<std::int64_t>(items, 1, t));
}

void parallel_for(std::int64_t n, std::int64_t chunk, int threads,
                  const std::function<void(std::int64_t, std::int64_t, int)>& fn) {
  if (n <= 0) return;
  chunk = std::max<std::int64_t>(chunk, 1);
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  threads = static_cast<int>(std::clamp<std::int64_t>(threads, 1, chunks));
  if (threads == 1) {
    fn(0, n, 0);
    return;
  }
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&](int t) {
    try {
      for (std::int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;)
        fn(c * chunk, std::min(n, (c + 1) * chunk), t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(chunks);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace attnscale
