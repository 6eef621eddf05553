// Decode: a few query rows against many keys (generation with a KV cache). Blocks of kBr rows
// would leave threads idle, so the keys are split instead: every (batch, KV head) gathers all of
// its query heads' rows into one block (K and V are read once for the whole group), the keys go
// in fixed chunks of kDecodeChunk to the threads, and each chunk's partial (o, m, l) is merged in
// chunk order (see merge.cc for the math). The chunking depends on the shape only, so the result
// is the same for any thread count.
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "attention/flash_forward.h"
#include "attention/forward_scratch.h"
#include "attention/lse_merge.h"
#include "attnscale/kv_cache.h"
#include "common/parallel.h"

namespace attnscale::detail {

inline constexpr std::int64_t kDecodeChunk = 1024;
inline constexpr std::int64_t kDecodeRows = 16;
// Query rows a head up to which the cache decode beats the tiled forward over long keys: its rows
// of a KV head go through the keys together, each key read once, where the forward's blocks of
// 64 rows read them once a block and leave threads idle at B = 1 (float32, d = 128, Hq = 32 over
// Hkv = 4 or 8: Nq = 4..32 0.23-0.62 of the forward's time at Nkv = 65536, 0.31-0.75 at 4096;
// Nq = 64 0.95-1.13, 128 0.93-1.12; docs/performance.md).
inline constexpr std::int64_t kCacheRows = 32;

// Whether a call the cache decode can express should take it. Over 2·kDecodeChunk keys or more:
// up to kCacheRows rows a head. Over fewer, where the tiles' fixed costs per block weigh more but
// a KV head's rows are one work item (its keys one chunk), the limits measured (1-2047 keys, B = 1
// to 16, Hq / Hkv = 8/8, 32/8, 8/1, d = 64 and 128, causal and not; docs/performance.md): bfloat16
// up to 128 rows a KV head (0.2-0.6 of the bf16 tiles' time; 256 rows of one head were slower),
// float32 up to 4 rows a head and 32 a KV head (0.35-0.75; 16 rows of one head over 33 keys took
// 1.4x the tiles' time without a causal mask). That holds down to one key at d = 64 and 128: over
// 1-15 keys the route took 0.46-0.86 of the tiles' time in float32 and 0.17-0.70 in bfloat16. Not
// for small heads over so few keys, where the route's fixed cost shows: float32, Nq = 1, 1 or 4
// keys, B = 1 or 4, H = 1 or 8: d = 4 and 16 1.01-1.42x the tiles' time (0.58 against 0.83 µs at
// B = H = 1, d = 4), d = 32 0.87-1.18x, d = 64 0.79-0.97x.
constexpr std::int64_t kShortKeys = 16, kShortKeysMinDk = 64;
bool cache_route_pays(const ForwardShape& s) {
  if (s.Nq > kCacheRows || s.Nkv < 1 || (s.Nkv < kShortKeys && s.dk < kShortKeysMinDk)) return false;
  if (s.Nkv >= 2 * kDecodeChunk) return true;
  const std::int64_t rows = s.Nq * s.group();
  return s.dtype == DType::bf16 ? rows <= 128 : s.Nq <= 4 && rows <= 32;
}

bool uses_split_decode(const ForwardShape& s) {
  return s.Nq * s.group() <= kDecodeRows && s.Nkv >= 2 * kDecodeChunk && !s.probs;
}

bool use_decode(const Params& p) { return uses_split_decode(forward_shape(p)); }

bool may_decode(const Params& p) {
  const ForwardShape s = forward_shape(p);
  return uses_split_decode(s) || cache_route_pays(s);
}

// A few query rows a head and no explicit mask, float32 or bfloat16: the cache decode of kv_decode.cc
// over the contiguous K and V, whose kernels read each key row once for all of a KV head's query rows with
// them in registers. One row: its visible keys [lo, hi) (causal and window masks) are a cache of
// length hi with a window of hi − 1 − lo keys before the last. Several: row i is new token i of a
// cache of len keys, at key len − Nq + i, when that key is its diagonal diag(i) = i + diag_offset:
//   causal (or a right window of 0)  len = diag_offset + Nq, row i sees keys up to diag(i)
//   otherwise                        len = Nkv, every row sees every key or those up to its right
//                                    window; windows and ALiBi then need diag(i) = Nkv − Nq + i
//                                    (bottom-right)
// and a left window counts back from the diagonal in both. Every Params field that changes the
// result must either be passed on here or exclude this route.
bool cache_route_may_take(const ForwardShape& s) {
  return cache_route_pays(s) && !s.probs && !s.mask && !s.sinks && !s.dropout &&
         (s.dtype == DType::f32 || s.dtype == DType::bf16);
}

bool cache_decode(const Params& p) {
  if (!cache_route_may_take(forward_shape(p)) || p.k.strides[3] != 1 || p.v.strides[3] != 1 || p.k.shape[0] != p.B || p.v.shape[0] != p.B ||
      p.Nkv >= std::numeric_limits<std::int32_t>::max())
    return false;
  DecodeOptions o;
  std::int64_t len = 0;
  if (p.Nq == 1) {
    const KeyRange range = key_range(p, 0);
    // The cache decode puts ALiBi's diagonal at the last key it sees.
    if (!p.alibi.empty() && range.hi > range.lo && p.diag_offset() != range.hi - 1) return false;
    len = range.hi > range.lo ? range.hi : 0;  // no visible key: an empty cache
    o.window_left = range.hi > range.lo ? range.hi - 1 - range.lo : -1;
  } else {
    const std::int64_t off = p.diag_offset();
    o.causal = p.causal || p.window_right == 0;
    if (o.causal) {
      len = off + p.Nq;
      if (len > p.Nkv) return false;  // rows past the keys (top-left, Nq > Nkv)
    } else {
      len = p.Nkv;
      if ((p.window_left >= 0 || p.window_right >= 0 || !p.alibi.empty()) && off != p.Nkv - p.Nq) return false;
      o.window_right = p.window_right;
    }
    o.window_left = p.window_left;
  }
  std::vector<std::int32_t> lens(static_cast<std::size_t>(p.B), static_cast<std::int32_t>(len));
  KVCache cache;
  cache.k = p.k;
  cache.v = p.v;
  cache.seq_lens = TensorView::strided(lens.data(), DType::i32, {p.B}, {1});
  o.scale = Scale::value(p.scale);
  o.threads = p.threads;
  o.softcap = p.softcap;
  o.alibi_slopes = p.alibi;  // [B, Hq] (a stride of 0 for slopes given per head)
  // q [B, Hq, Nq, dk], out [B, Hq, Nq, dv], lse [B, Hq, Nq]: float32 (lse also float64) in place,
  // bfloat16 through float32 copies (a bfloat16 cache is read as stored).
  Buffer<float> qf, of, lf;  // uninitialised: every element is written before it is read
  const auto as_f32 = [](const TensorView& t, Buffer<float>& buf, std::initializer_list<std::int64_t> shape) {
    buf = Buffer<float>(t.numel());
    return TensorView::contiguous(buf.get(), DType::f32, shape);
  };
  TensorView q = p.q, out = p.out, lse = p.lse;
  if (q.dtype != DType::f32) convert(p.q, q = as_f32(p.q, qf, {p.B, p.Hq, p.Nq, p.dk}));
  if (out.dtype != DType::f32) out = as_f32(p.out, of, {p.B, p.Hq, p.Nq, p.dv});
  if (!lse.empty() && lse.dtype != DType::f32 && lse.dtype != DType::f64) lse = as_f32(p.lse, lf, {p.B, p.Hq, p.Nq});
  decode(q, cache, out, lse, o);
  if (out.data != p.out.data) convert(out, p.out);
  if (lse.data != p.lse.data) convert(lse, p.lse);
  return true;
}

// decode_all's allocations below: its work items' threads' ForwardScratch, every item's partial
// (o, m, l) and, while they are merged, each merging thread's rows (o, m, l).
double split_decode_scratch_bytes(const ForwardShape& s) {
  const std::int64_t rows = s.Nq * s.group(), chunks = (s.Nkv + kDecodeChunk - 1) / kDecodeChunk;
  const std::int64_t heads = s.B * s.Hkv, items = heads * chunks;
  const bool f64 = s.dtype == DType::f64;
  const double size = f64 ? 8 : 4, partial = static_cast<double>(rows * (s.dv + 2)) * size;
  const double scratch = static_cast<double>(f64 ? ForwardScratch<double>::bytes(s.dk, s.dv)
                                                 : ForwardScratch<float>::bytes(s.dk, s.dv));
  return resolve_threads(s.threads, items) * scratch + static_cast<double>(items) * partial +
         resolve_threads(s.threads, heads) * partial;
}

template <class T>
void decode_all(const Params& p) {
  const std::int64_t rows = p.Nq * p.group(), chunks = (p.Nkv + kDecodeChunk - 1) / kDecodeChunk;
  const std::int64_t heads = p.B * p.Hkv, items = heads * chunks;
  Buffer<T> po(items * rows * p.dv), pm(items * rows), pl(items * rows);
  auto block = [&](std::int64_t head) {
    RowBlock rb;
    rb.b = head / p.Hkv;
    rb.kh = head % p.Hkv;
    for (std::int64_t h = rb.kh * p.group(); h < (rb.kh + 1) * p.group(); ++h)
      for (std::int64_t i = 0; i < p.Nq; ++i) rb.add(p, h, i);
    return rb;
  };
  const int threads = resolve_threads(p.threads, items);
  PerThread<ForwardScratch<T>> scratch(threads);
  parallel_for(items, 1, threads, [&](std::int64_t i0, std::int64_t i1, int t) {
    ForwardScratch<T>& s = scratch.get(t, p);
    for (std::int64_t item = i0; item < i1; ++item) {
      const RowBlock rb = block(item / chunks);
      const std::int64_t c = item % chunks;
      attend(p, rb, c * kDecodeChunk, std::min(p.Nkv, (c + 1) * kDecodeChunk), s);
      std::copy(s.o.get(), s.o.get() + rows * p.dv, po.get() + item * rows * p.dv);
      std::copy(s.m.get(), s.m.get() + rows, pm.get() + item * rows);
      std::copy(s.l.get(), s.l.get() + rows, pl.get() + item * rows);
    }
  });
  // The chunks' partials merged in chunk order, base e (lse_merge.h).
  parallel_for(heads, 1, resolve_threads(p.threads, heads), [&](std::int64_t h0, std::int64_t h1, int) {
    std::vector<T> o(rows * p.dv), m(rows), l(rows);
    for (std::int64_t head = h0; head < h1; ++head) {
      const RowBlock rb = block(head);
      for (std::int64_t r = 0; r < rows; ++r) {
        const auto slot = [&](std::int64_t c) { return (head * chunks + c) * rows + r; };
        merge_row<T>(
            chunks, p.dv, [](T x) { return std::exp(x); }, [&](std::int64_t c) { return pm[slot(c)]; },
            [&](std::int64_t c) { return pl[slot(c)]; },
            [&](std::int64_t c, std::int64_t d) { return po[slot(c) * p.dv + d]; }, m[r], l[r], o.data() + r * p.dv);
      }
      if (!p.sinks.empty()) fold_sinks(p, rb, o.data(), m.data(), l.data());
      write_rows(p, rb, o.data(), m.data(), l.data());
    }
  });
}

template void decode_all<float>(const Params&);
template void decode_all<double>(const Params&);

}  // namespace attnscale::detail
