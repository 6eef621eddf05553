// Peak loops (see peak_loops.h), compiled once per Highway target like kernels.cc.
//
// Why 16 chains: an FMA has a latency of 4 cycles on current x86 cores and two pipes issue one
// each per cycle, so at least 4 x 2 = 8 multiply-adds must be in flight; 16 leaves margin for
// cores with longer latency or more pipes and still fits the 32 vector registers of AVX-512
// (AVX2 has 16 registers: 12 chains there, the loop's two constants taking two more).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/peak_loops.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::peak::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX2
constexpr int kChains = 12;
#else
constexpr int kChains = 16;
#endif

// acc_i = acc_i · a + b for every chain i, `steps` times; a just below 1 keeps the values finite.
// Returns a sum of the chains (stored by the caller) so that the compiler cannot drop the loop.
float Fp32Fma(std::int64_t steps) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  V acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = hn::Set(d, 1.0f + 0.01f * i);
  const V a = hn::Set(d, 0.9999999f), b = hn::Set(d, 1e-7f);
  for (std::int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = hn::MulAdd(acc[i], a, b);
  }
  V sum = hn::Zero(d);
  for (int i = 0; i < kChains; ++i) sum = hn::Add(sum, acc[i]);
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

// bf16 pairs multiplied and summed into float32 lanes (the scalar target has no bf16 pairs: there
// the loop is the fp32 one, as its bf16 GEMM widens to float32 and multiplies in float32). Without
// a bf16 dot instruction (AVX2, AVX-512 without BF16) ReorderWidenMulAccumulate is two float32
// multiply-adds into two accumulators, so kChains / 2 pairs of them fill the registers kChains
// chains fill in Fp32Fma (with kChains pairs, AVX2's loop kept half its 24 sums on the stack and
// ran at 0.6 of Fp32Fma). Its operands are constants, so their widening leaves the loop: on
// such targets this is the FMA peak, the most the bf16 products can reach there.
#if HWY_TARGET == HWY_SCALAR
float Bf16Dot(std::int64_t steps) { return Fp32Fma(steps); }
double Bf16FlopsPerStep() { return 2.0 * kChains; }
#else
constexpr int kPairs = kChains / 2;
float Bf16Dot(std::int64_t steps) {
  const hn::ScalableTag<float> df;
  const hn::Repartition<hwy::bfloat16_t, decltype(df)> dbf;
  const hn::RebindToUnsigned<decltype(dbf)> du;
  using VF = hn::Vec<decltype(df)>;
  VF acc[kPairs], acc_odd[kPairs];
  for (int i = 0; i < kPairs; ++i) acc[i] = acc_odd[i] = hn::Set(df, 1.0f + 0.01f * i);  // distinct: see bf16_dot_avx512
  const auto a = hn::BitCast(dbf, hn::Set(du, static_cast<uint16_t>(0x3a83)));  // bf16 bits of about 1e-3
  for (std::int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int i = 0; i < kPairs; ++i) acc[i] = hn::ReorderWidenMulAccumulate(df, a, a, acc[i], acc_odd[i]);
  }
  VF sum = hn::Zero(df);
  for (int i = 0; i < kPairs; ++i) sum = hn::Add(sum, hn::Add(acc[i], acc_odd[i]));
  return hn::GetLane(hn::SumOfLanes(df, sum));
}
double Bf16FlopsPerStep() { return 4.0 * kPairs * hn::Lanes(hn::ScalableTag<float>()); }
#endif

double Fp32FlopsPerStep() { return 2.0 * kChains * hn::Lanes(hn::ScalableTag<float>()); }

// Bytes [0, bytes) of a and of b read by whole vectors, a vector of each in turn, into two sums
// (an addition a load: far above any memory stream); bytes a multiple of the vector size.
uint64_t ReadTwoStreams(const char* a, const char* b, size_t bytes) {
  const hn::ScalableTag<uint64_t> d;
  const size_t step = hn::Lanes(d) * sizeof(uint64_t);
  auto sa = hn::Zero(d), sb = hn::Zero(d);
  for (size_t i = 0; i < bytes; i += step) {
    sa = hn::Add(sa, hn::LoadU(d, reinterpret_cast<const uint64_t*>(a + i)));
    sb = hn::Add(sb, hn::LoadU(d, reinterpret_cast<const uint64_t*>(b + i)));
  }
  // The lanes summed in uint64_t (wrapping): SumOfLanes on AVX-512 adds them as signed 64-bit
  // integers, whose overflow is undefined (the sanitizer build stops on it).
  HWY_ALIGN uint64_t lanes[HWY_MAX_BYTES / sizeof(uint64_t)];
  hn::Store(hn::Add(sa, sb), d, lanes);
  uint64_t sum = 0;
  for (size_t i = 0; i < hn::Lanes(d); ++i) sum += lanes[i];
  return sum;
}
const char* Target() { return hwy::TargetName(HWY_TARGET); }

}  // namespace attnscale::detail::peak::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <atomic>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "attention/bf16_kernels.h"
#include "attention/kernels.h"
#include "attention/peak_loops.h"
#include "common/timed_together.h"

namespace attnscale::detail::peak {
HWY_EXPORT(Fp32Fma);
HWY_EXPORT(Bf16Dot);
HWY_EXPORT(Fp32FlopsPerStep);
HWY_EXPORT(Bf16FlopsPerStep);
HWY_EXPORT(Target);
HWY_EXPORT(ReadTwoStreams);

namespace {

std::atomic<float> sink{0};  // the loops' results land here, so none is optimised away

#if defined(__x86_64__)
// vdpbf16ps on 16 independent zmm accumulators (16 lanes x 4 flops each per instruction).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) float bf16_dot_avx512(std::int64_t steps) {
  // Distinct starting values: chains that start equal and see equal operands are equal at every
  // step, and GCC then keeps one of them (one dependent vdpbf16ps per step, counted as 16).
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(1.0f + 0.01f * i);
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3a83), b = (__m512bh)_mm512_set1_epi16(0x3a83);  // ~1e-3
  for (std::int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_reduce_add_ps(sum);
}

// tdpbf16ps into 4 independent accumulator tiles (0-3) from 2 A tiles (4, 5) and 2 B tiles (6, 7)
// loaded once before the loop, so the loop touches no memory: each A and B tile serves two
// products, as in the AMX kernel's 2 x 2 blocks (bf16_gemm.cc). The operands are the bits of about
// 1e-3: the sums stay finite. The tiles are configured (bfdot::TileScope, every tile 16 rows of 64
// bytes) and released here, on the thread that runs it.
__attribute__((target("amx-tile,amx-bf16"))) float amx_loop(std::int64_t steps) {
  const bfdot::TileScope tiles(bfdot::Path::amx);
  alignas(64) std::uint16_t operand[16 * 32];
  for (std::uint16_t& x : operand) x = 0x3a83;
  alignas(64) float out[16 * 16];
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (std::int64_t s = 0; s < steps; ++s) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(3, out, 64);
  return out[0];
}
#endif

bool use_vdpbf16ps() { return bfdot::avx512_bf16_usable(); }

// Every thread's loop started at once and timed from the first start to the last end
// (common/timed_together.h): the peak is the rate of all threads running side by side.
template <class Fn>
TogetherTiming on_threads(int threads, Fn fn, TogetherOptions options) {
  return time_together(threads, [&](int) { sink.store(fn(), std::memory_order_relaxed); }, options);
}

}  // namespace

double fp32_flops_per_step() {
  simd::init_target_from_env();
  return HWY_DYNAMIC_DISPATCH(Fp32FlopsPerStep)();
}

double bf16_flops_per_step() {
  simd::init_target_from_env();
#if defined(__x86_64__)
  if (use_vdpbf16ps()) return 4.0 * 16 * 16;  // 16 vdpbf16ps a step, 16 lanes of 4 flops each
#endif
  return HWY_DYNAMIC_DISPATCH(Bf16FlopsPerStep)();
}

double amx_flops_per_step() { return amx_available() ? 4.0 * 16384 : 0.0; }  // 4 tdpbf16ps a step

Timing timed_fp32_fma(int threads, std::int64_t steps, TogetherOptions options) {
  const double flops = std::max(threads, 1) * double(steps) * fp32_flops_per_step();
  return {flops, on_threads(threads, [&] { return HWY_DYNAMIC_DISPATCH(Fp32Fma)(steps); }, options)};
}

Timing timed_bf16_dot(int threads, std::int64_t steps, TogetherOptions options) {
  const double flops = std::max(threads, 1) * double(steps) * bf16_flops_per_step();
#if defined(__x86_64__)
  if (use_vdpbf16ps()) return {flops, on_threads(threads, [&] { return bf16_dot_avx512(steps); }, options)};
#endif
  return {flops, on_threads(threads, [&] { return HWY_DYNAMIC_DISPATCH(Bf16Dot)(steps); }, options)};
}

std::uint64_t read_two_streams(const char* a, const char* b, std::size_t bytes) {
  simd::init_target_from_env();
  const std::size_t whole = bytes / 64 * 64;  // a multiple of every target's vector
  return HWY_DYNAMIC_DISPATCH(ReadTwoStreams)(a, b, whole);
}

bool amx_available() { return bfdot::amx_usable(); }

Timing timed_amx_bf16(int threads, std::int64_t steps, TogetherOptions options) {
#if defined(__x86_64__)
  if (amx_available())
    return {std::max(threads, 1) * double(steps) * amx_flops_per_step(),
            on_threads(threads, [&] { return amx_loop(steps); }, options)};
#endif
  (void)threads;
  (void)steps;
  (void)options;
  return {};
}

const char* bf16_instruction() {
  static const std::string name = use_vdpbf16ps() ? std::string("vdpbf16ps")
                                                  : std::string("hwy:") + HWY_DYNAMIC_DISPATCH(Target)();
  return name.c_str();
}

}  // namespace attnscale::detail::peak
#endif  // HWY_ONCE
