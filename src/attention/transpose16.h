// 16 x 16 32-bit words transposed in AVX-512 registers, for the packings that turn rows into
// columns (bf16_gemm.cc's K words and K halves, kernels-inl.h's Q block).
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>

namespace attnscale::detail {

// w[i] = word i of the 16 rows r[0..15], lane x holding row x's. Pairs of rows interleaved word by
// word, then pairs of words, then the 128-bit lanes of four such blocks: after the first two steps
// lane L of u[4g + c] holds word 4L + c of rows 4g..4g+3, and the two lane shuffles gather the four
// row groups' lane L into one vector, word 4L + c of all 16 rows. (The zero-masked forms with every
// lane kept are the plain instructions; GCC 12 warns that the plain intrinsics' undefined
// pass-through vector "may be used uninitialized".)
__attribute__((target("avx512f"), always_inline)) inline void transpose16_words(const __m512i* r, __m512i* w) {
  __m512i t[16], u[16];
  for (int x = 0; x < 16; x += 2) {
    t[x] = _mm512_maskz_unpacklo_epi32(0xFFFF, r[x], r[x + 1]);
    t[x + 1] = _mm512_maskz_unpackhi_epi32(0xFFFF, r[x], r[x + 1]);
  }
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_maskz_unpacklo_epi64(0xFF, t[g], t[g + 2]);
    u[g + 1] = _mm512_maskz_unpackhi_epi64(0xFF, t[g], t[g + 2]);
    u[g + 2] = _mm512_maskz_unpacklo_epi64(0xFF, t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_maskz_unpackhi_epi64(0xFF, t[g + 1], t[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x02 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[c], u[4 + c], 0x88);
    const __m512i x13 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[c], u[4 + c], 0xDD);
    const __m512i y02 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[8 + c], u[12 + c], 0x88);
    const __m512i y13 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[8 + c], u[12 + c], 0xDD);
    w[c] = _mm512_maskz_shuffle_i32x4(0xFFFF, x02, y02, 0x88);
    w[4 + c] = _mm512_maskz_shuffle_i32x4(0xFFFF, x13, y13, 0x88);
    w[8 + c] = _mm512_maskz_shuffle_i32x4(0xFFFF, x02, y02, 0xDD);
    w[12 + c] = _mm512_maskz_shuffle_i32x4(0xFFFF, x13, y13, 0xDD);
  }
}

}  // namespace attnscale::detail
#endif
