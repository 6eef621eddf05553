// The forward's two tile products on one thread, L1/L2-resident, as fractions of the fp32 FMA
// peak: scores Sᵀ = K·Qᵀ (64 keys x 64 queries x d) and O = α·O + P·V (64 queries x d x 64 keys),
// by Gemm (the shared kernel, C through memory once per inner block), by TileGemm (the running
// sums in registers; same bits) and as the forward runs them (forward_gemm, forward_pv: P·V in one
// chain per tile; kernels.cc), and the bf16 forward's (bfdot::gemm on the CPU's bf16 path: AMX,
// vdpbf16ps or pairs widened to float32; bf16_kernels.h); and the float32 forward's whole tile step
// (TileStep). Times are CPU time, so that another process on the core does not count:
// build/bin/tile_products_bench.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "attention/bf16_kernels.h"
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

struct Free {
  void operator()(float* p) const { std::free(p); }
};
using Array = std::unique_ptr<float[], Free>;
Array filled(std::size_t n, float x) {
  Array a(static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64)));
  std::fill(a.get(), a.get() + n, x);
  return a;
}

// Args: d, product (0: scores, 1: P·V), kernel (0: gemm, 1: tile_gemm, 2: the forward's: forward_pv
// for P·V, forward_gemm for the scores, 3: the bf16 forward's, bfdot::gemm on this CPU's bf16 path
// with its operand layouts, bf16_kernels.h).
void TileProduct(benchmark::State& state) {
  const std::size_t d = state.range(0), n = 64;
  const bool pv = state.range(1);
  const int kernel = state.range(2);
  // 64-byte aligned, as the forward's operands (std::vector's 16-byte alignment splits every vector
  // load of a row across two cache lines: P·V at d = 128 then ran at 0.74-0.90 from build to build).
  const Array K = filled(n * d, 0.01f), Qt = filled(d * n, 0.02f), St = filled(n * n, 0.5f), V = filled(n * d, 0.1f),
              O = filled(n * d, 0.0f), alpha = filled(n, 1.0f);
  const auto product = kernel == 2 ? simd::forward_gemm : kernel == 1 ? simd::tile_gemm : simd::gemm;
  // bf16 operands (the bits of 1.0, any finite value times the same work): A rows n x max(n, d),
  // B pairs max(n, d)/2 x max(n, d) x 2.
  const std::size_t w = std::max(n, d);
  const std::vector<std::uint16_t> a16(n * w, 0x3f80), b16(w * w, 0x3f80);
  const bfdot::Path path = bfdot::path();
  peak();
  const double t0 = cpu_seconds();
  for (auto _ : state) {
    if (kernel == 3 && pv) bfdot::gemm(path, n, d, n, a16.data(), n, b16.data(), d, O.get(), d, 2, alpha.get(), 1.0f);
    else if (kernel == 3) bfdot::gemm(path, n, n, d, a16.data(), d, b16.data(), n, St.get(), n, 0, nullptr, 1.0f);
    else if (pv && kernel == 2) simd::forward_pv(n, d, n, St.get(), 1, n, V.get(), d, O.get(), d, alpha.get());
    else if (pv) product(n, d, n, St.get(), 1, n, V.get(), d, O.get(), d, simd::kRescaleAccumulate, alpha.get());
    else product(n, n, d, K.get(), d, 1, Qt.get(), n, St.get(), n, simd::kOverwrite, nullptr);
    benchmark::ClobberMemory();
  }
  const double rate = 2.0 * n * n * d * state.iterations() / (cpu_seconds() - t0);
  state.counters["of_fma_peak"] = rate / peak();
  state.SetLabel(std::string(pv ? "P.V" : "scores") +
                 (kernel == 3   ? std::string(" bf16 ") + bfdot::path_name(path)
                  : kernel == 2 ? " forward"
                  : kernel == 1 ? " tile_gemm"
                                : " gemm"));
}
BENCHMARK(TileProduct)->ArgsProduct({{64, 128}, {0, 1}, {0, 1, 2, 3}})->MinTime(0.2);

// The float32 forward's tile as it runs: the scores, then (softmax = 1) the online softmax, then
// P·V, one after the other, over one K and V tile that stays resident (stream = 0) or over the tiles
// of a head's 4096 keys in turn, K and V then coming from L3 as in the forward (stream = 1). Args:
// d, stream, softmax; of_fma_peak counts both products.
void TileStep(benchmark::State& state) {
  const std::size_t d = state.range(0), n = 64, keys = state.range(1) ? 4096 : n;
  const bool softmax = state.range(2);
  const Array K = filled(keys * d, 0.01f), Qt = filled(d * n, 0.02f), St = filled(n * n, 0.5f),
              V = filled(keys * d, 0.1f), O = filled(n * d, 0.0f), alpha = filled(n, 1.0f), m = filled(n, 0.0f),
              l = filled(n, 0.0f);
  peak();
  std::size_t j = 0;
  const double t0 = cpu_seconds();
  for (auto _ : state) {
    simd::forward_gemm(n, n, d, K.get() + j * d, d, 1, Qt.get(), n, St.get(), n, simd::kOverwrite, nullptr);
    if (softmax) {
      std::fill(m.get(), m.get() + n, 0.0f);  // the same maxima every step: alpha stays finite
      simd::softmax_update(St.get(), n, n, n, m.get(), l.get(), alpha.get());
    }
    simd::forward_pv(n, d, n, St.get(), 1, n, V.get() + j * d, d, O.get(), d, alpha.get());
    j = (j + n) % keys;
    benchmark::ClobberMemory();
  }
  const double rate = 4.0 * n * n * d * state.iterations() / (cpu_seconds() - t0);
  state.counters["of_fma_peak"] = rate / peak();
}
BENCHMARK(TileStep)->ArgsProduct({{64, 128}, {0, 1}, {0, 1}})->MinTime(0.3);

}  // namespace

BENCHMARK_MAIN();
