// attnscale/tensor.h: non-owning strided views and a small owning tensor.
//
// Shapes (docs/api.md): Q [B, Hq, Nq, dk], K [B, Hkv, Nkv, dk], V [B, Hkv, Nkv, dv].
// Strides are in elements, so a [B, N, H, d] buffer can be viewed as [B, H, N, d] without a copy:
//   TensorView q = TensorView::strided(ptr, DType::f32, {B, H, N, d}, {N*H*d, d, H*d, 1});
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

// Every public header includes this one, so attnscale::Error, which their functions throw, is
// declared wherever they are: `catch (const attnscale::Error&)` needs no other include.
#include "attnscale/error.h"

namespace attnscale {

enum class DType : std::uint8_t { f32, f64, bf16, u8, i8, i32, f16 };

// "float32", "float64", "bfloat16", "bool/uint8", "int8", "int32", "float16"; f16, i8 and i32 are
// for KV caches (stored keys and values, quantised values, block tables and lengths, see
// kv_cache.h).
std::string_view dtype_name(DType t);
std::size_t dtype_size(DType t);

// bfloat16 storage: the upper 16 bits of an IEEE float32 (round-to-nearest-even on conversion).
struct bf16 {
  std::uint16_t bits = 0;
};
// Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. NaN stays NaN
// (quietened) instead of rounding into infinity. Inline, so that loops over rows vectorise.
inline bf16 to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}
inline float from_bf16(bf16 x) {
  const std::uint32_t u = static_cast<std::uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 storage (1 sign, 5 exponent, 10 fraction bits): llama.cpp's default KV cache type
// and FlashAttention's half. Conversions are exact one way and round to nearest even the other;
// written out here because Highway 1.0 converts float16 only in vectors.
struct f16 {
  std::uint16_t bits = 0;
};
// Exact: normal numbers rebias the exponent (15 -> 127, +112) and shift the fraction up 13 bits;
// subnormals are fraction · 2^-24 (a float32 holds the 10-bit product exactly); exponent 31 is
// infinity or NaN.
inline float from_f16(f16 x) {
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x8000u) << 16;
  const std::uint32_t exp = (x.bits >> 10) & 0x1fu, frac = x.bits & 0x3ffu;
  std::uint32_t u;
  if (exp == 0) {
    const float f = static_cast<float>(frac) * 5.9604644775390625e-8f;  // 2^-24
    std::memcpy(&u, &f, 4);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (frac << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (frac << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even. |x| >= 65520 (half-way past the largest half, 65504) becomes infinity;
// below 2^-14 the result is subnormal: |x| · 2^24 rounded to an integer (the scaling is exact, and
// the integer 1024 is the smallest normal's encoding); else the float32 bits rebiased, with
// 0xfff plus the lowest kept bit added before the 13 dropped bits are cut. NaN stays NaN.
inline f16 to_f16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return f16{static_cast<std::uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu))};
  if (u >= 0x477ff000u) return f16{static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (u < 0x38800000u) {
    float a;
    std::memcpy(&a, &u, 4);
    a *= 16777216.0f;  // 2^24
    auto n = static_cast<std::uint32_t>(a);  // truncated, then rounded half to even
    const float rest = a - static_cast<float>(n);
    if (rest > 0.5f || (rest == 0.5f && (n & 1u))) ++n;
    return f16{static_cast<std::uint16_t>(sign | n)};
  }
  u = (u - (112u << 23)) + 0xfffu + ((u >> 13) & 1u);
  return f16{static_cast<std::uint16_t>(sign | (u >> 13))};
}

inline constexpr int kMaxRank = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> strides{};  // in elements

  // A C-order (row-major) view of `shape`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape);
  static TensorView strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                            std::initializer_list<std::int64_t> strides);

  bool empty() const { return data == nullptr; }
  std::int64_t numel() const;
  bool is_contiguous() const;
  std::string shape_str() const;  // "[2, 3, 4]"
};

// dst = src element by element, between float32, float64, bfloat16 and float16 (rounding to
// nearest even where dst is narrower), any strides, the same shape. float16 <-> float32 rows with a
// contiguous last dimension use the CPU's conversion instructions (F16C / AVX-512). Throws Error
// naming src or dst for another dtype or a different shape.
void convert(const TensorView& src, const TensorView& dst);

// An owning, 64-byte aligned, C-order tensor of rank 1..4.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::initializer_list<std::int64_t> shape);
  Tensor(DType dtype, const std::int64_t* shape, int rank);

  DType dtype() const { return view_.dtype; }
  int rank() const { return view_.rank; }
  std::int64_t dim(int i) const { return view_.shape[i]; }
  std::int64_t numel() const { return view_.numel(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }
  void* data() { return view_.data; }
  const void* data() const { return view_.data; }
  template <class T> T* as() { return static_cast<T*>(view_.data); }
  template <class T> const T* as() const { return static_cast<const T*>(view_.data); }
  const TensorView& view() const { return view_; }
  bool empty() const { return view_.data == nullptr; }

 private:
  std::shared_ptr<std::byte[]> storage_;
  TensorView view_;
};

}  // namespace attnscale
