// ALiBi's term on the scores, written once for every path (score_transforms.h's transform_scores
// for the forward, backward and reference; the cache decode's tiles and one-row stream).
#pragma once
#include <cstdint>
#include <cstdlib>

namespace attnscale::detail {

// One query row's scores of n consecutive keys, s[x·stride] for x < n:
//   s −= slope·|d0 − x|,  d0 = the row's diagonal (its own key) counted from the first of them.
// I is the integer type of the distances: int32 where the positions fit (decode's keys are int32
// positions), so that the loop vectorises on every x86 target.
template <class T, class I>
inline void subtract_alibi(T* s, I n, std::int64_t stride, T slope, I d0) {
  for (I x = 0; x < n; ++x) s[x * stride] -= slope * static_cast<T>(std::abs(d0 - x));
}

}  // namespace attnscale::detail
