// Vectorised Philox4x32-10 + Box-Muller (layout and formulas: normals.h). Highway compiles this
// file once per SIMD target (foreach_target.h re-includes it) and dispatches at run time.
//
// One Philox instance per 64-bit lane, its 32-bit words zero-extended: the 32 x 32 -> 64-bit
// products of a round are MulEven on the lanes' low halves, hi = product >> 32, lo = product & (2^32 − 1).
// Round (Random123 philox4x32round): (hi0, lo0) = M0·c0, (hi1, lo1) = M1·c2,
//   c' = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);  the key gains (W0, W1) between rounds.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lab/normals.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <cstddef>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace attnscale::lab::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// a · m for lanes holding 32-bit values: the full 64-bit product.
template <class D, class V>
HWY_INLINE V MulWide(D du, V a, std::uint32_t m) {
#if HWY_TARGET == HWY_SCALAR
  return hn::Set(du, hn::GetLane(a) * std::uint64_t{m});  // one lane: no 32-bit view of it
#else
  const hn::Repartition<std::uint32_t, D> d32;
  return hn::MulEven(hn::BitCast(d32, a), hn::BitCast(d32, hn::Set(du, std::uint64_t{m})));
#endif
}

// Groups [first, first + groups) of 32 normals each into out (normals.h: element 32g + 8m + l
// from block 8g + l, output m). T is float or double.
template <class T>
void FillGroups(const std::uint32_t* keys /* 20: (k0, k1) per round */, std::uint32_t trial, std::uint32_t stream,
                std::uint64_t first, std::size_t groups, T* HWY_RESTRICT out) {
  const hn::ScalableTag<std::uint64_t> du;
  const hn::Rebind<double, decltype(du)> dd;
  const hn::Rebind<std::int64_t, decltype(du)> di;
  const hn::Rebind<float, decltype(du)> df;  // as many float lanes as 64-bit ones
  const std::size_t N = hn::Lanes(du);  // 1, 2, 4 or 8: always divides 8
  const auto low = hn::Set(du, 0xffffffffull);
  const auto vtrial = hn::Set(du, trial), vstream = hn::Set(du, stream);
  const auto half = hn::Set(dd, 0.5), inv32 = hn::Set(dd, 1.0 / 4294967296.0);
  const auto minus2 = hn::Set(df, -2.0f), two_pi = hn::Set(df, 6.2831853f), pi = hn::Set(df, 3.14159265f);
  // (w + 1/2) / 2^32 exactly in float64, then rounded to float32 (relative error 2^-24 near 0 too).
  auto uniform = [&](auto w) {
    return hn::DemoteTo(df, hn::Mul(hn::Add(hn::ConvertTo(dd, hn::BitCast(di, w)), half), inv32));
  };
  auto store = [&](auto v, T* p) {
    if constexpr (sizeof(T) == 8) hn::StoreU(hn::PromoteTo(dd, v), dd, p);
    else hn::StoreU(v, df, p);
  };
  for (std::size_t g = 0; g < groups; ++g) {
    T* o = out + 32 * g;
    for (std::size_t h = 0; h < 8; h += N) {
      const auto idx = hn::Add(hn::Set(du, 8 * (first + g) + h), hn::Iota(du, 0));
      auto c0 = hn::And(idx, low), c1 = hn::ShiftRight<32>(idx), c2 = vtrial, c3 = vstream;
      for (int r = 0; r < 10; ++r) {
        const auto p0 = MulWide(du, c0, 0xD2511F53u);
        const auto p1 = MulWide(du, c2, 0xCD9E8D57u);
        const auto n0 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p1), c1), hn::Set(du, keys[2 * r]));
        const auto n2 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p0), c3), hn::Set(du, keys[2 * r + 1]));
        c1 = hn::And(p1, low);
        c3 = hn::And(p0, low);
        c0 = n0;
        c2 = n2;
      }
      // Box-Muller in float32 on (c0, c1) and (c2, c3).
      const auto ra = hn::Sqrt(hn::Mul(minus2, hn::Log(df, uniform(c0))));
      const auto ta = hn::Sub(hn::Mul(two_pi, uniform(c1)), pi);
      const auto rb = hn::Sqrt(hn::Mul(minus2, hn::Log(df, uniform(c2))));
      const auto tb = hn::Sub(hn::Mul(two_pi, uniform(c3)), pi);
      store(hn::Mul(ra, hn::Cos(df, ta)), o + h);
      store(hn::Mul(ra, hn::Sin(df, ta)), o + 8 + h);
      store(hn::Mul(rb, hn::Cos(df, tb)), o + 16 + h);
      store(hn::Mul(rb, hn::Sin(df, tb)), o + 24 + h);
    }
  }
}

void FillGroupsF64(const std::uint32_t* keys, std::uint32_t trial, std::uint32_t stream, std::uint64_t first,
                   std::size_t groups, double* out) {
  FillGroups(keys, trial, stream, first, groups, out);
}
void FillGroupsF32(const std::uint32_t* keys, std::uint32_t trial, std::uint32_t stream, std::uint64_t first,
                   std::size_t groups, float* out) {
  FillGroups(keys, trial, stream, first, groups, out);
}

}  // namespace attnscale::lab::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <vector>

#include "attnscale/error.h"
#include "lab/normals.h"

namespace attnscale::lab {
HWY_EXPORT(FillGroupsF64);
HWY_EXPORT(FillGroupsF32);

namespace {

// The ten round keys of Philox4x32-10: (k0, k1) + r·(W0, W1) mod 2^32.
void round_keys(const Stream& s, std::uint32_t* keys) {
  std::uint32_t k0 = s.key()[0], k1 = s.key()[1];
  for (int r = 0; r < 10; ++r) {
    keys[2 * r] = k0;
    keys[2 * r + 1] = k1;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

template <class T, class Fn>
void fill(const Stream& s, std::uint64_t offset, std::int64_t n, T* out, Fn groups_fn) {
  if (offset % kNormalGroup != 0) throw Error("fill_normals: offset must be a multiple of 32");
  if (n <= 0) return;
  std::uint32_t keys[20];
  round_keys(s, keys);
  const std::uint64_t first = offset / kNormalGroup;
  const std::size_t full = static_cast<std::size_t>(n) / kNormalGroup;
  if (full) groups_fn(keys, s.trial(), s.stream(), first, full, out);
  const std::size_t rest = static_cast<std::size_t>(n) - full * kNormalGroup;
  if (rest) {
    T tail[kNormalGroup];
    groups_fn(keys, s.trial(), s.stream(), first + full, 1, tail);
    std::copy(tail, tail + rest, out + full * kNormalGroup);
  }
}

}  // namespace

void fill_normals(const Stream& s, std::uint64_t offset, std::int64_t n, double* out) {
  fill(s, offset, n, out, HWY_DYNAMIC_DISPATCH(FillGroupsF64));
}

void fill_normals(const Stream& s, std::uint64_t offset, std::int64_t n, float* out) {
  fill(s, offset, n, out, HWY_DYNAMIC_DISPATCH(FillGroupsF32));
}

}  // namespace attnscale::lab
#endif  // HWY_ONCE
