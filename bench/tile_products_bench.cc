// The forward's two tile products on one thread, L1/L2-resident, as fractions of the fp32 FMA
// peak: scores Sᵀ = K·Qᵀ (64 keys x 64 queries x d) and O = α·O + P·V (64 queries x d x 64 keys),
// by Gemm (the shared kernel, C through memory once per inner block) and by TileGemm (the
// forward's, the running sums in registers; same bits). Times are CPU time, so that another
// process on the core does not count: build/bin/tile_products_bench.
#include <benchmark/benchmark.h>

#include <ctime>
#include <vector>

#include "attention/kernels.h"
#include "attention/peak_loops.h"

namespace {
using namespace attnscale::detail;

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// The FMA peak of one thread in flop/s, measured once (CPU time).
double peak() {
  static const double value = [] {
    double best = 0;
    for (int round = 0; round < 5; ++round) {
      const double t0 = cpu_seconds(), flops = peak::fp32_fma(1, std::int64_t(1) << 22);
      best = std::max(best, flops / (cpu_seconds() - t0));
    }
    return best;
  }();
  return value;
}

// Args: d, product (0: scores, 1: P·V), kernel (0: gemm, 1: tile_gemm).
void TileProduct(benchmark::State& state) {
  const std::size_t d = state.range(0), n = 64;
  const bool pv = state.range(1), tile = state.range(2);
  std::vector<float> K(n * d, 0.01f), Qt(d * n, 0.02f), St(n * n, 0.5f), V(n * d, 0.1f), O(n * d, 0.0f), alpha(n, 1.0f);
  const auto product = tile ? simd::tile_gemm : simd::gemm;
  peak();
  const double t0 = cpu_seconds();
  for (auto _ : state) {
    if (pv) product(n, d, n, St.data(), 1, n, V.data(), d, O.data(), d, simd::kRescaleAccumulate, alpha.data());
    else product(n, n, d, K.data(), d, 1, Qt.data(), n, St.data(), n, simd::kOverwrite, nullptr);
    benchmark::ClobberMemory();
  }
  const double rate = 2.0 * n * n * d * state.iterations() / (cpu_seconds() - t0);
  state.counters["of_fma_peak"] = rate / peak();
  state.SetLabel(std::string(pv ? "P.V" : "scores") + (tile ? " tile_gemm" : " gemm"));
}
BENCHMARK(TileProduct)->ArgsProduct({{64, 128}, {0, 1}, {0, 1}})->MinTime(0.2);

}  // namespace

BENCHMARK_MAIN();
