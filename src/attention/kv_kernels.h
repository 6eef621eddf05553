// Cache-decode tile kernels (kv_kernels.cc), dispatched at run time to the best SIMD target
// (see kernels.h for the target control they share). Key and value rows are given by pointer,
// one per key; an int8 row has one float32 scale per 32 values (ksc[j], vsc[j]; null otherwise).
#pragma once
#include <cstddef>

namespace attnscale::detail::kv {

enum ElementType : int { kF32 = 0, kBF16 = 1, kI8 = 2 };

// S[r][j] = Σ_c Q[r][c] · K_j[c] for rows r < rows (Q row stride ldq) and keys j < nk.
void scores(int type, std::size_t nk, std::size_t rows, std::size_t dk, const void* const* krow,
            const float* const* ksc, const float* Q, std::size_t ldq, float* S, std::size_t lds);

// O[r] = alpha[r]·O[r] + Σ_j P[r][j]·V_j for rows r < rows (O row stride ldo).
void accumulate(int type, std::size_t nk, std::size_t rows, std::size_t dv, const void* const* vrow,
                const float* const* vsc, const float* P, std::size_t ldp, const float* alpha, float* O,
                std::size_t ldo);

}  // namespace attnscale::detail::kv
