// Views and the owning Tensor (bfloat16 conversion is inline in the header).
#include "attnscale/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "attnscale/error.h"
#include "common/memory.h"

namespace attnscale {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::bf16: return "bfloat16";
    case DType::u8: return "bool/uint8";
    case DType::i8: return "int8";
    case DType::i32: return "int32";
    case DType::f16: return "float16";
  }
  return "?";
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::u8: return 1;
    case DType::i8: return 1;
    case DType::i32: return 4;
    case DType::f16: return 2;
  }
  return 0;
}

namespace {
void check_rank(std::size_t rank) {
  if (rank < 1 || rank > static_cast<std::size_t>(kMaxRank))
    throw Error("tensor rank must be 1..4, got " + std::to_string(rank));
}

// A view of `data` with the given shape and its strides not yet set.
TensorView shaped(void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
  check_rank(shape.size());
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = static_cast<int>(shape.size());
  int i = 0;
  for (auto s : shape) v.shape[i++] = s;
  return v;
}
}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
  TensorView v = shaped(data, dtype, shape);
  std::int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.strides[d] = stride;
    stride *= v.shape[d];
  }
  return v;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               std::initializer_list<std::int64_t> strides) {
  TensorView v = shaped(data, dtype, shape);
  if (strides.size() != shape.size())
    throw Error("strides: " + std::to_string(strides.size()) + " strides for rank " +
                std::to_string(shape.size()));
  int i = 0;
  for (auto s : strides) v.strides[i++] = s;
  return v;
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return rank ? n : 0;
}

bool TensorView::is_contiguous() const {
  std::int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    stride *= shape[d];
  }
  return true;
}

std::string TensorView::shape_str() const {
  // A rank outside 0..kMaxRank has no shape to print (shape holds kMaxRank dimensions).
  if (rank < 0 || rank > kMaxRank) return "[rank " + std::to_string(rank) + "?]";
  std::string s = "[";
  for (int d = 0; d < rank; ++d) (s += d ? ", " : "") += std::to_string(shape[d]);
  return s + "]";
}

Tensor::Tensor(DType dtype, std::initializer_list<std::int64_t> shape)
    : Tensor(dtype, shape.begin(), static_cast<int>(shape.size())) {}

Tensor::Tensor(DType dtype, const std::int64_t* shape, int rank) {
  check_rank(static_cast<std::size_t>(rank));
  view_.dtype = dtype;
  view_.rank = rank;
  // Refuse sizes whose byte count overflows or exceeds what one process could ever hold,
  // before allocating (a clear error instead of an out-of-memory kill).
  constexpr std::int64_t kMaxBytes = std::int64_t{1} << 46;  // 64 TiB
  // A zero dimension makes the tensor empty whatever the others are (numpy allows (10^6, 10^6, 0)).
  bool empty = false;
  for (int d = 0; d < rank; ++d) empty = empty || shape[d] == 0;
  std::int64_t n = empty ? 0 : 1;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] < 0) throw Error("tensor: negative dimension in shape");
    view_.shape[d] = shape[d];
    if (!empty && n > kMaxBytes / shape[d]) throw Error("tensor: shape too large to allocate");
    n *= shape[d];
  }
  if (n > kMaxBytes / static_cast<std::int64_t>(dtype_size(dtype)))
    throw Error("tensor: shape too large to allocate");
  std::int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    view_.strides[d] = stride;
    // Only an empty tensor's dimensions can multiply past int64 (the others were bounded above);
    // its strides address nothing, so they saturate.
    if (__builtin_mul_overflow(stride, view_.shape[d], &stride)) stride = INT64_MAX;
  }
  std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dtype);
  detail::check_allocation([&] { return "tensor " + view_.shape_str() + " " + std::string(dtype_name(dtype)); },
                           static_cast<double>(bytes));
  std::byte* p = static_cast<std::byte*>(detail::allocate_block(bytes));
  if (!p)
    throw Error("tensor " + view_.shape_str() + " " + std::string(dtype_name(dtype)) + ": cannot allocate " +
                detail::format_bytes(static_cast<double>(bytes)) + " (out of memory)");
  storage_ = std::shared_ptr<std::byte[]>(p, [](std::byte* q) { detail::release_block(q); });
  view_.data = p;
}

}  // namespace attnscale
