// Float vectors as the compiler's own vector type (__m512 on AVX-512, __m256 on AVX2), for arrays
// of accumulators that must stay in registers: GCC keeps arrays of Highway's vector structs on
// the stack in the larger kernels (the tile GEMM's sums, kernels-inl.h; the one-row decode's
// output row, kv_stream_row.cc), loading and storing them around every inner loop. Targets whose
// vector is an array (EMU128: float[4]) cannot hold it as a raw value: there the vector structs
// themselves stand in (ToRaw / FromRaw are identities). Included once per Highway target.
#if defined(ATTNSCALE_ATTENTION_RAW_VECTORS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNSCALE_ATTENTION_RAW_VECTORS_INL_H_
#undef ATTNSCALE_ATTENTION_RAW_VECTORS_INL_H_
#else
#define ATTNSCALE_ATTENTION_RAW_VECTORS_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;  // as in exp2-inl.h and kernels-inl.h
using VF = hn::Vec<DF>;

#if HWY_TARGET == HWY_EMU128
using RawF = VF;
HWY_INLINE RawF ToRaw(VF v) { return v; }
HWY_INLINE VF FromRaw(const RawF& r) { return r; }
#else
using RawF = decltype(VF().raw);
HWY_INLINE RawF ToRaw(VF v) { return v.raw; }
HWY_INLINE VF FromRaw(RawF r) { return VF{r}; }
#endif

}  // namespace attnscale::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
