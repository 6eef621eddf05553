// The LSE merge: one softmax row from partial results over disjoint key chunks. The decode paths
// (decode.cc, kv_decode.cc) merge their key chunks with it (unnormalised partials) and
// merge_partials() the public (out, lse) pairs (normalised), through which the ring attention of
// distributed.h merges too. Every user works in base e today; the base is a parameter.
//
// Chunk c holds m_c (its largest score, or its lse), l_c = Σ_j b^(s_j − m_c) (0: the chunk saw
// no key of this row) and o_c = Σ_j b^(s_j − m_c) v_j. With M = max_c m_c (for stability, as in
// the softmax itself), the whole row has
//   l = Σ_c b^(m_c − M) l_c,   o = Σ_c b^(m_c − M) o_c,   out = o / l,   lse = M + log_b l.
// A normalised pair (out_c, lse_c) is the chunk (m_c, l_c, o_c) = (lse_c, 1, out_c) in base e:
// its l_c is 1 because b^(s_j − lse_c) sums to 1 over the chunk's keys. Chunks are visited in
// order, so the result does not depend on threads.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

namespace attnscale::detail {

// Writes M to `m`, l to `l` and o to o[0, dv). m_of(c), l_of(c) and o_of(c, d) read chunk c;
// pow(x) is b^x. When no chunk saw a key, M = −inf, l = 0 and o = 0.
template <class T, class Pow, class MOf, class LOf, class OOf>
void merge_row(std::int64_t chunks, std::int64_t dv, Pow pow, MOf m_of, LOf l_of, OOf o_of, T& m, T& l, T* o) {
  m = -std::numeric_limits<T>::infinity();
  for (std::int64_t c = 0; c < chunks; ++c) m = std::max<T>(m, m_of(c));
  const T use = m == -std::numeric_limits<T>::infinity() ? T(0) : m;  // every chunk empty
  std::fill(o, o + dv, T(0));
  l = 0;
  for (std::int64_t c = 0; c < chunks; ++c) {
    const T lc = l_of(c);
    if (lc == T(0)) continue;  // a chunk the row saw no key of
    const T w = pow(m_of(c) - use);
    l += w * lc;
    for (std::int64_t d = 0; d < dv; ++d) o[d] += w * o_of(c, d);
  }
}

}  // namespace attnscale::detail
