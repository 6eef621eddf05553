// attnscale bench: one table of attention throughput against this machine's ceilings, all
// measured in the same run: OpenBLAS sgemm on 2048^3 (the float32 matrix-product ceiling) and a
// memory copy (the bandwidth ceiling of decode). PyTorch's numbers join the table through
// bench/compare.py, which runs this command with --format csv.
//
// FLOPs: forward 4·B·Hq·Nq·Nkv·d, counting only visible (query, key) pairs under a causal mask;
// backward 2.5x that (five products of the same size against the forward's two).
#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "attnscale/version.h"
#include "common/parallel.h"
#include "subcommands.h"

// OpenBLAS is loaded when `attnscale bench` runs, not linked into the CLI: its pthread build starts
// a pool of worker threads (spinning in sched_yield) in every process that links it, which cost every
// other subcommand ~35 ms of CPU time (measured on `attnscale experiment saturation`).
namespace {
struct OpenBlas {
  void (*set_num_threads)(int) = nullptr;
  decltype(&cblas_sgemm) sgemm = nullptr;
};

const OpenBlas& openblas() {
  static const OpenBlas blas = [] {
    void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw attnscale::Error(std::string("bench: cannot load libopenblas.so.0: ") + dlerror());
    OpenBlas b;
    b.set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(lib, "openblas_set_num_threads"));
    b.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(lib, "cblas_sgemm"));
    if (!b.set_num_threads || !b.sgemm) throw attnscale::Error("bench: libopenblas.so.0 lacks cblas_sgemm");
    return b;
  }();
  return blas;
}
}  // namespace

namespace attnscale::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Best of `reps` runs after one warm-up, stopping early once `budget` seconds are spent: the
// best time is the least disturbed by other processes on a shared machine.
double best_seconds(const std::function<void()>& fn, int reps = 5, double budget = 3.0) {
  fn();
  double best = 1e30, spent = 0;
  for (int r = 0; r < reps && (r == 0 || spent < budget); ++r) {
    const auto t0 = Clock::now();
    fn();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s);
    spent += s;
  }
  return best;
}

Tensor filled(DType dtype, std::initializer_list<std::int64_t> shape, std::uint32_t salt) {
  Tensor t(dtype, shape);
  std::uint32_t x = 2463534242u + salt;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    const float f = static_cast<float>(x % 20001) / 10000.0f - 1.0f;
    if (dtype == DType::bf16) t.as<bf16>()[i] = to_bf16(f);
    else t.as<float>()[i] = f;
  }
  return t;
}

struct Row {
  std::string name;
  std::int64_t B, H, Nq, Nkv, d;
  bool causal;
  std::string dtype;
  int threads;
  double seconds, gflops, ratio;  // ratio: to sgemm (GFLOP/s) or to copy (GB/s) for decode
  std::string unit;
};

double visible_pairs(std::int64_t Nq, std::int64_t Nkv, bool causal) {
  if (!causal) return static_cast<double>(Nq) * Nkv;
  double pairs = 0;  // bottom-right aligned: query i sees keys j <= i + Nkv - Nq
  for (std::int64_t i = 0; i < Nq; ++i) pairs += static_cast<double>(std::clamp<std::int64_t>(i + Nkv - Nq + 1, 0, Nkv));
  return pairs;
}

struct Bench {
  int threads = 0;
  bool quick = false;
  std::string format = "table";
  std::vector<std::int64_t> ns, ds;
  bool memory_case = false;
};

void print(const std::vector<Row>& rows, const std::string& format) {
  if (format == "csv") {
    std::printf("case,B,H,Nq,Nkv,d,causal,dtype,threads,ms,rate,unit,ratio\n");
    for (const Row& r : rows)
      std::printf("%s,%lld,%lld,%lld,%lld,%lld,%d,%s,%d,%.4f,%.2f,%s,%.3f\n", r.name.c_str(), (long long)r.B,
                  (long long)r.H, (long long)r.Nq, (long long)r.Nkv, (long long)r.d, r.causal, r.dtype.c_str(),
                  r.threads, r.seconds * 1e3, r.gflops, r.unit.c_str(), r.ratio);
    return;
  }
  std::printf("attnscale %s (%s), CPU target %s, threads %d\n", version(), git_hash(), cpu_target(),
              rows.empty() ? 0 : rows.front().threads);
  std::printf("%-12s %2s %3s %6s %6s %4s %-6s %-5s %3s %10s %10s %-7s %8s\n", "case", "B", "H", "Nq", "Nkv", "d",
              "mask", "dtype", "thr", "ms", "rate", "unit", "ratio");
  for (const Row& r : rows)
    std::printf("%-12s %2lld %3lld %6lld %6lld %4lld %-6s %-5s %3d %10.3f %10.2f %-7s %8.3f\n", r.name.c_str(),
                (long long)r.B, (long long)r.H, (long long)r.Nq, (long long)r.Nkv, (long long)r.d,
                r.causal ? "causal" : "none", r.dtype.c_str(), r.threads, r.seconds * 1e3, r.gflops, r.unit.c_str(),
                r.ratio);
  std::printf("ratio: to sgemm 2048^3 GFLOP/s (attention rows), to copy GB/s (decode rows); fwd-scaling: time on 1\n"
              "thread over time on all threads, the two timed alternately\n");
}

void run(const Bench& opt) {
  const int threads = opt.threads > 0 ? opt.threads : resolve_threads(0);
  std::vector<Row> rows;
  // Ceiling 1: OpenBLAS sgemm 2048^3 with the same thread count.
  openblas().set_num_threads(threads);
  {
    const int n = 2048;
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
    const double s = best_seconds([&] {
      openblas().sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    });
    rows.push_back({"sgemm", 1, 1, n, n, n, false, "f32", threads, s, 2.0 * n * n * double(n) / s * 1e-9, 1.0, "GFLOP/s"});
  }
  const double sgemm = rows[0].gflops;
  // Ceiling 2: copy bandwidth (read + write) over 256 MiB, far beyond the caches, with the same
  // thread count as decode (each thread copies its own slice).
  double copy_gbs = 0;
  {
    const std::size_t bytes = std::size_t(256) << 20;
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    const double s = best_seconds([&] {
      const std::size_t slice = bytes / threads;
      parallel_for(threads, 1, threads, [&](std::int64_t t0, std::int64_t t1, int) {
        for (std::int64_t t = t0; t < t1; ++t) {
          const std::size_t begin = t * slice, end = t + 1 == threads ? bytes : begin + slice;
          std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
        }
      });
    });
    copy_gbs = 2.0 * bytes / s * 1e-9;
    rows.push_back({"copy", 1, 1, 0, 0, 0, false, "u8", threads, s, copy_gbs, 1.0, "GB/s"});
  }
  auto attention = [&](const std::string& name, std::int64_t H, std::int64_t N, std::int64_t d, bool causal, DType dtype,
                       bool backward_too, int thr) {
    const Tensor q = filled(dtype, {1, H, N, d}, 1), k = filled(dtype, {1, H, N, d}, 2), v = filled(dtype, {1, H, N, d}, 3);
    Tensor out(dtype, {1, H, N, d}), lse(DType::f32, {1, H, N});
    Options o;
    o.threads = thr;
    o.mask.causal = causal;
    o.compute = dtype == DType::bf16 ? Compute::bf16 : Compute::native;
    const double flops = 4.0 * H * visible_pairs(N, N, causal) * d;
    if (!backward_too) {
      const double s = best_seconds([&] { forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, o); });
      rows.push_back({name, 1, H, N, N, d, causal, dtype == DType::bf16 ? "bf16" : "f32", thr, s, flops / s * 1e-9,
                      flops / s * 1e-9 / sgemm, "GFLOP/s"});
      return;
    }
    forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, o);
    const Tensor dout = filled(dtype, {1, H, N, d}, 4);
    Tensor dq(dtype, {1, H, N, d}), dk(dtype, {1, H, N, d}), dv(dtype, {1, H, N, d});
    const double s = best_seconds([&] {
      backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view()}, o);
    }, 3);
    rows.push_back({name, 1, H, N, N, d, causal, "f32", thr, s, 2.5 * flops / s * 1e-9, 2.5 * flops / s * 1e-9 / sgemm,
                    "GFLOP/s"});
  };
  const std::vector<std::int64_t> ns = !opt.ns.empty() ? opt.ns
                                       : opt.quick      ? std::vector<std::int64_t>{1024, 4096}
                                                        : std::vector<std::int64_t>{512, 1024, 2048, 4096, 8192};
  const std::vector<std::int64_t> ds = !opt.ds.empty() ? opt.ds : std::vector<std::int64_t>{64, 128};
  for (std::int64_t d : ds)
    for (std::int64_t n : ns)
      for (bool causal : {false, true}) attention("fwd", 8, n, d, causal, DType::f32, false, threads);
  const std::int64_t n_key = opt.quick ? 2048 : 4096;
  // Thread scaling: one thread and `threads` threads on the same shape, timed alternately (best
  // of 4 each) so that both see the same machine load; the "fwd-scaling" row's rate is t1 / tN.
  {
    const std::int64_t H = 8, N = n_key, d = 128;
    const Tensor q = filled(DType::f32, {1, H, N, d}, 1), k = filled(DType::f32, {1, H, N, d}, 2),
                 v = filled(DType::f32, {1, H, N, d}, 3);
    Tensor out(DType::f32, {1, H, N, d});
    auto once = [&](int thr) {
      Options o;
      o.threads = thr;
      const auto t0 = Clock::now();
      forward(q.view(), k.view(), v.view(), {out.view()}, o);
      return std::chrono::duration<double>(Clock::now() - t0).count();
    };
    double t1 = 1e30, tn = 1e30;
    once(1);
    once(threads);
    for (int r = 0; r < 4; ++r) {
      t1 = std::min(t1, once(1));
      tn = std::min(tn, once(threads));
    }
    const double flops = 4.0 * H * visible_pairs(N, N, false) * d;
    rows.push_back({"fwd-1thread", 1, H, N, N, d, false, "f32", 1, t1, flops / t1 * 1e-9, flops / t1 * 1e-9 / sgemm,
                    "GFLOP/s"});
    rows.push_back({"fwd-scaling", 1, H, N, N, d, false, "f32", threads, tn, t1 / tn, t1 / tn, "x"});
  }
  attention("fwd-bf16", 8, n_key, 128, false, DType::bf16, false, threads);
  attention("bwd", 8, n_key, 128, false, DType::f32, true, threads);
  attention("bwd", 8, n_key, 128, true, DType::f32, true, threads);
  // Decode: one query per head against a long KV cache; bound by reading K and V once.
  for (std::int64_t nkv : {std::int64_t{4096}, std::int64_t{65536}}) {
    const std::int64_t H = 8, d = 128;
    const Tensor q = filled(DType::f32, {1, H, 1, d}, 5), k = filled(DType::f32, {1, H, nkv, d}, 6),
                 v = filled(DType::f32, {1, H, nkv, d}, 7);
    Tensor out(DType::f32, {1, H, 1, d});
    Options o;
    o.threads = threads;
    const double s = best_seconds([&] { forward(q.view(), k.view(), v.view(), {out.view()}, o); }, 20);
    const double gbs = 2.0 * H * nkv * d * 4 / s * 1e-9;
    rows.push_back({"decode", 1, H, 1, nkv, d, false, "f32", threads, s, gbs, gbs / copy_gbs, "GB/s"});
  }
  print(rows, opt.format);
}

// Forward + backward of one head, N = 65536, d = 128: run under /usr/bin/time -v for peak RSS.
void memory_case() {
  const std::int64_t N = 65536, d = 128;
  const Tensor q = filled(DType::f32, {1, 1, N, d}, 1), k = filled(DType::f32, {1, 1, N, d}, 2),
               v = filled(DType::f32, {1, 1, N, d}, 3), dout = filled(DType::f32, {1, 1, N, d}, 4);
  Tensor out(DType::f32, {1, 1, N, d}), lse(DType::f32, {1, 1, N}), dq(DType::f32, {1, 1, N, d}),
      dk(DType::f32, {1, 1, N, d}), dv(DType::f32, {1, 1, N, d});
  const auto t0 = Clock::now();
  forward(q.view(), k.view(), v.view(), {out.view(), lse.view()});
  backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view()});
  const double bytes = 8.0 * N * d * 4 + N * 4.0;  // q k v dout out dq dk dv, lse
  std::printf("memory case: N=%lld d=%lld, inputs+outputs %.1f MiB, %.1f s\n", (long long)N, (long long)d,
              bytes / (1 << 20), std::chrono::duration<double>(Clock::now() - t0).count());
}

}  // namespace

void add_bench(CLI::App& app) {
  auto opt = std::make_shared<Bench>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure attention throughput against sgemm and memory copy");
  cmd->add_option("--threads", opt->threads, "threads (default: $ATTNSCALE_THREADS, else all cores)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--quick", opt->quick, "a quick subset: N in {1024, 4096}, key cases at N = 2048");
  cmd->add_option("--n", opt->ns, "sequence lengths (comma-separated)")->delimiter(',')->check(CLI::PositiveNumber);
  cmd->add_option("--d", opt->ds, "head dimensions (comma-separated)")->delimiter(',')->check(CLI::PositiveNumber);
  cmd->add_option("--format", opt->format, "table or csv")->check(CLI::IsMember({"table", "csv"}));
  cmd->add_flag("--memory-case", opt->memory_case, "only forward+backward at N = 65536, d = 128, one head");
  cmd->callback([opt] {
    if (opt->memory_case) return memory_case();
    run(*opt);
  });
}

}  // namespace attnscale::cli
