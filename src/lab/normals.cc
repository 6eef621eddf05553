// Vectorised Philox4x32-10 + Box-Muller (layout and formulas: normals.h). Highway compiles this
// file once per SIMD target (foreach_target.h re-includes it) and dispatches at run time.
//
// One Philox instance per 32-bit lane (16 per AVX-512 vector); the 32 x 32 -> 64-bit products of a
// round come from MulEven on the even and the odd lanes (MulHiLo).
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

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using VU = hn::Vec<DU>;

// (hi, lo) = m · a for every 32-bit lane: MulEven gives the 64-bit products of the even lanes, and
// of the odd ones once they are shifted down; OddEven puts the halves back in their lanes.
HWY_INLINE void MulHiLo(VU a, std::uint32_t m, VU& hi, VU& lo) {
  const DU du;
#if HWY_TARGET == HWY_SCALAR
  const std::uint64_t p = std::uint64_t{hn::GetLane(a)} * m;
  hi = hn::Set(du, static_cast<std::uint32_t>(p >> 32));
  lo = hn::Set(du, static_cast<std::uint32_t>(p));
#else
  const hn::RepartitionToWide<DU> dw;
  const VU vm = hn::Set(du, m);
  const auto even = hn::MulEven(a, vm);
  const auto odd = hn::MulEven(hn::BitCast(du, hn::ShiftRight<32>(hn::BitCast(dw, a))), vm);
  lo = hn::OddEven(hn::BitCast(du, hn::ShiftLeft<32>(odd)), hn::BitCast(du, even));
  hi = hn::OddEven(hn::BitCast(du, odd), hn::BitCast(du, hn::ShiftRight<32>(even)));
#endif
}

// Groups [first, first + groups) of 64 normals each into out (normals.h: element 64g + 16m + l
// from block 16g + l, output m), float32.
void FillGroups(const std::uint32_t* keys /* 20: (k0, k1) per round */, std::uint32_t trial, std::uint32_t stream,
                std::uint64_t first, std::size_t groups, float* HWY_RESTRICT out) {
  const DF df;
  const DU du;
  const hn::RebindToSigned<DF> di;
  const std::size_t N = hn::Lanes(df);  // 1, 4, 8 or 16: always divides 16
  const VU vtrial = hn::Set(du, trial), vstream = hn::Set(du, stream);
  const auto scale = hn::Set(df, 1.0f / 2147483648.0f), offset = hn::Set(df, 1.0f / 4294967296.0f);
  const auto minus2 = hn::Set(df, -2.0f), two_pi = hn::Set(df, 6.2831853f), pi = hn::Set(df, 3.14159265f);
  // u = (⌊w/2⌋ + 1/2) / 2^31: the 31-bit integer is exact in float32 below 2^24 and rounded above,
  // so u keeps full relative precision near 0 (the Box-Muller radius), never 0, at most 1.
  auto uniform = [&](VU w) { return hn::MulAdd(hn::ConvertTo(df, hn::BitCast(di, hn::ShiftRight<1>(w))), scale, offset); };
  for (std::size_t g = 0; g < groups; ++g) {
    float* o = out + 64 * g;
    const std::uint64_t block0 = 16 * (first + g);  // a multiple of 16: adding lanes never carries past 2^32
    for (std::size_t h = 0; h < 16; h += N) {
      VU c0 = hn::Add(hn::Set(du, static_cast<std::uint32_t>(block0 + h)), hn::Iota(du, 0));
      VU c1 = hn::Set(du, static_cast<std::uint32_t>((block0 + h) >> 32)), c2 = vtrial, c3 = vstream;
      for (int r = 0; r < 10; ++r) {
        VU hi0, lo0, hi1, lo1;
        MulHiLo(c0, 0xD2511F53u, hi0, lo0);
        MulHiLo(c2, 0xCD9E8D57u, hi1, lo1);
        c0 = hn::Xor(hn::Xor(hi1, c1), hn::Set(du, keys[2 * r]));
        c1 = lo1;
        c2 = hn::Xor(hn::Xor(hi0, c3), hn::Set(du, keys[2 * r + 1]));
        c3 = lo0;
      }
      // Box-Muller in float32 on (c0, c1) and (c2, c3).
      const auto ra = hn::Sqrt(hn::Mul(minus2, hn::Log(df, uniform(c0))));
      const auto ta = hn::Sub(hn::Mul(two_pi, uniform(c1)), pi);
      const auto rb = hn::Sqrt(hn::Mul(minus2, hn::Log(df, uniform(c2))));
      const auto tb = hn::Sub(hn::Mul(two_pi, uniform(c3)), pi);
      hn::StoreU(hn::Mul(ra, hn::Cos(df, ta)), df, o + h);
      hn::StoreU(hn::Mul(ra, hn::Sin(df, ta)), df, o + 16 + h);
      hn::StoreU(hn::Mul(rb, hn::Cos(df, tb)), df, o + 32 + h);
      hn::StoreU(hn::Mul(rb, hn::Sin(df, tb)), df, o + 48 + h);
    }
  }
}

}  // namespace attnscale::lab::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <vector>

#include "attnscale/error.h"
#include "lab/normals.h"

namespace attnscale::lab {
HWY_EXPORT(FillGroups);

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

}  // namespace

void fill_normals(const Stream& s, std::uint64_t offset, std::int64_t n, float* out) {
  if (offset % kNormalGroup != 0) throw Error("fill_normals: offset must be a multiple of 64");
  if (n <= 0) return;
  std::uint32_t keys[20];
  round_keys(s, keys);
  const std::uint64_t first = offset / kNormalGroup;
  const std::size_t full = static_cast<std::size_t>(n) / kNormalGroup;
  if (full) HWY_DYNAMIC_DISPATCH(FillGroups)(keys, s.trial(), s.stream(), first, full, out);
  const std::size_t rest = static_cast<std::size_t>(n) - full * kNormalGroup;
  if (rest) {
    float tail[kNormalGroup];
    HWY_DYNAMIC_DISPATCH(FillGroups)(keys, s.trial(), s.stream(), first + full, 1, tail);
    std::copy(tail, tail + rest, out + full * kNormalGroup);
  }
}

void fill_normals(const Stream& s, std::uint64_t offset, std::int64_t n, double* out) {
  // The float32 numbers widened, through a small buffer.
  float buf[16 * kNormalGroup];
  for (std::int64_t done = 0; done < n; done += 16 * kNormalGroup) {
    const std::int64_t m = std::min<std::int64_t>(16 * kNormalGroup, n - done);
    fill_normals(s, offset + static_cast<std::uint64_t>(done), m, buf);
    std::copy(buf, buf + m, out + done);
  }
}

}  // namespace attnscale::lab
#endif  // HWY_ONCE
