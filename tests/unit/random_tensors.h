// Test inputs: fresh random tensors (deterministic per seed) and error measures.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <vector>

#include "attention/kernels.h"
#include "attention/params.h"
#include "attnscale/tensor.h"
#include "lab/normals.h"
#include "lab/rng.h"

namespace attnscale::testing {

// How random_tensor draws: one normal from each Philox block (Stream::normal, float64 Box-Muller),
// or in bulk (lab::fill_normals: sixteen Philox blocks a SIMD step, float32 Box-Muller, four
// normals a block; other values, as random). The KV-cache tests' caches (millions of entries)
// take the bulk draw: there the one-by-one draws were most of the sanitised ctest's time.
enum class Draw { one, bulk };

// N(0, sigma²) entries; a different `stream` gives an independent tensor.
inline Tensor random_tensor(DType dtype, std::initializer_list<std::int64_t> shape, std::uint64_t seed,
                            std::uint32_t stream, double sigma = 1.0, Draw draw = Draw::one) {
  Tensor t(dtype, shape);
  const lab::Stream rng(seed, stream, 0);
  const std::int64_t n = t.numel();
  constexpr std::int64_t kChunk = 4096;  // a multiple of lab::kNormalGroup: fill_normals' offsets
  std::vector<double> z(draw == Draw::bulk ? std::min(kChunk, n) : 0);
  // The bulk draw on the machine's best SIMD target, whatever target a test has forced on the
  // library (Highway's choice is global): under the scalar one it took half the time of the
  // sanitised KV-cache tests, which force every target in turn.
  std::optional<detail::simd::BestTarget> best;
  if (draw == Draw::bulk) best.emplace();
  for (std::int64_t i = 0; i < n; ++i) {
    if (draw == Draw::bulk && i % kChunk == 0)
      lab::fill_normals(rng, static_cast<std::uint64_t>(i), std::min(kChunk, n - i), z.data());
    const double x = sigma * (draw == Draw::bulk ? z[i % kChunk] : rng.normal(i));
    if (dtype == DType::f32) t.as<float>()[i] = static_cast<float>(x);
    else if (dtype == DType::f64) t.as<double>()[i] = x;
    else if (dtype == DType::bf16) t.as<bf16>()[i] = to_bf16(static_cast<float>(x));
    else t.as<std::uint8_t>()[i] = x > 0 ? 1 : 0;
  }
  return t;
}

// The [B, H, N, d] view of a [B, N, H, d] buffer (PyTorch's and FlashAttention's layout: a head's
// rows H·d apart).
inline TensorView bnhd_view(const void* data, DType dtype, std::int64_t B, std::int64_t H, std::int64_t N,
                            std::int64_t d) {
  return TensorView::strided(const_cast<void*>(data), dtype, {B, H, N, d}, {N * H * d, d, H * d, 1});
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

// max |a − b| / max(1, max |b|) over all elements: an error relative to the result's scale, not
// to each element (a gradient's small elements carry the rounding of its large ones).
inline double scaled_error(const Tensor& a, const Tensor& b) {
  double err = 0, size = 1;
  for (std::int64_t n = 0; n < b.numel(); ++n) {
    err = std::max(err, std::fabs(value_at(a.view(), n) - value_at(b.view(), n)));
    size = std::max(size, std::fabs(value_at(b.view(), n)));
  }
  return err / size;
}

// The largest |dx_i − (loss(x_i + h) − loss(x_i − h)) / 2h| over the elements of the float64 tensor
// x (changed in place and restored): a gradient checked against central differences.
template <class Loss>
double central_difference_error(const Tensor& x, const Tensor& dx, Loss&& loss, double h = 1e-6) {
  double* p = const_cast<double*>(x.as<double>());
  double worst = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double keep = p[i];
    p[i] = keep + h;
    const double up = loss();
    p[i] = keep - h;
    const double down = loss();
    p[i] = keep;
    worst = std::max(worst, std::fabs(dx.as<double>()[i] - (up - down) / (2 * h)));
  }
  return worst;
}

}  // namespace attnscale::testing
