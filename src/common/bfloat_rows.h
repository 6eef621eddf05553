// Rows of bfloat16 to and from float32 (convert.cc, vectorised for each SIMD target): the bits of
// tensor.h's to_bf16 (round to nearest even, NaN kept and quietened) and from_bf16 (exact), element
// by element. convert() and the bf16 kernels' packing of float32 inputs both use them.
#pragma once
#include <cstdint>

namespace attnscale::detail {

// dst[i] = to_bf16(src[i]).bits for i < n.
void bf16_row(const float* src, std::int64_t n, std::uint16_t* dst);
// dst[i] = from_bf16(src[i]) for i < n, src[i] the bits of a bfloat16.
void f32_row(const std::uint16_t* src, std::int64_t n, float* dst);

}  // namespace attnscale::detail
