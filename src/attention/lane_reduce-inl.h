// Per-target reductions across the lanes of four vectors at once (kv_kernels.cc, kernels-inl.h):
// where a reduction per vector (SumOfLanes, MaxOfLanes) takes log2(lanes) shuffle-and-op rounds
// for one result, these take about as many for four. Included once per Highway target like the
// kernels that use them; 128-bit and wider targets (not HWY_SCALAR).
#if defined(ATTNSCALE_ATTENTION_LANE_REDUCE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNSCALE_ATTENTION_LANE_REDUCE_INL_H_
#undef ATTNSCALE_ATTENTION_LANE_REDUCE_INL_H_
#else
#define ATTNSCALE_ATTENTION_LANE_REDUCE_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
struct AddOp {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const { return hn::Add(a, b); }
};
struct MaxOp {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const { return hn::Max(a, b); }
};

// Lane i of every 128-bit block of the result holds op over that block's four lanes of a_i: two
// rounds of interleave-and-op (32-bit lanes, then 64-bit). BlockReduce then combines the blocks.
template <class D, class Op>
HWY_INLINE hn::Vec<D> Across4(D d, hn::Vec<D> a0, hn::Vec<D> a1, hn::Vec<D> a2, hn::Vec<D> a3, Op op) {
  const hn::Repartition<double, D> dd;
  const auto x01 = op(hn::InterleaveLower(d, a0, a1), hn::InterleaveUpper(d, a0, a1));
  const auto x23 = op(hn::InterleaveLower(d, a2, a3), hn::InterleaveUpper(d, a2, a3));
  const auto y01 = hn::BitCast(dd, x01), y23 = hn::BitCast(dd, x23);
  return op(hn::BitCast(d, hn::InterleaveLower(dd, y01, y23)), hn::BitCast(d, hn::InterleaveUpper(dd, y01, y23)));
}

// The 128-bit blocks of v combined lane by lane: lane i of the result is op over lane i of each block.
template <class D, class Op>
HWY_INLINE hn::Vec<hn::Full128<float>> BlockReduce(D d, hn::Vec<D> v, Op op) {
  if constexpr (hn::MaxLanes(D()) == 16) {
    const hn::Half<D> d8;
    const hn::Half<decltype(d8)> d4;
    const auto h = op(hn::LowerHalf(d8, v), hn::UpperHalf(d8, v));
    return op(hn::LowerHalf(d4, h), hn::UpperHalf(d4, h));
  } else if constexpr (hn::MaxLanes(D()) == 8) {
    const hn::Half<D> d4;
    return op(hn::LowerHalf(d4, v), hn::UpperHalf(d4, v));
  } else {
    (void)d;
    return v;
  }
}

// The four lanes' sums (or maxima) of a0..a3, lane i for a_i.
template <class D, class Op>
HWY_INLINE hn::Vec<hn::Full128<float>> Reduce4(D d, hn::Vec<D> a0, hn::Vec<D> a1, hn::Vec<D> a2, hn::Vec<D> a3,
                                               Op op) {
  return BlockReduce(d, Across4(d, a0, a1, a2, a3, op), op);
}
#endif

}  // namespace attnscale::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
