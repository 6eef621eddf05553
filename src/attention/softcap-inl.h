// Soft-capping of float32 scores, c·tanh(x / c), per Highway target: one formula for the tile
// kernels (kernels-inl.h, simd::softcap) and the one-row decode stream (kv_row_stream-inl.h), so that a
// score is capped to the same bits on either path. Highway's vector tanh: at most 4 ulp, ±1 past
// |x / c| > 18.7 (so ±inf → ±c), NaN kept.
#if defined(ATTNSCALE_ATTENTION_SOFTCAP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNSCALE_ATTENTION_SOFTCAP_INL_H_
#undef ATTNSCALE_ATTENTION_SOFTCAP_INL_H_
#else
#define ATTNSCALE_ATTENTION_SOFTCAP_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// tanh(x·inv) for inv = 1/c: the capped score is cap·CapTanh(...) (the backward's factor needs the
// tanh itself: 1 − tanh²).
template <class D, class V>
HWY_INLINE V CapTanh(D d, V x, V inv) {
  return hn::Tanh(d, hn::Mul(x, inv));
}

}  // namespace attnscale::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTNSCALE_ATTENTION_SOFTCAP_INL_H_
