// attnscale/tensor.h: non-owning strided views and a small owning tensor.
//
// Shapes follow DESIGN.md: Q [B, Hq, Nq, dk], K [B, Hkv, Nkv, dk], V [B, Hkv, Nkv, dv].
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

namespace attnscale {

enum class DType : std::uint8_t { f32, f64, bf16, u8, i8, i32 };

// "float32", "float64", "bfloat16", "bool/uint8", "int8", "int32"; i8 and i32 are for KV caches
// (quantised values, block tables and lengths, see kv_cache.h).
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
