// Per-target reductions across lanes (kv_kernels.cc, kernels-inl.h): one vector's sum as a scalar
// (LaneSum, every target), and four vectors at once (128-bit and wider targets, not HWY_SCALAR):
// where a reduction per vector (SumOfLanes, MaxOfLanes) takes log2(lanes) shuffle-and-op rounds
// for one result, these take about as many for four. Included once per Highway target like the
// kernels that use them.
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

// The sum of v's lanes as a scalar. hn::SumOfLanes returns it in every lane, and on AVX-512 GCC 12
// kept that broadcast (a vbroadcastss) before taking lane 0, on the path of every key's score in
// one-row decode; the reduction is the same instructions (_mm512_reduce_add_ps), so the same bits.
// int8 rows, H = 8, d = 128, Nkv = 65536, two threads, calls alternated with the old path (three
// runs): 0.90-0.95 of a copy against 0.76-0.88; float32 rows (bound by the reads) the same.
template <class D>
HWY_INLINE float LaneSum(D d, hn::Vec<D> v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(D()) == 16) {
    (void)d;
    return _mm512_reduce_add_ps(v.raw);
  }
#endif
  return hn::GetLane(hn::SumOfLanes(d, v));
}

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
