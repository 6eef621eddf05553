// Test inputs: fresh random tensors (deterministic per seed) and error measures.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

#include "attention/params.h"
#include "attnscale/tensor.h"
#include "lab/rng.h"

namespace attnscale::testing {

// How random_tensor draws: one normal from each Philox block (Stream::normal), or both Box-Muller
// outputs of a block (Stream::fill_normal), half the transcendental calls and other values. The
// KV-cache tests' caches (millions of entries, drawn afresh for every target) take pairs: there the
// draws were 60% of the time, most of the sanitised ctest's.
enum class Draw { one, pairs };

// N(0, sigma²) entries; a different `stream` gives an independent tensor.
inline Tensor random_tensor(DType dtype, std::initializer_list<std::int64_t> shape, std::uint64_t seed,
                            std::uint32_t stream, double sigma = 1.0, Draw draw = Draw::one) {
  Tensor t(dtype, shape);
  const lab::Stream rng(seed, stream, 0);
  constexpr std::int64_t kChunk = 4096;  // even: fill_normal's offsets
  std::vector<double> z(draw == Draw::pairs ? kChunk : 0);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (draw == Draw::pairs && i % kChunk == 0)
      rng.fill_normal(static_cast<std::uint64_t>(i), std::min(kChunk, t.numel() - i), z.data());
    const double x = sigma * (draw == Draw::pairs ? z[i % kChunk] : rng.normal(i));
    if (dtype == DType::f32) t.as<float>()[i] = static_cast<float>(x);
    else if (dtype == DType::f64) t.as<double>()[i] = x;
    else if (dtype == DType::bf16) t.as<bf16>()[i] = to_bf16(static_cast<float>(x));
    else t.as<std::uint8_t>()[i] = x > 0 ? 1 : 0;
  }
  return t;
}

// Fills with NaN so that an element a kernel forgets to write fails the comparison.
inline void poison(Tensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype() == DType::f32) t.as<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    else if (t.dtype() == DType::f64) t.as<double>()[i] = std::numeric_limits<double>::quiet_NaN();
    else if (t.dtype() == DType::bf16) t.as<bf16>()[i] = bf16{0x7FC0};  // quiet NaN
  }
}

// Element n (C order over the view's shape) of any float view, as double.
inline double value_at(const TensorView& v, std::int64_t n) {
  std::int64_t off = 0;
  for (int d = v.rank - 1; d >= 0; --d) {
    off += (n % v.shape[d]) * v.strides[d];
    n /= v.shape[d];
  }
  const char* p = static_cast<const char*>(v.data) + off * static_cast<std::int64_t>(dtype_size(v.dtype));
  TensorView t = v;
  return detail::load(t, p);
}

// ‖a − b‖ / ‖b‖ over all elements (NaN if any element of a is NaN where b is not).
inline double rel_error(const TensorView& a, const TensorView& b) {
  double num = 0, den = 0;
  for (std::int64_t n = 0; n < b.numel(); ++n) {
    const double x = value_at(a, n), y = value_at(b, n);
    if (std::isnan(x) != std::isnan(y)) return std::numeric_limits<double>::quiet_NaN();
    if (std::isnan(y) || (std::isinf(y) && x == y)) continue;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace attnscale::testing
