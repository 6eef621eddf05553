// One element of a float view as a double and back, by dtype: float32, float64, bfloat16 and
// float16 (stores rounding to nearest even; float64 to the 16-bit types by way of float32). Any
// other dtype loads as 0 and stores nothing. The portable paths of the kernels (params.h's load /
// store) and convert (convert.cc) read and write elements through these.
#pragma once
#include "attnscale/tensor.h"

namespace attnscale::detail {

inline double load_element(DType t, const void* p) {
  switch (t) {
    case DType::f32: return *static_cast<const float*>(p);
    case DType::f64: return *static_cast<const double*>(p);
    case DType::bf16: return from_bf16(*static_cast<const bf16*>(p));
    case DType::f16: return from_f16(*static_cast<const f16*>(p));
    default: return 0.0;
  }
}
inline void store_element(DType t, void* p, double x) {
  switch (t) {
    case DType::f32: *static_cast<float*>(p) = static_cast<float>(x); break;
    case DType::f64: *static_cast<double*>(p) = x; break;
    case DType::bf16: *static_cast<bf16*>(p) = to_bf16(static_cast<float>(x)); break;
    case DType::f16: *static_cast<f16*>(p) = to_f16(static_cast<float>(x)); break;
    default: break;
  }
}

}  // namespace attnscale::detail
