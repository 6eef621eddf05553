// Google Benchmark cases: forward (fp32, bf16, causal), backward and decode, plus OpenBLAS sgemm
// 2048^3 as the float32 ceiling. Counters report GFLOP/s (forward 4·B·H·Nq·Nkv·d over visible
// pairs; backward 2.5x) or GB/s for decode. For one table with ratios, use `attnscale bench`
// or bench/compare.py.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <vector>

#include "attnscale/attention.h"

namespace {
using namespace attnscale;

Tensor filled(DType dtype, std::initializer_list<std::int64_t> shape) {
  Tensor t(dtype, shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float f = static_cast<float>((i * 2654435761u) % 20001) / 10000.0f - 1.0f;
    if (dtype == DType::bf16) t.as<bf16>()[i] = to_bf16(f);
    else t.as<float>()[i] = f;
  }
  return t;
}

void Sgemm(benchmark::State& state) {
  const int n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  for (auto _ : state)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * double(n), benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(Sgemm)->Unit(benchmark::kMillisecond)->UseRealTime();

// Args: N, d, causal, bf16.
void Forward(benchmark::State& state) {
  const std::int64_t H = 8, N = state.range(0), d = state.range(1);
  const bool causal = state.range(2), low = state.range(3);
  const DType dt = low ? DType::bf16 : DType::f32;
  const Tensor q = filled(dt, {1, H, N, d}), k = filled(dt, {1, H, N, d}), v = filled(dt, {1, H, N, d});
  Tensor out(dt, {1, H, N, d});
  Options o;
  o.mask.causal = causal;
  for (auto _ : state) forward(q.view(), k.view(), v.view(), {out.view()}, o);
  const double pairs = causal ? N * (N + 1) / 2.0 : double(N) * N;
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * H * pairs * d, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(Forward)
    ->ArgsProduct({{512, 1024, 2048, 4096, 8192}, {64, 128}, {0, 1}, {0}})
    ->Args({4096, 128, 0, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void Backward(benchmark::State& state) {
  const std::int64_t H = 8, N = state.range(0), d = 128;
  const bool causal = state.range(1);
  const Tensor q = filled(DType::f32, {1, H, N, d}), k = filled(DType::f32, {1, H, N, d}),
               v = filled(DType::f32, {1, H, N, d}), dout = filled(DType::f32, {1, H, N, d});
  Tensor out(DType::f32, {1, H, N, d}), lse(DType::f32, {1, H, N}), dq(DType::f32, {1, H, N, d}),
      dk(DType::f32, {1, H, N, d}), dv(DType::f32, {1, H, N, d});
  Options o;
  o.mask.causal = causal;
  forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, o);
  for (auto _ : state)
    backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view()}, o);
  const double pairs = causal ? N * (N + 1) / 2.0 : double(N) * N;
  state.counters["GFLOP/s"] = benchmark::Counter(2.5 * 4.0 * H * pairs * d, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(Backward)->ArgsProduct({{4096}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();

void Decode(benchmark::State& state) {
  const std::int64_t H = 8, Nkv = state.range(0), d = 128;
  const Tensor q = filled(DType::f32, {1, H, 1, d}), k = filled(DType::f32, {1, H, Nkv, d}),
               v = filled(DType::f32, {1, H, Nkv, d});
  Tensor out(DType::f32, {1, H, 1, d});
  for (auto _ : state) forward(q.view(), k.view(), v.view(), {out.view()});
  state.counters["GB/s"] = benchmark::Counter(2.0 * H * Nkv * d * 4, benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}
BENCHMARK(Decode)->Arg(4096)->Arg(65536)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
