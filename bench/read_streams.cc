// The read rate of two threads when each reads its half of a buffer as S interleaved streams:
// whether the read ceiling one query row's decode meets (two streams, K and V) is one of how many
// streams a core follows (docs/performance.md, "2026-12-07"). Every variant is timed once a round,
// rounds interleaved; medians and ranges of GB/s.
//   build/bin/read_streams [--mib 512] [--rounds 5]
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

// Sums `bytes` from `base` as `streams` runs of bytes / streams, `chunk` bytes of each in turn
// (four independent sums of 64-bit words, which the compiler takes in vectors).
std::uint64_t read_part(const char* base, std::size_t bytes, int streams, std::size_t chunk) {
  const std::size_t per = bytes / static_cast<std::size_t>(streams);
  std::uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (std::size_t off = 0; off < per; off += chunk)
    for (int s = 0; s < streams; ++s) {
      const auto* p = reinterpret_cast<const std::uint64_t*>(base + static_cast<std::size_t>(s) * per + off);
      for (std::size_t w = 0; w < chunk / 8; w += 4) s0 += p[w], s1 += p[w + 1], s2 += p[w + 2], s3 += p[w + 3];
    }
  return s0 + s1 + s2 + s3;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Read rate of two threads by streams a thread"};
  std::size_t mib = 512;
  int rounds = 5;
  app.add_option("--mib", mib, "buffer size in MiB")->check(CLI::Range(64, 8192));
  app.add_option("--rounds", rounds, "interleaved rounds")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  const std::size_t bytes = mib << 20;
  char* buf = static_cast<char*>(std::aligned_alloc(std::size_t{2} << 20, bytes));
  if (buf == nullptr) return std::fprintf(stderr, "read_streams: cannot allocate %zu MiB\n", mib), 2;
  madvise(buf, bytes, MADV_HUGEPAGE);
  std::memset(buf, 1, bytes);
  const int streams[] = {1, 2, 4, 8, 16};
  const std::size_t chunks[] = {256, 1024, 4096};
  std::vector<std::vector<double>> rate(std::size(streams) * std::size(chunks));
  volatile std::uint64_t sink = 0;
  for (int r = 0; r < rounds; ++r)
    for (std::size_t si = 0; si < std::size(streams); ++si)
      for (std::size_t ci = 0; ci < std::size(chunks); ++ci) {
        std::uint64_t other = 0;
        const auto t0 = std::chrono::steady_clock::now();
        std::thread helper([&] { other = read_part(buf + bytes / 2, bytes / 2, streams[si], chunks[ci]); });
        const std::uint64_t mine = read_part(buf, bytes / 2, streams[si], chunks[ci]);
        helper.join();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        sink = sink + mine + other;
        rate[si * std::size(chunks) + ci].push_back(static_cast<double>(bytes) / s / 1e9);
      }
  std::printf("streams a thread, chunk: median GB/s [min-max] over %d rounds (2 threads, %zu MiB)\n", rounds, mib);
  for (std::size_t si = 0; si < std::size(streams); ++si)
    for (std::size_t ci = 0; ci < std::size(chunks); ++ci) {
      std::vector<double> v = rate[si * std::size(chunks) + ci];
      std::sort(v.begin(), v.end());
      std::printf("%2d %5zu B: %5.1f [%.1f-%.1f]\n", streams[si], chunks[ci], v[v.size() / 2], v.front(), v.back());
    }
  std::free(buf);
  return 0;
}
