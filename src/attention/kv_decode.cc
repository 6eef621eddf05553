// decode() over a KV cache (attnscale/kv_cache.h): validation, the layouts, threads and the merge.
//
// Work items are (sequence, KV head, chunk of kChunk keys by position). An item walks its keys in
// tiles of kTile: it looks up the tile's key and value rows (contiguous: a stride; paged: the block
// table), computes the scores of all the KV head's query rows at once (each row of K read once for
// the group; float32 rows on 16-lane targets without lane sums, kv::scores_paired), runs the online softmax (s folded into Q, scores in natural units) and updates its partial
// (o, m, l). Partials are merged per (sequence, head) in chunk order:
//   M = max_c m_c;  o = Σ_c e^(m_c − M) o_c;  l = Σ_c e^(m_c − M) l_c;  out = o / l.
// With one query row per KV head (no GQA group) the item instead streams its keys
// (kv::stream_row): a key's (float32, int8: eight or four keys') scores, the online-softmax step, and the
// output update by those keys' V rows, so that K and V stream side by side (2 threads, d = 128,
// Nkv = 65536: bf16 K/V 10.7-11.7 ms per token with tiles, 6.2-6.8 this way; docs/performance.md).
// The chunks are fixed by key position and the arithmetic does not see addresses, so the result is
// the same for any thread count and for a paged or contiguous cache holding the same keys.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attention/kernels.h"
#include "attention/lse_merge.h"
#include "attention/kv_kernels.h"
#include "attention/tiles.h"
#include "attnscale/error.h"
#include "attnscale/kv_cache.h"
#include "common/parallel.h"

namespace attnscale {
namespace detail {
namespace {

constexpr std::int64_t kChunk = 1024;  // keys per work item
constexpr std::int64_t kTile = 32;     // keys per tile (a row of scores is two 16-lane vectors)
constexpr std::int64_t kSub = 8;       // keys per kernel call within a tile (see attend_chunk)
constexpr std::int64_t kPairedRows = 2;  // GQA groups from this size take kv::scores_paired
constexpr std::int64_t kAhead = 1;     // tiles whose rows are prefetched ahead of the one computed

// One of k / v: where row (b, h, j) lives, and its scales for int8.
struct Rows {
  const char* data = nullptr;
  std::int64_t esize = 4;
  std::int64_t s0 = 0, s1 = 0, s2 = 0;  // element strides of the three leading dimensions
  const float* scales = nullptr;
  std::int64_t c0 = 0, c1 = 0, c2 = 0;  // the scales' strides
};

struct Layout {
  int type = kv::kF32;
  std::int64_t B = 0, Hq = 0, Hkv = 0, dk = 0, dv = 0, max_len = 0;
  Rows k, v;
  bool paged = false;
  std::int64_t block_size = 0;
  const std::int32_t* table = nullptr;
  std::int64_t t0 = 0, t1 = 0;
  const std::int32_t* lens = nullptr;
  std::int64_t lens_stride = 0;
  std::int64_t window_left = -1;
  double scale = 1.0;

  std::int64_t group() const { return Hq / Hkv; }
  std::int64_t length(std::int64_t b) const { return lens ? lens[b * lens_stride] : max_len; }
  // The keys sequence b's query sees: [lo, hi).
  std::int64_t lo(std::int64_t b) const {
    return window_left >= 0 ? std::max<std::int64_t>(0, length(b) - 1 - window_left) : 0;
  }
  // Leading indices of key j of (b, h): contiguous (b, h, j); paged (block, j % block_size, h).
  void index(std::int64_t b, std::int64_t h, std::int64_t j, std::int64_t& i0, std::int64_t& i1, std::int64_t& i2) const {
    if (!paged) {
      i0 = b, i1 = h, i2 = j;
    } else {
      i0 = table[b * t0 + (j / block_size) * t1], i1 = j % block_size, i2 = h;
    }
  }
};

void fail(const std::string& msg) { throw Error("decode: " + msg); }

int element_type(DType t) {
  switch (t) {
    case DType::f32: return kv::kF32;
    case DType::bf16: return kv::kBF16;
    case DType::i8: return kv::kI8;
    default: return -1;
  }
}

Rows rows_of(const char* name, const TensorView& t, const TensorView& scales, std::int64_t d, bool int8) {
  Rows r;
  r.data = static_cast<const char*>(t.data);
  r.esize = static_cast<std::int64_t>(dtype_size(t.dtype));
  r.s0 = t.strides[0], r.s1 = t.strides[1], r.s2 = t.strides[2];
  if (t.strides[3] != 1 && d > 1) fail(std::string(name) + ": the last dimension must be contiguous (stride 1)");
  if (int8) {
    const std::string sn = std::string(name) + "_scales";
    if (scales.empty()) fail(sn + ": required for an int8 cache");
    if (scales.dtype != DType::f32) fail(sn + ": expected float32, got " + std::string(dtype_name(scales.dtype)));
    if (scales.rank != 4 || scales.shape[0] != t.shape[0] || scales.shape[1] != t.shape[1] ||
        scales.shape[2] != t.shape[2] || scales.shape[3] != d / 32)
      fail(sn + ": expected shape [" + std::to_string(t.shape[0]) + ", " + std::to_string(t.shape[1]) + ", " +
           std::to_string(t.shape[2]) + ", " + std::to_string(d / 32) + "], got " + scales.shape_str());
    if (scales.strides[3] != 1 && d / 32 > 1) fail(sn + ": the last dimension must be contiguous (stride 1)");
    r.scales = static_cast<const float*>(scales.data);
    r.c0 = scales.strides[0], r.c1 = scales.strides[1], r.c2 = scales.strides[2];
  } else if (!scales.empty()) {
    fail(std::string(name) + "_scales: given for a " + std::string(dtype_name(t.dtype)) + " cache (int8 only)");
  }
  return r;
}

Layout make_layout(const TensorView& q, const KVCache& c, const TensorView& out, const TensorView& lse,
                   const DecodeOptions& o) {
  Layout L;
  if (q.rank != 3) fail("q: expected [B, Hq, dk], got " + q.shape_str());
  if (q.dtype != DType::f32) fail("q: expected float32, got " + std::string(dtype_name(q.dtype)));
  if (c.k.rank != 4 || c.v.rank != 4) fail("k, v: expected rank 4, got k " + c.k.shape_str() + ", v " + c.v.shape_str());
  if (c.k.dtype != c.v.dtype) fail("k, v: different dtypes");
  L.type = element_type(c.k.dtype);
  if (L.type < 0) fail("k: dtype " + std::string(dtype_name(c.k.dtype)) + " (expected float32, bfloat16 or int8)");
  L.paged = !c.block_table.empty();
  L.B = q.shape[0], L.Hq = q.shape[1], L.dk = q.shape[2];
  L.Hkv = L.paged ? c.k.shape[2] : c.k.shape[1];
  L.dv = c.v.shape[3];
  if (c.k.shape[3] != L.dk) fail("k: last dimension " + std::to_string(c.k.shape[3]) + " != q's dk " + std::to_string(L.dk));
  if (L.dk == 0 || L.dv == 0 || L.Hkv == 0) fail("k, v: empty head dimension or head count");
  for (int d = 0; d < 3; ++d)
    if (c.v.shape[d] != c.k.shape[d]) fail("v: shape " + c.v.shape_str() + " does not match k's " + c.k.shape_str());
  if (L.Hq % L.Hkv != 0)
    fail("q: " + std::to_string(L.Hq) + " heads is not a multiple of the cache's " + std::to_string(L.Hkv) + " KV heads");
  const bool int8 = L.type == kv::kI8;
  if (int8 && (L.dk % 32 != 0 || L.dv % 32 != 0))
    fail("k, v: int8 caches need head dimensions that are multiples of 32 (got " + std::to_string(L.dk) + ", " +
         std::to_string(L.dv) + ")");
  L.k = rows_of("k", c.k, c.k_scales, L.dk, int8);
  L.v = rows_of("v", c.v, c.v_scales, L.dv, int8);
  if (!c.seq_lens.empty()) {
    if (c.seq_lens.dtype != DType::i32 || c.seq_lens.rank != 1 || c.seq_lens.shape[0] != L.B)
      fail("seq_lens: expected int32 [" + std::to_string(L.B) + "], got " + std::string(dtype_name(c.seq_lens.dtype)) +
           " " + c.seq_lens.shape_str());
    L.lens = static_cast<const std::int32_t*>(c.seq_lens.data);
    L.lens_stride = c.seq_lens.strides[0];
  }
  if (L.paged) {
    const TensorView& t = c.block_table;
    if (t.dtype != DType::i32 || t.rank != 2 || t.shape[0] != L.B)
      fail("block_table: expected int32 [" + std::to_string(L.B) + ", max_blocks], got " +
           std::string(dtype_name(t.dtype)) + " " + t.shape_str());
    if (!L.lens) fail("seq_lens: required with a block_table");
    L.block_size = c.k.shape[1];
    L.table = static_cast<const std::int32_t*>(t.data);
    L.t0 = t.strides[0], L.t1 = t.strides[1];
    const std::int64_t blocks = c.k.shape[0];
    for (std::int64_t b = 0; b < L.B; ++b) {
      const std::int64_t len = L.length(b);
      if (len < 0 || len > t.shape[1] * L.block_size)
        fail("seq_lens[" + std::to_string(b) + "] = " + std::to_string(len) + " does not fit in " +
             std::to_string(t.shape[1]) + " blocks of " + std::to_string(L.block_size));
      for (std::int64_t i = 0; i * L.block_size < len; ++i) {
        const std::int64_t blk = L.table[b * L.t0 + i * L.t1];
        if (blk < 0 || blk >= blocks)
          fail("block_table[" + std::to_string(b) + "][" + std::to_string(i) + "] = " + std::to_string(blk) +
               " is not a block of the cache (0.." + std::to_string(blocks - 1) + ")");
      }
      L.max_len = std::max(L.max_len, len);
    }
  } else {
    if (c.k.shape[0] != L.B) fail("k: batch " + std::to_string(c.k.shape[0]) + " != q's " + std::to_string(L.B));
    const std::int64_t n = c.k.shape[2];
    for (std::int64_t b = 0; L.lens && b < L.B; ++b)
      if (L.lens[b * L.lens_stride] < 0 || L.lens[b * L.lens_stride] > n)
        fail("seq_lens[" + std::to_string(b) + "] = " + std::to_string(L.lens[b * L.lens_stride]) + " is outside 0.." +
             std::to_string(n));
    L.max_len = n;
    if (L.lens) {
      L.max_len = 0;
      for (std::int64_t b = 0; b < L.B; ++b) L.max_len = std::max<std::int64_t>(L.max_len, L.length(b));
    }
  }
  if (out.rank != 3 || out.shape[0] != L.B || out.shape[1] != L.Hq || out.shape[2] != L.dv || out.dtype != DType::f32)
    fail("out: expected float32 [" + std::to_string(L.B) + ", " + std::to_string(L.Hq) + ", " + std::to_string(L.dv) +
         "], got " + std::string(dtype_name(out.dtype)) + " " + out.shape_str());
  if (!lse.empty() && (lse.rank != 2 || lse.shape[0] != L.B || lse.shape[1] != L.Hq ||
                       (lse.dtype != DType::f32 && lse.dtype != DType::f64)))
    fail("lse: expected float32 or float64 [" + std::to_string(L.B) + ", " + std::to_string(L.Hq) + "], got " +
         std::string(dtype_name(lse.dtype)) + " " + lse.shape_str());
  if (o.window_left < -1) fail("window_left: expected -1 (none) or >= 0, got " + std::to_string(o.window_left));
  L.window_left = o.window_left;
  L.scale = o.scale.resolve(L.dk);
  return L;
}

struct Scratch {
  std::vector<float> q, qp, s, o, m, l, alpha;
  std::vector<const void*> krow, vrow;
  std::vector<const float*> ksc, vsc;
  explicit Scratch(const Layout& L)
      : q(L.group() * L.dk), qp(kv::paired_size(L.group(), L.dk)), s(L.group() * kTile), o(L.group() * L.dv), m(L.group()), l(L.group()),
        alpha(L.group()), krow((kAhead + 1) * kTile), vrow((kAhead + 1) * kTile), ksc((kAhead + 1) * kTile),
        vsc((kAhead + 1) * kTile) {}
};

// The partial (o, m, l) of the group's rows over keys [j0, j1) of (b, kh), left in s.
void attend_chunk(const Layout& L, const TensorView& q, std::int64_t b, std::int64_t kh, std::int64_t j0,
                  std::int64_t j1, Scratch& s) {
  const std::int64_t g = L.group();
  const float f = static_cast<float>(L.scale);
  for (std::int64_t r = 0; r < g; ++r) {
    const float* src = static_cast<const float*>(q.data) + b * q.strides[0] + (kh * g + r) * q.strides[1];
    for (std::int64_t c = 0; c < L.dk; ++c) s.q[r * L.dk + c] = src[c * q.strides[2]] * f;
  }
  // GQA over float32 rows on 16-lane targets: the scores without lane sums (kv::scores_paired).
  const bool paired = g >= kPairedRows && L.type == kv::kF32 && kv::paired_available();
  if (paired) kv::pack_pairs(g, L.dk, s.q.data(), L.dk, s.qp.data());
  std::fill(s.m.begin(), s.m.end(), -std::numeric_limits<float>::infinity());
  std::fill(s.l.begin(), s.l.end(), 0.0f);
  std::fill(s.o.begin(), s.o.end(), 0.0f);
  const bool int8 = L.type == kv::kI8;
  // The row pointers of tile [t0, t0 + kTile) into pointer set `set`. The next tile's rows are
  // prefetched while this one is computed (below), so that the K and V streams overlap the
  // arithmetic, and the scattered rows of a paged cache (blocks in any order, a [.., block, Hkv, d]
  // pool whose rows of one head are Hkv·d apart) arrive in time.
  const std::int64_t kbytes = L.dk * L.k.esize, vbytes = L.dv * L.v.esize;
  auto prefetch_rows = [](const void* const* rows, std::int64_t n, std::int64_t bytes) {
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t c = 0; c < bytes; c += 64) __builtin_prefetch(static_cast<const char*>(rows[j]) + c, 0, 2);
  };
  auto gather = [&](std::int64_t t0, std::int64_t set) {
    const std::int64_t nk = std::min(kTile, j1 - t0);
    const void** kr = s.krow.data() + set * kTile;
    const void** vr = s.vrow.data() + set * kTile;
    const float** ksc = s.ksc.data() + set * kTile;
    const float** vsc = s.vsc.data() + set * kTile;
    if (!L.paged) {  // one stride per row
      const char* k = L.k.data + (b * L.k.s0 + kh * L.k.s1 + t0 * L.k.s2) * L.k.esize;
      const char* v = L.v.data + (b * L.v.s0 + kh * L.v.s1 + t0 * L.v.s2) * L.v.esize;
      for (std::int64_t j = 0; j < nk; ++j) {
        kr[j] = k + j * L.k.s2 * L.k.esize;
        vr[j] = v + j * L.v.s2 * L.v.esize;
      }
      if (int8)
        for (std::int64_t j = 0; j < nk; ++j) {
          ksc[j] = L.k.scales + b * L.k.c0 + kh * L.k.c1 + (t0 + j) * L.k.c2;
          vsc[j] = L.v.scales + b * L.v.c0 + kh * L.v.c1 + (t0 + j) * L.v.c2;
        }
      return;
    }
    for (std::int64_t j = 0; j < nk; ++j) {
      std::int64_t i0, i1, i2;
      L.index(b, kh, t0 + j, i0, i1, i2);
      kr[j] = L.k.data + (i0 * L.k.s0 + i1 * L.k.s1 + i2 * L.k.s2) * L.k.esize;
      vr[j] = L.v.data + (i0 * L.v.s0 + i1 * L.v.s1 + i2 * L.v.s2) * L.v.esize;
      if (int8) {
        ksc[j] = L.k.scales + i0 * L.k.c0 + i1 * L.k.c1 + i2 * L.k.c2;
        vsc[j] = L.v.scales + i0 * L.v.c0 + i1 * L.v.c1 + i2 * L.v.c2;
      }
    }
  };
  // Tiles go round a ring of kAhead + 1 pointer sets: while tile i is computed, tile i + kAhead's
  // rows are looked up and prefetched, its K rows spread over tile i's sub-tiles of scores (one
  // query row: K and V rows over the sub-tiles of stream_row), so that the fetch runs beside the
  // arithmetic rather than in a burst that stalls on the full miss queue; its V rows (GQA) before
  // tile i's P·V. The first kAhead tiles are prefetched up front.
  // One query row over a contiguous bf16 cache is left to the hardware prefetcher: there the
  // prefetch slowed it (H = 8, d = 128, Nkv = 65536: 8.7-8.8 ms against 6.2-6.7); float32 and
  // int8 rows gain from it (docs/performance.md).
  const std::int64_t ahead = kAhead, sets = ahead + 1;
  const bool prefetch = g > 1 || L.paged || L.type != kv::kBF16;
  const std::int64_t tiles = (j1 - j0 + kTile - 1) / kTile;
  auto tile_keys = [&](std::int64_t i) { return i < tiles ? std::min(kTile, j1 - j0 - i * kTile) : 0; };
  for (std::int64_t i = 0; i < std::min(ahead, tiles); ++i) {
    gather(j0 + i * kTile, i % sets);
    if (prefetch) {
      prefetch_rows(s.krow.data() + (i % sets) * kTile, tile_keys(i), kbytes);
      prefetch_rows(s.vrow.data() + (i % sets) * kTile, tile_keys(i), vbytes);
    }
  }
  for (std::int64_t i = 0; i < tiles; ++i) {
    const std::int64_t t0 = j0 + i * kTile, nk = tile_keys(i), next = tile_keys(i + ahead);
    const std::int64_t x = (i % sets) * kTile, y = ((i + ahead) % sets) * kTile;
    if (next) gather(t0 + ahead * kTile, (i + ahead) % sets);
    if (g == 1) {  // one row: each key's K row read beside its V row (kv_kernels.h, stream_row)
      for (std::int64_t a = 0; a < nk; a += kSub) {
        if (a < next && prefetch) {
          prefetch_rows(s.krow.data() + y + a, std::min(kSub, next - a), kbytes);
          prefetch_rows(s.vrow.data() + y + a, std::min(kSub, next - a), vbytes);
        }
        kv::stream_row(L.type, std::min(kSub, nk - a), L.dk, L.dv, s.krow.data() + x + a,
                       int8 ? s.ksc.data() + x + a : nullptr, s.vrow.data() + x + a,
                       int8 ? s.vsc.data() + x + a : nullptr, s.q.data(), s.m.data(), s.l.data(), s.o.data());
      }
      continue;
    }
    for (std::int64_t a = 0; a < nk; a += kSub) {
      const std::int64_t n = std::min(kSub, nk - a);
      if (a < next) prefetch_rows(s.krow.data() + y + a, std::min(kSub, next - a), kbytes);
      if (paired) kv::scores_paired(n, g, L.dk, s.krow.data() + x + a, s.qp.data(), s.s.data() + a, kTile);
      else
        kv::scores(L.type, n, g, L.dk, s.krow.data() + x + a, int8 ? s.ksc.data() + x + a : nullptr, s.q.data(),
                   L.dk, s.s.data() + a, kTile);
    }
    simd::softmax_update_rows(s.s.data(), kTile, g, nk, s.m.data(), s.l.data(), s.alpha.data());
    // P·V in one call over the tile, after the prefetch of the next tile's V rows: each call
    // loads, rescales and stores the group's output rows, which per 8-key call cost more than the
    // spread prefetch gained (Hq = 32, Hkv = 4, d = 128, Nkv = 65536: 11.7-12.5 ms -> 10.9-11.2).
    if (next) prefetch_rows(s.vrow.data() + y, next, vbytes);
    kv::accumulate(L.type, nk, g, L.dv, s.vrow.data() + x, int8 ? s.vsc.data() + x : nullptr, s.s.data(), kTile,
                   s.alpha.data(), s.o.data(), L.dv);
  }
}

}  // namespace
}  // namespace detail

void decode(const TensorView& q, const KVCache& cache, const TensorView& out, const TensorView& lse,
            const DecodeOptions& options) {
  using namespace detail;
  const Layout L = make_layout(q, cache, out, lse, options);
  simd::init_target_from_env();
  const std::int64_t g = L.group(), heads = L.B * L.Hkv, chunks = std::max<std::int64_t>(1, (L.max_len + kChunk - 1) / kChunk);
  const std::int64_t items = heads * chunks;
  std::vector<float> po(items * g * L.dv), pm(items * g), pl(items * g);
  const int threads = resolve_threads(options.threads, items);
  PerThread<Scratch> scratch(threads);
  parallel_for(items, 1, threads, [&](std::int64_t i0, std::int64_t i1, int t) {
    Scratch& s = scratch.get(t, L);
    for (std::int64_t item = i0; item < i1; ++item) {
      const std::int64_t head = item / chunks, c = item % chunks, b = head / L.Hkv, kh = head % L.Hkv;
      const std::int64_t j0 = std::max(c * kChunk, L.lo(b)), j1 = std::min((c + 1) * kChunk, L.length(b));
      float* m = pm.data() + item * g;
      float* l = pl.data() + item * g;
      if (j0 >= j1) {  // a chunk the sequence does not reach, or before its window
        std::fill(m, m + g, -std::numeric_limits<float>::infinity());
        std::fill(l, l + g, 0.0f);
        continue;
      }
      attend_chunk(L, q, b, kh, j0, j1, s);
      std::copy(s.o.begin(), s.o.end(), po.data() + item * g * L.dv);
      std::copy(s.m.begin(), s.m.end(), m);
      std::copy(s.l.begin(), s.l.end(), l);
    }
  });
  // Merge in chunk order, then out = o / l and lse = M + ln l.
  std::vector<float> o(L.dv);
  for (std::int64_t head = 0; head < heads; ++head) {
    const std::int64_t b = head / L.Hkv, kh = head % L.Hkv;
    for (std::int64_t r = 0; r < g; ++r) {
      const auto slot = [&](std::int64_t c) { return (head * chunks + c) * g + r; };
      float M, l;
      detail::merge_row<float>(
          chunks, L.dv, [](float x) { return std::exp(x); }, [&](std::int64_t c) { return pm[slot(c)]; },
          [&](std::int64_t c) { return pl[slot(c)]; },
          [&](std::int64_t c, std::int64_t d) { return po[slot(c) * L.dv + d]; }, M, l, o.data());
      const std::int64_t h = kh * g + r;
      float* dst = static_cast<float*>(out.data) + b * out.strides[0] + h * out.strides[1];
      const float inv = l == 0.0f ? 0.0f : 1.0f / l;
      for (std::int64_t d = 0; d < L.dv; ++d) dst[d * out.strides[2]] = o[d] * inv;
      if (!lse.empty()) {
        const double v = l == 0.0f ? -INFINITY : static_cast<double>(M) + std::log(static_cast<double>(l));
        void* p = static_cast<char*>(lse.data) + (b * lse.strides[0] + h * lse.strides[1]) *
                                                     static_cast<std::int64_t>(dtype_size(lse.dtype));
        if (lse.dtype == DType::f32) *static_cast<float*>(p) = static_cast<float>(v);
        else *static_cast<double*>(p) = v;
      }
    }
  }
}

}  // namespace attnscale
