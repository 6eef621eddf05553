// Runtime dispatch of the float32 tile kernels: Highway compiles kernels-inl.h once per target
// (foreach_target.h re-includes this file) and HWY_DYNAMIC_DISPATCH picks the best one the CPU
// supports. SSSE3/SSE4 are left out (HWY_DISABLED_TARGETS in src/CMakeLists.txt): the scalar
// emulation, AVX2 and AVX-512 are the targets we build, test and measure.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "attention/kernels-inl.h"

#if HWY_ONCE
#include <cstdlib>
#include <algorithm>
#include <mutex>

#include "attention/kernels.h"
#include "common/cpu_model.h"
#include "attnscale/error.h"

namespace attnscale::detail {
HWY_EXPORT(Gemm);
HWY_EXPORT(GemvColumns);
HWY_EXPORT(TileGemm);
HWY_EXPORT(SoftmaxUpdate);
HWY_EXPORT(Exp2Columns);
HWY_EXPORT(Exp2ColumnsBf16);
HWY_EXPORT(Exp2ColumnsBf16Scaled);
HWY_EXPORT(SoftmaxGrad);
HWY_EXPORT(Exp2Rows);
HWY_EXPORT(Exp2RowsBf16);
HWY_EXPORT(DotTile);
HWY_EXPORT(SoftmaxUpdateRows);
HWY_EXPORT(SoftmaxUpdateRowsBf16);
HWY_EXPORT(SoftmaxUpdateRowsBf16Scaled);
HWY_EXPORT(SoftmaxUpdateRowsToBf16);
HWY_EXPORT(Exp2ColumnsBf16ScaledTo);
HWY_EXPORT(SoftmaxGradToBf16);
HWY_EXPORT(SoftmaxGradRows);
HWY_EXPORT(Softcap);
HWY_EXPORT(ScaledCopy);
HWY_EXPORT(TransposeScaled);
HWY_EXPORT(RowDots8);
HWY_EXPORT(TargetName);

namespace simd {
namespace {

struct NamedTarget {
  const char* name;
  std::int64_t bits;
};
constexpr NamedTarget kTargets[] = {
    {"scalar", HWY_BASELINE_SCALAR}, {"avx2", HWY_AVX2}, {"avx512", HWY_AVX3}};

std::int64_t bits_of(const std::string& name) {
  for (const auto& t : kTargets)
    if (name == t.name) return t.bits;
  throw Error("ATTNSCALE_TARGET: unknown target '" + name + "' (expected scalar, avx2 or avx512)");
}

std::int64_t usable_bits() {
  std::int64_t bits = 0;
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) bits |= t;
  return bits;
}

std::once_flag env_once;

}  // namespace

void init_target_from_env() {
  std::call_once(env_once, [] {
    const char* env = std::getenv("ATTNSCALE_TARGET");
    if (env && *env) force_target(env);
  });
}

std::vector<std::string> available_targets() {
  hwy::SetSupportedTargetsForTest(0);  // the CPU's real set, not a forced one
  const std::int64_t bits = usable_bits();
  std::vector<std::string> names;
  for (const auto& t : kTargets)
    if (bits & t.bits) names.emplace_back(t.name);
  return names;
}

namespace {
std::int64_t forced_bits = 0;  // the target force_target() set, 0 for none
}  // namespace

void force_target(const std::string& name) {
  hwy::SetSupportedTargetsForTest(0);
  forced_bits = 0;
  if (name.empty()) return;
  const std::int64_t want = bits_of(name);
  if (!(usable_bits() & want))
    throw Error("ATTNSCALE_TARGET: target '" + name + "' is not supported by this CPU or build");
  hwy::SetSupportedTargetsForTest(want);
  forced_bits = want;
}

BestTarget::BestTarget() : forced_(forced_bits) { hwy::SetSupportedTargetsForTest(0); }
BestTarget::~BestTarget() { hwy::SetSupportedTargetsForTest(forced_); }

const char* target_name() {
  init_target_from_env();
  return HWY_DYNAMIC_DISPATCH(TargetName)();
}

namespace {
// Whether Gemm takes its wide tiles (kernels-inl.h, kWideMR): on Intel's cores, whose two 512-bit
// FMA ports want more than 16 chains to stay busy (docs/performance.md, "The Intel AMX machine").
bool wide_tiles() { return cpu_model().intel; }
}  // namespace

void gemm(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t ars, std::size_t acs,
          const float* B, std::size_t ldb, float* C, std::size_t ldc, GemmMode mode, const float* row_scale) {
  if (M == 0 || N == 0) return;
  if (N == 1 && ars == 1 && ldc == 1)  // one column, rows contiguous in A and C: same bits, lanes over rows
    return HWY_DYNAMIC_DISPATCH(GemvColumns)(M, K, A, acs, B, ldb, C, mode, row_scale);
  HWY_DYNAMIC_DISPATCH(Gemm)(M, N, K, A, ars, acs, B, ldb, C, ldc, mode, row_scale, 0, wide_tiles());
}
void tile_gemm(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t ars, std::size_t acs,
               const float* B, std::size_t ldb, float* C, std::size_t ldc, GemmMode mode, const float* row_scale) {
  if (M == 0 || N == 0) return;
  if (N == 1 && ars == 1 && ldc == 1)  // gemm's one-column case, as gemm runs it
    return HWY_DYNAMIC_DISPATCH(GemvColumns)(M, K, A, acs, B, ldb, C, mode, row_scale);
  HWY_DYNAMIC_DISPATCH(TileGemm)(M, N, K, A, ars, acs, B, ldb, C, ldc, mode, row_scale, 0);
}
// TileGemm's 2 x 4 tile keeps 8 FMA chains going (its other 8 registers hold the sums), Gemm's 4 x 4
// keeps 16 but loads and stores C once per inner block. Where two 512-bit FMAs issue a cycle and
// each takes 4 cycles, 8 chains are just enough in theory and fall short in practice: on AMD Zen 5
// (family 1Ah, full-width AVX-512) the forward ran at 0.56-0.63 of the fp32 FMA peak with
// TileGemm against 0.62-0.74 with Gemm (d = 64 and 128, N = 4096, H = 8, 1 and 2 threads, three
// interleaved rounds), and on an Intel Xeon with AMX (2026-12-05) at 224-252 GFLOP/s against 280-293
// (H = 8, N = 4096, d = 128, 2 threads, processes alternated; docs/performance.md). TileGemm was the
// faster on Zen 4 (family 19h, double-pumped AVX-512), measured against a Gemm whose B vectors
// were not yet pinned to registers; it stays there.
namespace {
bool forward_uses_tile_gemm() { return cpu_model().amd && cpu_model().family == 0x19; }
}  // namespace
void forward_gemm(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t ars, std::size_t acs,
                  const float* B, std::size_t ldb, float* C, std::size_t ldc, GemmMode mode, const float* row_scale) {
  (forward_uses_tile_gemm() ? tile_gemm : gemm)(M, N, K, A, ars, acs, B, ldb, C, ldc, mode, row_scale);
}
namespace {
// C = init + A·B (gemm's modes) with each element's K products summed in one chain (forward_pv,
// accumulate_tile): by TileGemm where the forward takes it (tile), else Gemm; gemm's one-column
// case as gemm runs it, with its blocks.
void one_chain(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t ars, std::size_t acs,
               const float* B, std::size_t ldb, float* C, std::size_t ldc, GemmMode mode, const float* row_scale,
               bool tile) {
  if (M == 0 || N == 0) return;
  if (N == 1 && ars == 1 && ldc == 1)
    return HWY_DYNAMIC_DISPATCH(GemvColumns)(M, K, A, acs, B, ldb, C, mode, row_scale);
  const std::size_t chain = std::max<std::size_t>(K, 1);
  if (tile)
    HWY_DYNAMIC_DISPATCH(TileGemm)(M, N, K, A, ars, acs, B, ldb, C, ldc, mode, row_scale, chain);
  else
    HWY_DYNAMIC_DISPATCH(Gemm)(M, N, K, A, ars, acs, B, ldb, C, ldc, mode, row_scale, chain, wide_tiles());
}
}  // namespace
// P·V in one chain per key tile: Gemm's InnerBlock(64) = 32 would sum a 64-key tile as two chains,
// each added to O through memory; one chain loads, rescales and stores the output tile once per
// tile instead of twice. Error (see InnerBlock): a row of N keys, tiles of 64 added to O in turn,
// sums with about u·(64 + N/64)/√2 where blocks of 32 gave u·(32 + N/32)/√2 — less from N = 2048
// on, up to twice as much for a single tile (N <= 64), as a plain float32 P·V's one chain of N.
// The backward recomputes scores, never this product. On the Zen 5 machine alone (calls
// alternated in one process, H = 8, medians of time new / old): d = 128, N = 2048, one thread 0.984,
// N = 4096 0.994-1.005, two threads 0.992; d = 64, two threads 0.979, one thread 0.982.
void forward_pv(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t ars, std::size_t acs,
                const float* B, std::size_t ldb, float* C, std::size_t ldc, const float* row_scale) {
  one_chain(M, N, K, A, ars, acs, B, ldb, C, ldc, kRescaleAccumulate, row_scale, forward_uses_tile_gemm());
}
// The backward's dV, dK and dQ products in one chain per tile: each is a sum over all the query
// blocks (dV, dK) or key tiles (dQ) of a head, added tile by tile, so forward_pv's error argument
// holds: u·(64 + N/64)/√2 against u·(32 + N/32)/√2 with Gemm's blocks of 32, less from N = 2048 on.
// Against float64 the backward's errors stayed within 4.3e-7 to 7.7e-7 of the largest gradient
// (N = 64 to 4096). On the Intel Xeon of 2026-12-05 (H = 8, N = 4096, d = 128, two threads,
// processes alternated) it ran at 0.742-0.765 of the FMA peak against 0.709-0.740 in one build
// with a switch, 1-3% faster between builds (docs/performance.md, "13:32"); on Zen 5 the same
// change was 0.997 of the time (2026-12-05, 00:34).
void accumulate_tile(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t ars, std::size_t acs,
                     const float* B, std::size_t ldb, float* C, std::size_t ldc) {
  one_chain(M, N, K, A, ars, acs, B, ldb, C, ldc, kAccumulate, nullptr, false);
}
void softmax_update(float* St, std::size_t lds, std::size_t rows, std::size_t cols, float* m, float* l,
                    float* alpha) {
  HWY_DYNAMIC_DISPATCH(SoftmaxUpdate)(St, lds, rows, cols, m, l, alpha);
}
void exp2_columns_bf16_scaled(float* St, std::size_t lds, std::size_t rows, std::size_t cols, const float* sub,
                              const float* mul, float scale) {
  HWY_DYNAMIC_DISPATCH(Exp2ColumnsBf16Scaled)(St, lds, rows, cols, sub, mul, scale);
}
void exp2_columns(float* St, std::size_t lds, std::size_t rows, std::size_t cols, const float* sub,
                  const float* mul, ExpFor e) {
  if (e == ExpFor::bf16) return HWY_DYNAMIC_DISPATCH(Exp2ColumnsBf16)(St, lds, rows, cols, sub, mul);
  HWY_DYNAMIC_DISPATCH(Exp2Columns)(St, lds, rows, cols, sub, mul);
}
void softmax_grad(const float* Pt, float* dPt, std::size_t ld, std::size_t rows, std::size_t cols,
                  const float* D, float scale) {
  HWY_DYNAMIC_DISPATCH(SoftmaxGrad)(Pt, dPt, ld, rows, cols, D, scale);
}
void softmax_update_rows_bf16_scaled(float* S, std::size_t lds, std::size_t rows, std::size_t cols, float* m,
                                     float* l, float* alpha, float scale, bool fold) {
  HWY_DYNAMIC_DISPATCH(SoftmaxUpdateRowsBf16Scaled)(S, lds, rows, cols, m, l, alpha, scale, fold);
}
void exp2_columns_bf16_scaled_to(float* St, std::size_t lds, std::size_t rows, std::size_t cols, const float* sub,
                                 const float* mul, float scale, std::uint16_t* Pb, std::size_t ldp) {
  HWY_DYNAMIC_DISPATCH(Exp2ColumnsBf16ScaledTo)(St, lds, rows, cols, sub, mul, scale, Pb, ldp);
}
void softmax_grad_to_bf16(const float* Pt, const float* dPt, std::size_t ld, std::size_t rows, std::size_t cols,
                          const float* D, float scale, std::uint16_t* dSb, std::size_t ldp, std::uint16_t* dSv,
                          std::size_t ldv) {
  HWY_DYNAMIC_DISPATCH(SoftmaxGradToBf16)(Pt, dPt, ld, rows, cols, D, scale, dSb, ldp, dSv, ldv);
}
void softmax_update_rows_to_bf16(float* S, std::size_t lds, std::size_t rows, std::size_t cols, float* m, float* l,
                                 float* alpha, float scale, bool scaled, bool fold, std::uint16_t* Pb,
                                 std::size_t ldp) {
  HWY_DYNAMIC_DISPATCH(SoftmaxUpdateRowsToBf16)(S, lds, rows, cols, m, l, alpha, scale, scaled, fold, Pb, ldp);
}
void softmax_update_rows(float* S, std::size_t lds, std::size_t rows, std::size_t cols, float* m, float* l,
                         float* alpha, ExpFor e) {
  if (e == ExpFor::bf16) return HWY_DYNAMIC_DISPATCH(SoftmaxUpdateRowsBf16)(S, lds, rows, cols, m, l, alpha);
  HWY_DYNAMIC_DISPATCH(SoftmaxUpdateRows)(S, lds, rows, cols, m, l, alpha);
}
void dot_tile(std::size_t nk, std::size_t rows, std::size_t dk, const float* K, std::size_t ldk, const float* Q,
              std::size_t ldq, float* St, std::size_t lds) {
  HWY_DYNAMIC_DISPATCH(DotTile)(nk, rows, dk, K, ldk, Q, ldq, St, lds);
}
void exp2_rows(float* S, std::size_t lds, std::size_t rows, std::size_t cols, const float* sub, const float* mul,
               ExpFor e) {
  if (e == ExpFor::bf16) return HWY_DYNAMIC_DISPATCH(Exp2RowsBf16)(S, lds, rows, cols, sub, mul);
  HWY_DYNAMIC_DISPATCH(Exp2Rows)(S, lds, rows, cols, sub, mul);
}
void softmax_grad_rows(const float* P, float* dP, std::size_t ld, std::size_t rows, std::size_t cols,
                       const float* D, float scale) {
  HWY_DYNAMIC_DISPATCH(SoftmaxGradRows)(P, dP, ld, rows, cols, D, scale);
}
void softcap(float* x, std::size_t n, float c, float* dcap) { HWY_DYNAMIC_DISPATCH(Softcap)(x, n, c, dcap); }
void scaled_copy(const float* src, float f, float* dst, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(ScaledCopy)(src, f, dst, n);
}
void transpose_scaled(const float* const* rows, std::size_t n, std::size_t d, float f, float* out, std::size_t ld) {
  HWY_DYNAMIC_DISPATCH(TransposeScaled)(rows, n, d, f, out, ld);
}
void row_dots8(const float* const* a, const float* const* b, std::size_t n, double* d) {
  HWY_DYNAMIC_DISPATCH(RowDots8)(a, b, n, d);
}

}  // namespace simd
}  // namespace attnscale::detail
#endif  // HWY_ONCE
