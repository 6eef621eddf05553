// Ring attention timings for docs/distributed.md (a measurement, not a test).
//
//   mpirun -np 1 build/bin/ring_attention_bench --n 4096 --d 128 --heads 8 --threads 2   # one process
//   mpirun -np 2 build/bin/ring_attention_bench --n 4096 --d 128 --heads 8 --threads 1   # K = 2
//
// With one rank it times the plain forward/backward over the whole sequence; with K ranks, the ring
// over K shards of it. Rounds are interleaved (forward, backward, bare transfer), each preceded by a
// barrier; per round the slowest rank's time counts. Prints medians and ranges, the compute rate
// F = 4·c²·d·(Hq) flops per second of block compute, the transfer rate B of the bare K/V exchange,
// and the fraction of transfer time hidden behind compute: 1 − (wait in the ring) / (bare transfer).
// --thread-level single initialises MPI without threads, so the ring drives its transfers only
// between blocks (no progress thread): the comparison that shows what the progress thread hides.
// The last line ("result {...}") repeats the figures as JSON for bench/distributed_figures.py.
#include <mpi.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attnscale/attention.h"
#include "attnscale/distributed.h"

using namespace attnscale;

namespace {

Tensor random(std::initializer_list<std::int64_t> shape, unsigned seed) {
  Tensor t(DType::f32, shape);
  std::srand(seed);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = static_cast<float>(std::rand()) / RAND_MAX - 0.5f;
  return t;
}

double slowest(double seconds) {
  double out = 0;
  MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

struct Series {
  std::vector<double> v;
  void add(double x) { v.push_back(x); }
  std::string text(double scale = 1e3) const {
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.2f [%.2f, %.2f]", s[s.size() / 2] * scale, s.front() * scale, s.back() * scale);
    return buf;
  }
  std::string json(double scale = 1e3) const {  // [median, min, max]
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    char buf[96];
    std::snprintf(buf, sizeof buf, "[%.4f, %.4f, %.4f]", s[s.size() / 2] * scale, s.front() * scale, s.back() * scale);
    return buf;
  }
  double median() const {
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
};

}  // namespace

int main(int argc, char** argv) {
  // The flags, parsed (CLI11) before MPI starts: --help prints them and a bad or unknown flag is one
  // line and exit code 2 on every rank, instead of a run with the flag ignored or read as 0.
  std::int64_t n = 4096, d = 128, heads = 8, rounds = 5;
  int threads = 1, causal_flag = 0;
  std::string thread_level = "serialized";
  CLI::App app{"Ring attention timings (docs/distributed.md): run under mpirun -np K"};
  app.name("ring_attention_bench");
  app.add_option("--n", n, "sequence length")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  app.add_option("--d", d, "head dimension")->check(CLI::Range(std::int64_t{1}, std::int64_t{65536}));
  app.add_option("--heads", heads, "heads")->check(CLI::Range(std::int64_t{1}, std::int64_t{65536}));
  app.add_option("--rounds", rounds, "interleaved rounds")->check(CLI::Range(std::int64_t{1}, std::int64_t{1000}));
  app.add_option("--threads", threads, "threads per rank")->check(CLI::Range(1, 1024));
  app.add_option("--causal", causal_flag, "1: causal (zigzag shards), 0: full")->check(CLI::Range(0, 1));
  app.add_option("--thread-level", thread_level, "MPI thread level: serialized (progress thread) or single")
      ->check(CLI::IsMember({"serialized", "single"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ring_attention_bench: error: %s\n", e.what());
    return 2;
  }
  const bool causal = causal_flag != 0;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, thread_level == "serialized" ? MPI_THREAD_SERIALIZED : MPI_THREAD_SINGLE, &provided);
  int rank = 0, K = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &K);
  Options opt;
  opt.threads = threads;
  opt.mask.causal = causal;
  const auto sharding = causal ? distributed::Sharding::zigzag : distributed::Sharding::contiguous;
  const std::int64_t c = K == 1 ? n : distributed::shard_rows(n, K, rank, sharding);
  Tensor q = random({1, heads, c, d}, 1 + rank), k = random({1, heads, c, d}, 7 + rank), v = random({1, heads, c, d}, 13 + rank);
  Tensor dout = random({1, heads, c, d}, 19 + rank);
  Tensor out(DType::f32, {1, heads, c, d}), lse(DType::f32, {1, heads, c});
  Tensor dq(DType::f32, {1, heads, c, d}), dk(DType::f32, {1, heads, c, d}), dv(DType::f32, {1, heads, c, d});
  Series fwd, bwd, bare, fwd_wait, fwd_compute, bwd_wait;
  std::vector<float> send(static_cast<std::size_t>(2 * heads * c * d)), recv(send.size());
  for (std::int64_t r = -1; r < rounds; ++r) {  // round -1 warms up
    distributed::RingTimes t;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (K == 1) forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt);
    else distributed::ring_forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt, MPI_COMM_WORLD, sharding, &t);
    const double f = slowest(MPI_Wtime() - t0), w = slowest(t.wait_seconds), cmp = slowest(t.compute_seconds);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    distributed::RingTimes tb;
    if (K == 1) backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view()}, opt);
    else distributed::ring_backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(),
                                    {dq.view(), dk.view(), dv.view()}, opt, MPI_COMM_WORLD, sharding, &tb);
    const double b = slowest(MPI_Wtime() - t0), bw = slowest(tb.wait_seconds);
    // The K/V exchange alone: K − 1 steps of sending this shard right and receiving from the left.
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int s = 0; s + 1 < K; ++s) {
      MPI_Request req[2];
      MPI_Irecv(recv.data(), static_cast<int>(recv.size()), MPI_FLOAT, (rank + K - 1) % K, 1, MPI_COMM_WORLD, &req[0]);
      MPI_Isend(send.data(), static_cast<int>(send.size()), MPI_FLOAT, (rank + 1) % K, 1, MPI_COMM_WORLD, &req[1]);
      MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
    }
    const double x = slowest(MPI_Wtime() - t0);
    if (r < 0) continue;
    fwd.add(f);
    bwd.add(b);
    bare.add(x);
    fwd_wait.add(w);
    fwd_compute.add(cmp);
    bwd_wait.add(bw);
  }
  if (rank == 0) {
    const double flops_fwd = 4.0 * n * n * d * heads * (causal ? 0.5 : 1.0);
    std::printf("ranks %d, N %lld, d %lld, heads %lld, %s, threads per rank %d, rounds %lld, MPI thread level %s\n", K,
                (long long)n, (long long)d, (long long)heads, causal ? "causal (zigzag)" : "full", threads,
                (long long)rounds, provided >= MPI_THREAD_SERIALIZED ? "serialized (progress thread)" : "single");
    std::printf("forward  ms: %s  (%.1f GFLOP/s in all)\n", fwd.text().c_str(), flops_fwd / fwd.median() / 1e9);
    std::printf("backward ms: %s  (%.1f GFLOP/s in all, 2.5x the forward's flops)\n", bwd.text().c_str(),
                2.5 * flops_fwd / bwd.median() / 1e9);
    std::string json = "{\"ranks\": " + std::to_string(K) + ", \"causal\": " + (causal ? "true" : "false") +
                       ", \"forward_ms\": " + fwd.json() + ", \"backward_ms\": " + bwd.json();
    if (K > 1) {
      const double bytes = 2.0 * heads * c * d * 4 * (K - 1);
      const double F = flops_fwd / K / fwd_compute.median();  // per rank, block compute only
      const double B = bytes / bare.median(), hidden = std::max(0.0, 1 - fwd_wait.median() / bare.median());
      std::printf("forward block compute ms: %s, waiting ms: %s; backward waiting ms: %s\n", fwd_compute.text().c_str(),
                  fwd_wait.text().c_str(), bwd_wait.text().c_str());
      std::printf("bare K/V exchange ms: %s (%.2f GB/s per link)\n", bare.text().c_str(), B / 1e9);
      std::printf("hidden fraction of the transfer: %.2f\n", hidden);
      std::printf("F per rank: %.1f GFLOP/s; c >= 4 * F / (2 B): shared memory %.0f, 25 GbE %.0f, 200 Gb IB %.0f\n",
                  F / 1e9, 4 * F / (2 * B), 4 * F / (2 * 25e9 / 8), 4 * F / (2 * 200e9 / 8));
      json += ", \"forward_wait_ms\": " + fwd_wait.json() + ", \"forward_compute_ms\": " + fwd_compute.json() +
              ", \"backward_wait_ms\": " + bwd_wait.json() + ", \"bare_exchange_ms\": " + bare.json() +
              ", \"hidden\": " + std::to_string(hidden) + ", \"flops_per_second\": " + std::to_string(F) +
              ", \"bytes_per_second\": " + std::to_string(B);
    }
    std::printf("result %s}\n", json.c_str());
  }
  MPI_Finalize();
  return 0;
}
