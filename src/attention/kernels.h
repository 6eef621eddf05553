// The fast path's float32 tile kernels, dispatched at run time to the best SIMD target
// (Highway: scalar emulation, AVX2, AVX-512). A plain header: only pointers and sizes cross the
// dispatch boundary; the per-target code is in kernels-inl.h, the dispatch in kernels.cc.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace attnscale::detail::simd {

// C[M x N] (row stride ldc) = init + A·B where A(m, k) = A[m·ars + k·acs] (any strides: a
// transposed or strided operand needs no copy) and B(k, n) = B[k·ldb + n]. init is 0 (mode 0),
// C (mode 1) or row_scale[m]·C (mode 2).
enum GemmMode : int { kOverwrite = 0, kAccumulate = 1, kRescaleAccumulate = 2 };
void gemm(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t ars, std::size_t acs,
          const float* B, std::size_t ldb, float* C, std::size_t ldc, GemmMode mode,
          const float* row_scale = nullptr);
// The forward's products: gemm's result (bit for bit in modes 0 and 1), faster for the forward's tiles (the running
// sum over inner-dimension blocks kept in registers; kernels-inl.h, TileGemm).
void tile_gemm(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t ars, std::size_t acs,
               const float* B, std::size_t ldb, float* C, std::size_t ldc, GemmMode mode,
               const float* row_scale = nullptr);
// The forward's products on this CPU: tile_gemm where its register sums pay, else gemm (the same bits in
// modes 0 and 1, so the forward's scores stay the ones the backward recomputes). See kernels.cc.
void forward_gemm(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t ars, std::size_t acs,
                  const float* B, std::size_t ldb, float* C, std::size_t ldc, GemmMode mode,
                  const float* row_scale = nullptr);
// The forward's P·V over one key tile, C = row_scale·C + A·B (forward_gemm's mode 2), each
// element's K products (K <= kBc) summed in one chain rather than in InnerBlock(K) blocks
// (kernels.cc).
void forward_pv(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t ars, std::size_t acs,
                const float* B, std::size_t ldb, float* C, std::size_t ldc, const float* row_scale);
// The backward's accumulating products over one tile (dV += Pᵀ·dO, dK += dSᵀ·Q, dQ += dS·K; K is
// a tile's keys or a block's rows, <= 64): C += A·B (gemm's mode 1), each element's K products
// summed in one chain, as forward_pv (kernels.cc).
void accumulate_tile(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t ars, std::size_t acs,
                     const float* B, std::size_t ldb, float* C, std::size_t ldc);

// The accuracy of e^x in the row-layout softmax kernels: f32 to float32's rounding; bf16 for
// probabilities rounded to bfloat16 next (the bf16 forward), relative error at most 1.01e-4, 1/19
// of that rounding, three multiply-adds fewer a vector (Exp2Fraction in exp2-inl.h).
enum class ExpFor { f32, bf16 };

// Online-softmax step over a transposed score tile (see kernels-inl.h). cols: a multiple of 16.
void softmax_update(float* St, std::size_t lds, std::size_t rows, std::size_t cols, float* m, float* l,
                    float* alpha);
// St[j][c] = e^(St[j][c] − sub[c]) · mul[c] (the exp2 kernels take natural-unit scores; see ExpDiff).
void exp2_columns(float* St, std::size_t lds, std::size_t rows, std::size_t cols, const float* sub,
                  const float* mul, ExpFor e = ExpFor::f32);
// exp2_columns(ExpFor::bf16) over unscaled scores x (scale > 0), each read as t = x·scale; where
// every |sub| of a vector of columns is at most 4096, e^(t − sub) as 2^(x·(scale·log2 e) − sub·log2 e)
// by one multiply-add (softmax_update_rows_bf16_scaled's fold).
void exp2_columns_bf16_scaled(float* St, std::size_t lds, std::size_t rows, std::size_t cols, const float* sub,
                              const float* mul, float scale);
// exp2_columns_bf16_scaled, each P also rounded to bfloat16 into Pb (ldp): to_bf16's bits. Only
// where AVX-512 BF16 is usable (bf16_kernels.h's vdpbf16ps_path).
void exp2_columns_bf16_scaled_to(float* St, std::size_t lds, std::size_t rows, std::size_t cols, const float* sub,
                                 const float* mul, float scale, std::uint16_t* Pb, std::size_t ldp);
// softmax_grad's dSt, rounded to bfloat16 into dSb (ldp) and into pairs of rows dSv (element
// [j/2][c][0] row j's, [1] row j + 1's; ldv pairs a pair of rows), not stored in float32: the bits
// of softmax_grad, to_bf16 and to_bf16_pairs. rows even, cols a multiple of 16. Only where
// AVX-512 BF16 is usable.
void softmax_grad_to_bf16(const float* Pt, const float* dPt, std::size_t ld, std::size_t rows, std::size_t cols,
                          const float* D, float scale, std::uint16_t* dSb, std::size_t ldp, std::uint16_t* dSv,
                          std::size_t ldv);
// dPt[j][c] = Pt[j][c] · (dPt[j][c] − D[c]) · scale.
void softmax_grad(const float* Pt, float* dPt, std::size_t ld, std::size_t rows, std::size_t cols,
                  const float* D, float scale);
// Row layout (one query per row; sub and D per row): S[r][c] = e^(S[r][c] − sub[r]) and
// dP[r][c] = P[r][c] · (dP[r][c] − D[r]) · scale. cols: a multiple of 16.
// Scores of few rows, one dot product per (key, row), in row layout: St[r][j] = Σ_c K[j·ldk + c]·Q[r·ldq + c].
void dot_tile(std::size_t nk, std::size_t rows, std::size_t dk, const float* K, std::size_t ldk, const float* Q,
              std::size_t ldq, float* St, std::size_t lds);
// Online-softmax step over a tile in row layout (one query per row); any cols, the row padded
// with P = 0 up to whole vectors (lds >= round_up(cols, 16)).
void softmax_update_rows(float* S, std::size_t lds, std::size_t rows, std::size_t cols, float* m, float* l,
                         float* alpha, ExpFor e = ExpFor::f32);
// softmax_update_rows(ExpFor::bf16) over unscaled scores x (scale > 0), each read as t = x·scale:
// the same t, m, l and P as over scores x·scale written first. fold: e^(t − m) as
// 2^(x·(scale·log2 e) − m·log2 e) by one multiply-add where |m| <= 4096 (exp2-inl.h's ExpFolded
// and kFoldLimit; P within 7.2e-4 of the other, below bfloat16's rounding of it), so not the same
// bits.
void softmax_update_rows_bf16_scaled(float* S, std::size_t lds, std::size_t rows, std::size_t cols, float* m,
                                     float* l, float* alpha, float scale, bool fold = false);
// softmax_update_rows(ExpFor::bf16) (scaled: softmax_update_rows_bf16_scaled), P rounded to bfloat16
// into Pb[r][c] (ldp) for c < round_up(cols, 16) rather than left in S: the bits of to_bf16 on
// the P those leave. Only where AVX-512 BF16 is usable (bf16_kernels.h's vdpbf16ps_path).
void softmax_update_rows_to_bf16(float* S, std::size_t lds, std::size_t rows, std::size_t cols, float* m, float* l,
                                 float* alpha, float scale, bool scaled, bool fold, std::uint16_t* Pb,
                                 std::size_t ldp);
void exp2_rows(float* S, std::size_t lds, std::size_t rows, std::size_t cols, const float* sub,
               const float* mul = nullptr, ExpFor e = ExpFor::f32);  // then S[r][c] ·= mul[r]
void softmax_grad_rows(const float* P, float* dP, std::size_t ld, std::size_t rows, std::size_t cols,
                       const float* D, float scale);
// x[i] = c·tanh(x[i] / c) for i < n (c > 0), and dcap[i] = 1 − tanh²(x[i] / c) when dcap is not null.
void softcap(float* x, std::size_t n, float c, float* dcap = nullptr);
// dst[i] = src[i] · f for i < n (rows of unit stride, apart). decode()'s output rows: written
// element by element in place, they took 6% of a short GQA decode call (GCC left that loop scalar).
void scaled_copy(const float* src, float f, float* dst, std::size_t n);
// out[c·ld + r] = rows[r][c]·f for r < n, c < d (rows of unit stride): a block's Q transposed for
// the scores' product (pack_transposed), by 16 × 16 blocks in registers on AVX-512.
void transpose_scaled(const float* const* rows, std::size_t n, std::size_t d, float f, float* out, std::size_t ld);
// d[r] = Σ_c a[r][c]·b[r][c] for r < 8, c < n (float32 rows of unit stride), each a float64 chain
// in column order (the bits of the scalar loop on every target): the backward's D = dO·o.
void row_dots8(const float* const* a, const float* const* b, std::size_t n, double* d);

// Column padding every tile uses: a multiple of the widest target's lane count.
inline constexpr std::size_t kColumnPad = 16;

// Target control. The best target is chosen at first use, unless $ATTNSCALE_TARGET names one
// (scalar | avx2 | avx512), which must be compiled in and supported by this CPU.
const char* target_name();                   // the target the kernels run on now, e.g. "AVX3"
std::vector<std::string> available_targets();  // compiled in and supported here, by our names
void force_target(const std::string& name);    // one of available_targets(), or "" for the best
void init_target_from_env();                   // applies $ATTNSCALE_TARGET (once; idempotent)
// The best target while it lives, whatever target was forced; then that one again (or none).
class BestTarget {
 public:
  BestTarget();
  ~BestTarget();
  BestTarget(const BestTarget&) = delete;
  BestTarget& operator=(const BestTarget&) = delete;

 private:
  std::int64_t forced_;
};

}  // namespace attnscale::detail::simd
