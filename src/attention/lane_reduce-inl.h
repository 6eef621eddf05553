// Per-target reductions across lanes (the cache decode's kv_*.cc, kernels-inl.h): one vector's sum as a scalar
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

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// The lane sums of 16 vectors at once, as one vector: lane k is LaneSum of the vector of key k,
// bit for bit. LaneSum (_mm512_reduce_add_ps) adds lane i to lane i + 8, then i + 4, then i + 2,
// then i + 1; here each round does the same additions for several vectors per instruction:
// 256-bit halves of two vectors, then 128-bit blocks of two, then 64-bit pairs, then lanes, 30
// shuffles and 15 adds for the 16 sums where 16 LaneSums take about 8 operations each. The
// rounds leave the sum of the vector in row m at lane 4·(m % 4) + m / 4, so row m holds key
// Lane16Row(k) = that same transpose of k (its own inverse): the result is then in key order.
// rows: 16 vectors of 16 floats, 64-byte aligned, 16 floats apart.
constexpr size_t Lane16Row(size_t k) { return 4 * (k % 4) + k / 4; }
HWY_INLINE hn::Vec<hn::Simd<float, 16, 0>> LaneSums16(const float* rows) {
  __m512 x[8], y[4], z[2];
  for (int i = 0; i < 8; ++i) {  // lane l of key 2i (l < 8) and of key 2i + 1 (8 + l): a_l + a_{l+8}
    const __m512 a = _mm512_load_ps(rows + 32 * i), b = _mm512_load_ps(rows + 32 * i + 16);
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
  for (int i = 0; i < 4; ++i)  // block c: lanes 0-3 of one key, + lanes 4-7
    y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i) {  // in each block, lanes 0-1 + lanes 2-3, two keys a block
    const __m512d a = _mm512_castps_pd(y[2 * i]), b = _mm512_castps_pd(y[2 * i + 1]);
    z[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  return hn::Vec<hn::Simd<float, 16, 0>>{
      _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xDD))};
}
#endif

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
