// bfloat16 products with float32 accumulation, for the bf16 forward (bf16_forward.cc).
//
// Operand layouts (both zero-padded as noted, so that every path may read whole tiles):
//   A  [M][lda] bf16, row-major; at least round_up(M, 16) rows allocated, K a multiple of 32
//   Bp [K/2][ldb][2] bf16, "VNNI" pairs: element (k, n) at Bp[((k/2)·ldb + n)·2 + k%2]; ldb a
//      multiple of 16 (columns past N are read, never written back)
// so that one 32-bit broadcast of A (two consecutive k) against one vector of Bp pairs is one
// vdpbf16ps step, and 16 x 32 A tiles and 16 x 16-pair B tiles are AMX tile loads.
#pragma once
#include <cstddef>
#include <cstdint>

#include "attnscale/tensor.h"

namespace attnscale::detail::bfdot {

// amx and avx512_bf16 multiply bf16 pairs (tdpbf16ps, vdpbf16ps); widened widens them to float32 in
// registers for float32 multiply-adds on the dispatched SIMD target (bf16_widened.cc; every CPU);
// portable is the plain loop, the readable statement of the contract below.
enum class Path { amx, avx512_bf16, widened, portable };
const char* path_name(Path p);  // "amx", "avx512-bf16", "widened", "portable"

// Run-time detection. AMX: CPUID AMX-TILE and AMX-BF16, XCR0 tile state enabled by the OS, AVX-512
// BF16 usable (the AMX products merge into C by AVX-512 and convert by vcvtneps2bf16), and
// the kernel's permission for tile data (arch_prctl ARCH_REQ_XCOMP_PERM) granted.
bool amx_usable();
bool avx512_bf16_usable();
Path best_path();  // amx, else avx512_bf16 (not on Intel's cores: see bf16_gemm.cc), else widened;
                   // $ATTNSCALE_BF16 may force one
Path path();       // the path forward() uses now
// Whether path p multiplies by vdpbf16ps (and converts by vcvtneps2bf16) on this CPU: amx or
// avx512_bf16, with AVX-512 BF16 usable.
bool vdpbf16ps_path(Path p);
void force_path(const char* name);  // a path_name() or "" (best); throws if unusable

// Bytes a product asks into the second-level cache while it runs, a few lines before each of its
// tiles (the AVX-512 BF16 path; the others ignore it): operands of a product after it, which would
// otherwise come from L3 as that product's first tiles read them (the bf16 backward).
struct Ahead {
  const void* p = nullptr;
  std::size_t bytes = 0;
};

// C[M x N] (ldc) = init + out_scale · A·B with init as in simd::GemmMode (0, C, row_scale[m]·C).
// `ahead` by reference: by value, the 14th argument went on the stack as two 8-byte pushes and was
// read back as one 16-byte load, which the store buffer cannot forward; that wait was 2.2% of the
// bf16 backward's samples (N = 4096, d = 64), whose products are many small calls.
void gemm(Path path, std::size_t M, std::size_t N, std::size_t K, const std::uint16_t* A, std::size_t lda,
          const std::uint16_t* Bp, std::size_t ldb, float* C, std::size_t ldc, int mode, const float* row_scale,
          float out_scale, const Ahead& ahead = {});

// The AMX tile configuration kept between the products of one thread's work: loading it costs
// about 55 ns (ldtilecfg; the forward's 128 x 128 x 128 products take about 3.5 µs, 1.25 µs of it
// tdpbf16ps), releasing it 4 ns. Every tile is configured 16 rows of 64 bytes, for gemm() and for
// cache decode's bf16 products alike (kv_bf16_dot.h). Opening a TileScope on the AMX path
// configures the tiles on the thread (if no open scope has); they stay so while it is open, and
// closing the last scope releases them, so no configuration outlives the work. Without a scope
// every AMX gemm() configures and releases. Nothing else may configure or release tiles on the
// thread while a scope is open. Other paths: no effect.
class TileScope {
 public:
  explicit TileScope(Path path);
  ~TileScope();
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;

 private:
  bool amx_;
};

// gemm() on Path::widened (bf16_widened.cc).
void gemm_widened(std::size_t M, std::size_t N, std::size_t K, const std::uint16_t* A, std::size_t lda,
                  const std::uint16_t* Bp, std::size_t ldb, float* C, std::size_t ldc, int mode,
                  const float* row_scale, float out_scale);

// Two rows rounded as round_to_bf16 into one row of pair words (to_bf16_pairs' layout):
// dst[c] = bits(even[c]) | bits(odd[c]) << 16, odd null for zeros (bf16_widened.cc).
void pair_row(const float* even, const float* odd, std::size_t cols, std::uint32_t* dst);

// Round to nearest even (NaN kept, quiet): the bits of the library's one rounding, to_bf16().
inline std::uint16_t round_to_bf16(float x) { return to_bf16(x).bits; }
// Rows k and k + 1 of a B operand (x0, x1: n values each) as its pairs' row k / 2: out[2c] = x0[c],
// out[2c + 1] = x1[c] (a loop the compiler vectorises; element by element into the pairs it was 2%
// of the bf16 backward's samples).
inline void interleave_rows(const std::uint16_t* x0, const std::uint16_t* x1, std::int64_t n, std::uint16_t* out) {
  for (std::int64_t c = 0; c < n; ++c) {
    out[2 * c] = x0[c];
    out[2 * c + 1] = x1[c];
  }
}
// 16 rows of 2·words bf16 values as 32-bit words, transposed: out[w·ldo + x] = word w of rows[x]
// (rows[x][2w] | rows[x][2w + 1] << 16) for w < words, x < 16; by 16 x 16 blocks in AVX-512
// registers on a CPU with AVX-512 BF16 (this file's AVX-512 code is compiled for it), whatever the
// path, else word by word.
void transpose_words16(const std::uint16_t* const* rows, std::size_t words, std::uint32_t* out, std::size_t ldo);
// 16 rows of n bf16 values, transposed: out[c·ldo + x] = rows[x][c] for c < n, x < 16; by 16 x 32
// blocks in AVX-512 registers on a CPU with AVX-512 BF16, else value by value.
void transpose_halves16(const std::uint16_t* const* rows, std::size_t n, std::uint16_t* out, std::size_t ldo);
// dst[e] = round_to_bf16(src[e]) for e < n, the same bits on every CPU (bfloat_rows.h's bf16_row):
// float32 inputs packed for the bf16 products.
void round_bits(const float* src, std::size_t n, std::uint16_t* dst);
// dst[r][c] = bf16(src[r][c]) for c < cols (a multiple of 16): vcvtneps2bf16 on the AVX-512 BF16
// and AMX paths (which, unlike round_to_bf16, flushes float32 subnormals to zero), else
// round_to_bf16.
void to_bf16(Path path, const float* src, std::size_t lds, std::size_t rows, std::size_t cols, std::uint16_t* dst,
             std::size_t ldd);
// The same rounding into a VNNI B operand, pairs over src's rows: dst[((r/2)·ldd + c)·2 + r%2] =
// bf16(src[r][c]) for r < rows, 0 for rows <= r < pad_rows (even), c < cols (a multiple of 16).
void to_bf16_pairs(Path path, const float* src, std::size_t lds, std::size_t rows, std::size_t pad_rows,
                   std::size_t cols, std::uint16_t* dst, std::size_t ldd);

}  // namespace attnscale::detail::bfdot

namespace attnscale::detail {
struct Params;
struct BackwardParams;
namespace bfdot {
// The bf16 forward over validated params (bf16_forward.cc).
void forward(const Params& p);
// The bf16 backward (bf16_backward.cc), for params it handles: no dbias wanted and finite q, k,
// v and dO (the float32 backward takes the others).
bool backward_handles(const BackwardParams& p);
void backward(const BackwardParams& p);
}  // namespace bfdot
}  // namespace attnscale::detail
