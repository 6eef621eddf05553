// The forward's two tile products on one thread, L1/L2-resident, as fractions of the fp32 FMA
// peak: scores Sᵀ = K·Qᵀ (64 keys x 64 queries x d) and O = α·O + P·V (64 queries x d x 64 keys),
// by Gemm (the shared kernel, C through memory once per inner block), by TileGemm (the running
// sums in registers; same bits) and as the forward runs them (forward_gemm, forward_pv: P·V in one
// chain per tile; kernels.cc), and the bf16 forward's (bfdot::gemm on the CPU's bf16 path: AMX,
// vdpbf16ps or pairs widened to float32; bf16_kernels.h; on AMX also against the AMX tdpbf16ps
// peak, of_amx_peak, inside a TileScope as the forward runs them); the float32 forward's whole
// tile step (TileStep); what Gemm's inner-dimension blocks cost against one chain (InnerBlocks);
// and GQA decode's tile kernels, one 64-key tile of a group of 8 query rows in L1 (the float32
// quads and P·V, and the opt-in bf16 products, kv_bf16_dot.h, by vdpbf16ps and, where AMX is
// usable, on its tiles: AmxOperands, its copies of K and V included) against the peaks of their
// arithmetic (GqaTile). Times are CPU time, so that another process on the core does not count:
// build/bin/tile_products_bench.
#include <benchmark/benchmark.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "attention/bf16_kernels.h"
#include "attention/kernels.h"
#include "attention/kv_bf16_dot.h"
#include "attention/kv_kernels.h"
#include "attention/peak_loops.h"

namespace {
using namespace attnscale::detail;

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// A peak loop's best rate on one thread in flop/s over 5 rounds (CPU time).
double best_rate(peak::Timing (*loop)(int threads, std::int64_t steps, attnscale::TogetherOptions options),
                 std::int64_t steps = std::int64_t(1) << 22) {
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    const double t0 = cpu_seconds(), flops = loop(1, steps, {}).flops;
    best = std::max(best, flops / (cpu_seconds() - t0));
  }
  return best;
}
// The FMA peak of one thread, measured once; the bf16 dot peak (vdpbf16ps where the CPU has it).
double peak() {
  static const double value = best_rate(peak::timed_fp32_fma);
  return value;
}
double bf16_peak() {
  static const double value = best_rate(peak::timed_bf16_dot);
  return value;
}
// The AMX tdpbf16ps loop's (2^18 steps a round, about 5 ms), where AMX is usable.
double amx_peak() {
  static const double value = best_rate(peak::timed_amx_bf16, 1 << 18);
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
  // B pairs max(n, d)/2 x max(n, d) x 2; 64-byte aligned as the forward's packed operands are (AMX
  // tile loads of rows that straddle two lines, std::vector's alignment, took twice the time).
  const std::size_t w = std::max(n, d);
  const Array ab = filled(n * w / 2 + w * w / 2, 0.0f);
  std::uint16_t* const a16 = reinterpret_cast<std::uint16_t*>(ab.get());
  std::uint16_t* const b16 = a16 + n * w;
  std::fill(a16, a16 + n * w + w * w, std::uint16_t{0x3f80});
  const bfdot::Path path = bfdot::path();
  peak();
  const bfdot::TileScope tiles(path);  // AMX: configured once, as in the bf16 forward's work
  const double t0 = cpu_seconds();
  for (auto _ : state) {
    if (kernel == 3 && pv) bfdot::gemm(path, n, d, n, a16, n, b16, d, O.get(), d, 2, alpha.get(), 1.0f);
    else if (kernel == 3) bfdot::gemm(path, n, n, d, a16, d, b16, n, St.get(), n, 0, nullptr, 1.0f);
    else if (pv && kernel == 2) simd::forward_pv(n, d, n, St.get(), 1, n, V.get(), d, O.get(), d, alpha.get());
    else if (pv) product(n, d, n, St.get(), 1, n, V.get(), d, O.get(), d, simd::kRescaleAccumulate, alpha.get());
    else product(n, n, d, K.get(), d, 1, Qt.get(), n, St.get(), n, simd::kOverwrite, nullptr);
    benchmark::ClobberMemory();
  }
  const double rate = 2.0 * n * n * d * state.iterations() / (cpu_seconds() - t0);
  state.counters["of_fma_peak"] = rate / peak();
  if (kernel == 3 && path == bfdot::Path::amx) state.counters["of_amx_peak"] = rate / amx_peak();
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

// What the error bound's inner-dimension blocks cost the float32 products: C (60 x 64: ten tiles of
// 6 rows on Intel's cores, else fifteen of 4) = A·B over K, by gemm (blocks of InnerBlock(K), 32 up
// to K = 1024, each block's sums added to C through memory) and in one chain per element
// (forward_pv's form: mode 2, factors of 1), operands 64-byte aligned and in L1/L2. Args: K, form
// (0: blocks, 1: one chain).
void InnerBlocks(benchmark::State& state) {
  const std::size_t M = 60, N = 64, K = state.range(0);
  const bool chain = state.range(1);
  const Array A = filled(M * K, 0.01f), B = filled(K * N, 0.02f), C = filled(M * N, 0.0f), ones = filled(M, 1.0f);
  peak();
  const double t0 = cpu_seconds();
  for (auto _ : state) {
    if (chain) simd::forward_pv(M, N, K, A.get(), K, 1, B.get(), N, C.get(), N, ones.get());
    else simd::gemm(M, N, K, A.get(), K, 1, B.get(), N, C.get(), N, simd::kOverwrite);
    benchmark::ClobberMemory();
  }
  state.counters["of_fma_peak"] = 2.0 * M * N * K * state.iterations() / (cpu_seconds() - t0) / peak();
  state.SetLabel(chain ? "one chain" : "blocks");
}
BENCHMARK(InnerBlocks)->ArgsProduct({{32, 64, 128, 512}, {0, 1}})->MinTime(0.2);

// GQA decode's kernels on one tile of 64 keys (d = 128) against a group of 8 query rows, the K and V
// rows in L1, as kv_decode.cc calls them (no prefetch feed): kernel 0 the float32 quad scores
// (kv::scores_quads) and 1 its P·V (kv::accumulate), against the FMA peak; 2 the bf16 scores and
// 3 the bf16 P·V (kv::bf16dot), against the bf16 dot peak (skipped where the bf16 products do not
// run on vdpbf16ps or AMX: no AVX-512 BF16, or an Intel core without AMX; ATTNSCALE_BF16=avx512-bf16
// times them there). Each
// product is 2·8·64·128 flops.
void GqaTile(benchmark::State& state) {
  const int kernel = state.range(0);
  const std::size_t rows = 8, d = 128, n = kv::kTileKeys;
  const bool bf16 = kernel >= 2, amx = kernel >= 4;
  if (bf16 && !kv::bf16dot::available()) {
    static const std::string why = std::string("the bf16 products' path here is ") +
                                   bfdot::path_name(bfdot::path()) + " (ATTNSCALE_BF16=avx512-bf16 to time vdpbf16ps)";
    return state.SkipWithError(why.c_str());
  }
  if (amx && !bfdot::amx_usable()) return state.SkipWithError("no AMX on this CPU");
  if (!bf16 && !kv::quads_available()) return state.SkipWithError("no quad scores on this target");
  const Array K = filled(n * d, 0.01f), V = filled(n * d, 0.1f), Q = filled(rows * d, 0.02f),
              packed = filled(kv::quads_size(rows, d), 0.0f), P = filled(rows * n, 0.5f), S = filled(rows * n, 0.0f),
              O = filled(rows * d, 0.0f), alpha = filled(rows, 1.0f);
  const std::vector<std::uint16_t> k16(n * d, 0x3c00), v16(n * d, 0x3c00);  // bf16 bits of 1/128
  std::vector<std::uint16_t> qb(kv::bf16dot::packed_size(rows, d));
  std::vector<const void*> krow(n), vrow(n);
  for (std::size_t j = 0; j < n; ++j) {
    krow[j] = bf16 ? static_cast<const void*>(k16.data() + j * d) : K.get() + j * d;
    vrow[j] = bf16 ? static_cast<const void*>(v16.data() + j * d) : V.get() + j * d;
  }
  kv::pack_quads(rows, d, Q.get(), d, packed.get());
  if (bf16) kv::bf16dot::pack(rows, d, Q.get(), d, qb.data());
  kv::bf16dot::AmxOperands tiles(amx ? rows : 0, d, d);
  if (amx) tiles.pack(Q.get(), d);
  const double limit = amx ? amx_peak() : bf16 ? bf16_peak() : peak();
  const bfdot::TileScope configured(amx ? bfdot::Path::amx : bfdot::Path::portable);
  const double t0 = cpu_seconds();
  for (auto _ : state) {
    LineFeed none;
    if (kernel == 0) kv::scores_quads(n, rows, d, krow.data(), packed.get(), S.get(), n, none);
    else if (kernel == 1) kv::accumulate(kv::kF32, n, rows, d, vrow.data(), nullptr, P.get(), alpha.get(), O.get(), d, none);
    else if (kernel == 2) kv::bf16dot::scores(n, rows, d, krow.data(), qb.data(), S.get(), n, none);
    else if (kernel == 3) kv::bf16dot::accumulate(n, rows, d, vrow.data(), P.get(), alpha.get(), O.get(), d, none);
    else if (kernel == 4) tiles.scores(n, krow.data(), S.get(), n, none);
    else tiles.accumulate(n, rows, vrow.data(), P.get(), alpha.get(), O.get(), d, none);
    benchmark::ClobberMemory();
  }
  const double rate = 2.0 * rows * n * d * state.iterations() / (cpu_seconds() - t0);
  state.counters[amx ? "of_amx_peak" : bf16 ? "of_bf16_peak" : "of_fma_peak"] = rate / limit;
  state.counters["ns_per_key"] = (cpu_seconds() - t0) / state.iterations() / n * 1e9;
  state.SetLabel(kernel == 0   ? "f32 scores"
                 : kernel == 1 ? "f32 P.V"
                 : kernel == 2 ? "bf16 scores"
                 : kernel == 3 ? "bf16 P.V"
                 : kernel == 4 ? "bf16 scores, AMX"
                               : "bf16 P.V, AMX");
}
BENCHMARK(GqaTile)->DenseRange(0, 5)->MinTime(0.3);

#if defined(__x86_64__)
// What an operand load costs beside vdpbf16ps: steps of 16 independent vdpbf16ps (16 accumulators,
// two vectors of Q) whose 8 other operands are (mode) 0 registers, 1 a 128-bit row chunk broadcast
// to the 4 blocks (vbroadcasti32x4, the bf16 scores' K), 2 whole 512-bit rows, 3 a 32-bit broadcast
// (the bf16 P·V's P), all from L1. ns_per_step against mode 0 says what the loads take from the
// products' issue (GqaTile's bf16 scores load one broadcast per 2 products).
template <int kMode>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"), noinline)) void dot_steps(const std::uint16_t* rows,
                                                                                           std::int64_t steps,
                                                                                           float* sink) {
  __m512 a[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
  const __m512bh q0 = (__m512bh)_mm512_set1_epi32(0x3c003c00), q1 = (__m512bh)_mm512_set1_epi32(0x3c013c01);
  for (std::int64_t i = 0; i < steps; ++i) {
    const std::uint16_t* at = rows + (i & 63) * 32;
#pragma GCC unroll 8
    for (int x = 0; x < 8; ++x) {
      const std::uint16_t* row = at + x * 4096;
      __m512bh k = q1;
      if constexpr (kMode == 1) k = (__m512bh)_mm512_maskz_broadcast_i32x4(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
      if constexpr (kMode == 2) k = (__m512bh)_mm512_loadu_si512(row);
      if constexpr (kMode == 3) k = (__m512bh)_mm512_set1_epi32(*reinterpret_cast<const int*>(row));
      a[2 * x] = _mm512_dpbf16_ps(a[2 * x], q0, k);
      a[2 * x + 1] = _mm512_dpbf16_ps(a[2 * x + 1], q1, k);
    }
    asm volatile("" ::: "memory");
  }
  __m512 s = a[0];
#pragma GCC unroll 16
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, a[i]);
  _mm512_storeu_ps(sink, s);
}

void Bf16DotOperands(benchmark::State& state) {
  if (!bfdot::avx512_bf16_usable()) return state.SkipWithError("no AVX-512 BF16 on this CPU");
  const int mode = state.range(0);
  const std::vector<std::uint16_t> rows(8 * 4096, 0x3c00);
  alignas(64) float sink[16];
  constexpr std::int64_t kSteps = 1 << 16;
  const double t0 = cpu_seconds();
  for (auto _ : state) {
    if (mode == 0) dot_steps<0>(rows.data(), kSteps, sink);
    else if (mode == 1) dot_steps<1>(rows.data(), kSteps, sink);
    else if (mode == 2) dot_steps<2>(rows.data(), kSteps, sink);
    else dot_steps<3>(rows.data(), kSteps, sink);
    benchmark::DoNotOptimize(sink);
  }
  state.counters["ns_per_step"] = (cpu_seconds() - t0) / state.iterations() / kSteps * 1e9;
  state.SetLabel(mode == 0 ? "registers" : mode == 1 ? "vbroadcasti32x4" : mode == 2 ? "512-bit loads" : "32-bit broadcasts");
}
BENCHMARK(Bf16DotOperands)->DenseRange(0, 3)->MinTime(0.3);
#endif

}  // namespace

BENCHMARK_MAIN();
