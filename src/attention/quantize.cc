// quantize_q8 (attnscale/kv_cache.h): float32 rows to int8 blocks of 32 with one float32 scale.
//
// Per block x[0..32): scale = max|x| / 127, q_i = round(x_i / scale), so |q_i| <= 127 and
// |x_i − scale·q_i| <= scale / 2 = max|x| / 254: the error is relative to the block's largest
// value, as in ggml's q8_0 (whose scale is float16; float32 here).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnscale/error.h"
#include "attnscale/kv_cache.h"

namespace attnscale {
namespace {

std::int64_t offset(const TensorView& t, std::int64_t flat_row) {  // row index over the leading dimensions
  std::int64_t off = 0;
  for (int d = t.rank - 2; d >= 0; --d) {
    off += (flat_row % t.shape[d]) * t.strides[d];
    flat_row /= t.shape[d];
  }
  return off;
}

}  // namespace

void quantize_q8(const TensorView& src, const TensorView& dst, const TensorView& scales) {
  if (src.dtype != DType::f32 || src.rank < 1) throw Error("quantize_q8: src: expected float32, got " + std::string(dtype_name(src.dtype)));
  const std::int64_t d = src.shape[src.rank - 1];
  if (d % 32 != 0) throw Error("quantize_q8: src: last dimension " + std::to_string(d) + " is not a multiple of 32");
  if (dst.dtype != DType::i8 || dst.rank != src.rank || dst.shape != src.shape)
    throw Error("quantize_q8: dst: expected int8 " + src.shape_str() + ", got " + std::string(dtype_name(dst.dtype)) +
                " " + dst.shape_str());
  bool same = scales.dtype == DType::f32 && scales.rank == src.rank && scales.shape[src.rank - 1] == d / 32;
  for (int i = 0; same && i + 1 < src.rank; ++i) same = scales.shape[i] == src.shape[i];
  if (!same) throw Error("quantize_q8: scales: expected float32 with src's shape and last dimension d/32, got " +
                         std::string(dtype_name(scales.dtype)) + " " + scales.shape_str());
  if (src.numel() == 0) return;  // nothing to quantise (an empty view's strides say nothing)
  const int last = src.rank - 1;
  if (dst.strides[last] != 1 || (d > 32 && scales.strides[last] != 1))
    throw Error("quantize_q8: the last dimension of dst and scales must be contiguous");
  const std::int64_t rows = src.numel() / d;  // d > 0: an empty src returned above
  const std::int64_t step = src.strides[last];
  auto first = [&](std::int64_t r) { return static_cast<const float*>(src.data) + offset(src, r); };
  // Every value is checked (where it lies) before any is written, so that a refused src leaves dst
  // and scales as they were (std::max, which finds a block's scale, would pass over a NaN).
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = first(r);
    for (std::int64_t j = 0; j < d; ++j)
      if (!std::isfinite(x[j * step])) throw Error("quantize_q8: src holds a non-finite value");
  }
  std::vector<float> gathered;  // a row of src whose values lie a stride apart, one after another
  auto row = [&](std::int64_t r) {
    const float* x = first(r);
    if (step == 1) return x;
    gathered.resize(d);
    for (std::int64_t j = 0; j < d; ++j) gathered[j] = x[j * step];
    return static_cast<const float*>(gathered.data());
  };
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = row(r);
    std::int8_t* q = static_cast<std::int8_t*>(dst.data) + offset(dst, r);
    float* sc = static_cast<float*>(scales.data) + offset(scales, r);
    for (std::int64_t blk = 0; blk < d / 32; ++blk) {
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[blk * 32 + i]));
      const float scale = amax / 127.0f, inv = scale == 0.0f ? 0.0f : 1.0f / scale;
      sc[blk] = scale;
      for (int i = 0; i < 32; ++i)
        q[blk * 32 + i] = static_cast<std::int8_t>(std::clamp(std::nearbyint(x[blk * 32 + i] * inv), -127.0f, 127.0f));
    }
  }
}

}  // namespace attnscale
