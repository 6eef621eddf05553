// Whether a shared host slows this machine's cores while they run, and how: the FMA loop
// (src/attention/peak_loops.h, the dispatched target) on each of T threads at once, many short
// rounds, each thread timing its loop by the wall clock and by its own CPU time.
//   - a thread descheduled (by the guest, or its vCPU by the host: steal) has CPU time < wall time;
//   - a thread slow while on the CPU all along (CPU time = wall time, well above the median) ran at
//     a lower rate: on a 2-vCPU cloud guest, half the rate, as if its physical core's other
//     hardware thread were busy. Steal time does not show this, and `attnscale bench`'s limits,
//     timed around each row (cli/limit_bracket.h), are what catches it there.
//   build/bin/fma_rounds [--threads 2] [--rounds 2000] [--steps 1048576]
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "attention/peak_loops.h"
#include "cli/host_steal.h"

namespace {

double seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct ThreadTime {
  double wall = 0, cpu = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The FMA loop on each thread, many rounds: each thread's wall and CPU time"};
  int threads = 2, rounds = 2000;
  std::int64_t steps = std::int64_t{1} << 20;
  app.add_option("--threads", threads, "threads")->check(CLI::Range(1, 256));
  app.add_option("--rounds", rounds, "rounds")->check(CLI::Range(1, 1000000));
  app.add_option("--steps", steps, "steps of the loop a round")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 32));
  CLI11_PARSE(app, argc, argv);

  std::vector<std::vector<ThreadTime>> times(rounds, std::vector<ThreadTime>(threads));
  const attnscale::cli::CpuTimes cpu0 = attnscale::cli::read_cpu_times();
  for (int r = 0; r < rounds; ++r) {
    std::atomic<int> arrived{0};
    auto body = [&](int t) {
      arrived.fetch_add(1);
      while (arrived.load() < threads) {
      }
      const double w0 = seconds(CLOCK_MONOTONIC), c0 = seconds(CLOCK_THREAD_CPUTIME_ID);
      attnscale::detail::peak::timed_fp32_fma(1, steps);  // one thread: runs on this one
      times[r][t] = {seconds(CLOCK_MONOTONIC) - w0, seconds(CLOCK_THREAD_CPUTIME_ID) - c0};
    };
    std::vector<std::thread> helpers;
    for (int t = 1; t < threads; ++t) helpers.emplace_back(body, t);
    body(0);
    for (std::thread& h : helpers) h.join();
  }
  const double steal = attnscale::cli::steal_share(cpu0, attnscale::cli::read_cpu_times());

  std::vector<double> walls;
  for (const auto& round : times)
    for (const ThreadTime& t : round) walls.push_back(t.wall);
  const double typical = median(walls), flops = steps * attnscale::detail::peak::fp32_flops_per_step();
  int slow_on_cpu = 0, descheduled = 0;
  std::vector<double> slow_walls;  // the loops slow on the CPU
  for (const auto& round : times) {
    bool slow = false, off = false;
    for (const ThreadTime& t : round) {
      off = off || t.wall - t.cpu > 0.1 * typical;
      if (t.wall - t.cpu <= 0.1 * typical && t.cpu > 1.3 * typical) {
        slow = true;
        slow_walls.push_back(t.wall);
      }
    }
    slow_on_cpu += slow;
    descheduled += off;
  }
  std::printf("%d threads, %d rounds of %lld steps: a thread's loop %.3f ms (median), %.1f GFLOP/s a thread\n", threads,
              rounds, static_cast<long long>(steps), 1e3 * typical, flops / typical * 1e-9);
  std::printf("rounds with a thread slow on the CPU (CPU time = wall time > 1.3x the median): %d", slow_on_cpu);
  if (!slow_walls.empty()) std::printf(" (such a loop: %.3f ms, %.2fx the median)", 1e3 * median(slow_walls), median(slow_walls) / typical);
  std::printf("\n");
  std::printf("rounds with a thread descheduled (wall time - CPU time > 0.1x the median): %d\n", descheduled);
  if (steal >= 0) std::printf("CPU time taken by the host (steal) over the run: %.2f%%\n", 100 * steal);
  return 0;
}
