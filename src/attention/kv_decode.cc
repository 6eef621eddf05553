// decode() over a KV cache (attnscale/kv_cache.h): validation, the layouts, threads and the merge.
//
// Work items are (sequence, KV head, chunk of chunk_keys() keys by position). An item walks its keys in
// tiles of kTile: it looks up the tile's key and value rows (contiguous: a stride; paged: the block
// table), computes the scores of all the KV head's query rows at once (each row of K read once for
// the group; on 16- and 8-lane targets without lane sums, kv::scores_quads, int8 rows widened first,
// and bf16 and float16 rows too where the target does not read them in place), runs the online
// softmax (s folded into Q, scores in natural units) and updates its partial (o, m, l). Partials
// are merged per (sequence, head) in chunk order:
//   M = max_c m_c;  o = Σ_c e^(m_c − M) o_c;  l = Σ_c e^(m_c − M) l_c;  out = o / l
// (a call of one chunk: each item writes out = o / l itself, on its thread).
// With one query row per KV head (no GQA group) the item instead streams its keys
// (kv::stream_row_strided): tiles of 16 keys, each tile's scores, online-softmax step and output
// update, the next tile's K rows read between the tile's V rows so that K and V stream side by
// side; a call (a chunk) prefetches ahead itself (docs/performance.md).
// A paged cache's KV heads go through a chunk side by side (its blocks hold the heads' rows of a
// key together), and so do those of a contiguous cache stored [B, Nkv, Hkv, d] (FlashAttention's
// layout, passed as a [B, Hkv, Nkv, d] view; one head at a time, its rows Hkv rows apart, read at
// 0.4-0.6 of the rate): GQA's a tile each in turn, one query row a head all heads' rows of a key
// at once (kv::stream_heads, with the one-row stream's arithmetic). The chunks are fixed by key
// position and the arithmetic does not see addresses or the order of the heads, so the result is the same for any
// thread count and for a paged or contiguous cache (either order of its dimensions) holding the
// same keys.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attention/alibi.h"
#include "attention/bf16_kernels.h"
#include "attention/kernels.h"
#include "attention/lse_merge.h"
#include "attention/params.h"
#include "attention/kv_bf16_dot.h"
#include "attention/kv_kernels.h"
#include "attention/tiles.h"
#include "attnscale/error.h"
#include "attnscale/kv_cache.h"
#include "common/number_text.h"
#include "common/parallel.h"
#include "common/prefetch.h"

namespace attnscale {
namespace detail {
namespace {

// Keys per work item: the largest power of two in [kMinChunk, kMaxChunk] that leaves at least
// kMinItems items (sequence, KV head, chunk) and, for a paged cache whose KV heads go together,
// kMinRuns (sequence, chunk) units, so that threads still share the work evenly. Longer chunks
// cost less per key: each starts its prefetches anew and adds a partial to the merge (Hq = 32,
// Hkv = 4, d = 128, Nkv = 65536: 1024 keys 5.5 ms, 4096 5.2; docs/performance.md). The size
// follows from the shapes alone, never from the thread count or the layout, so the result does not
// either.
constexpr std::int64_t kMinChunk = 1024, kMaxChunk = 8192, kMinItems = 64, kMinRuns = 16;
std::int64_t chunk_keys(std::int64_t B, std::int64_t Hkv, std::int64_t max_len) {
  std::int64_t c = kMinChunk;
  for (; c < kMaxChunk; c *= 2) {
    const std::int64_t chunks = (max_len + 2 * c - 1) / (2 * c);  // with chunks of 2c
    if (B * Hkv * chunks < kMinItems || B * chunks < kMinRuns) break;
  }
  return c;
}
constexpr std::int64_t kTile = kv::kTileKeys;  // keys per tile (a row of scores is four 16-lane vectors)
constexpr std::int64_t kSub = 8;       // keys per kernel call within a tile (see Chunk::step)
// Bytes of K and V a one-query-row stream prefetches ahead: kv::stream_row_strided over a contiguous
// cache (kStreamAheadBytes), kv::stream_heads over a paged one (kPagedAheadBytes, Chunk::step_heads).
constexpr std::int64_t kStreamAheadBytes = 16384, kPagedAheadBytes = 131072;
constexpr std::int64_t kQuadRows = 2;  // GQA groups from this size take kv::scores_quads
constexpr std::int64_t kAhead = 1;     // tiles whose rows are prefetched ahead of the one computed
constexpr double kOneThreadBytes = 32 << 10;  // K and V bytes below which a call runs on one thread
// K and V bytes up to which a call's rows count as cache-resident (Chunk's near_f32_).
constexpr double kNearBytes = 16 << 20;

// One of k / v: where row (b, h, j) lives, and its scales for int8.
struct Rows {
  const char* data = nullptr;
  std::int64_t esize = 4;
  std::int64_t s0 = 0, s1 = 0, s2 = 0;  // element strides of the three leading dimensions
  const float* scales = nullptr;
  std::int64_t c0 = 0, c1 = 0, c2 = 0;  // the scales' strides

  // A contiguous cache's row j of (b, h), its scales, and the bytes from one row to the next.
  const char* row(std::int64_t b, std::int64_t h, std::int64_t j) const {
    return data + (b * s0 + h * s1 + j * s2) * esize;
  }
  const float* scale(std::int64_t b, std::int64_t h, std::int64_t j) const { return scales + b * c0 + h * c1 + j * c2; }
  std::int64_t row_bytes() const { return s2 * esize; }
};

struct Layout {
  int type = kv::kF32;
  std::int64_t B = 0, Hq = 0, Hkv = 0, dk = 0, dv = 0, max_len = 0;
  Rows k, v;
  bool paged = false;
  // The KV heads of a key go through a chunk side by side (decode()): their rows lie together, in
  // a paged cache's blocks or in a contiguous cache laid out [B, Nkv, Hkv, d] (FlashAttention's),
  // seen as [B, Hkv, Nkv, d] through strides.
  bool together = false;
  // Together, and each key's rows of the KV heads one run of memory (head stride d): what the heads'
  // steps prefetch is then the next tile's runs, split between them (Chunk::step).
  bool runs = false;
  std::int64_t block_size = 0;
  const std::int32_t* table = nullptr;
  std::int64_t t0 = 0, t1 = 0;
  const std::int32_t* lens = nullptr;
  std::int64_t lens_stride = 0;
  const std::int32_t* starts = nullptr;  // seq_starts, or null: every sequence from key 0
  std::int64_t starts_stride = 0;
  std::int64_t window_left = -1, window_right = -1;
  // Query rows per query head: the sequence's last Nq keys are its new tokens, row i at key
  // position len − Nq + i (Nq = 1: the last key), seeing keys up to its own when causal, else up to
  // window_right after it (−1: to the sequence's end).
  std::int64_t Nq = 1;
  bool causal = true;
  double scale = 1.0;
  // Score transforms (DecodeOptions): t = c·tanh(x / c) − slope_bh·|p_i − j| on new token i's score
  // x of key j, p_i = position(b, i) its own key. slopes: B·Hq of them, or empty.
  double softcap = 0.0;
  std::vector<float> slopes;
  // DecodeOptions::compute = bf16 over a bf16 cache: GQA's products may take bf16 operands
  // (kv_bf16_dot.h; Chunk::dot_ says where they do).
  bool bf16_products = false;

  std::int64_t group() const { return Hq / Hkv; }
  // KV heads a work unit takes side by side (decode()): all of a sequence's where together.
  std::int64_t lockstep() const { return together ? Hkv : 1; }
  // Whether the heads of a unit feed the next tile's runs between them (Chunk::step) rather than
  // each its own rows.
  bool split_runs() const { return lockstep() > 1 && runs; }
  // The query rows of one KV head: row r = hl·Nq + i is new token i of query head kh·group + hl.
  std::int64_t rows() const { return group() * Nq; }
  bool transforms() const { return softcap > 0.0 || !slopes.empty(); }
  // Bytes of K and V a call reads at most (every sequence as long as the longest).
  double bytes() const {
    return static_cast<double>(B * Hkv) * static_cast<double>(max_len) *
           static_cast<double>(dk * k.esize + dv * v.esize);
  }
  std::int64_t length(std::int64_t b) const { return lens ? lens[b * lens_stride] : max_len; }
  std::int64_t start(std::int64_t b) const { return starts ? starts[b * starts_stride] : 0; }
  // New token i's key position, and the keys it sees: [lo, hi), from its start (or its window's
  // first key, if later) to its own key (causal), window_right keys past it, or the sequence's last.
  // Rows of higher i see keys at least as late, so row 0's lo and row Nq − 1's hi bound them all.
  std::int64_t position(std::int64_t b, std::int64_t i) const { return length(b) - Nq + i; }
  std::int64_t lo(std::int64_t b, std::int64_t i = 0) const {
    return std::max<std::int64_t>(start(b), window_left >= 0 ? position(b, i) - window_left : 0);
  }
  std::int64_t hi(std::int64_t b, std::int64_t i) const {
    if (causal) return position(b, i) + 1;
    return window_right >= 0 ? std::min(length(b), position(b, i) + 1 + window_right) : length(b);
  }
};

void fail(const std::string& msg) { throw Error("decode: " + msg); }

int element_type(DType t) {
  switch (t) {
    case DType::f32: return kv::kF32;
    case DType::bf16: return kv::kBF16;
    case DType::f16: return kv::kF16;
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
  // q, k, v and out are required; the other views are optional, absent where their data is null.
  for (const auto& [name, t] : {std::pair{"q", &q}, {"k", &c.k}, {"v", &c.v}, {"out", &out}})
    if (t->data == nullptr) fail(std::string(name) + ": missing (null data pointer)");
  if (q.rank != 3 && q.rank != 4) fail("q: expected [B, Hq, dk] or [B, Hq, Nq, dk], got " + q.shape_str());
  if (q.dtype != DType::f32) fail("q: expected float32, got " + std::string(dtype_name(q.dtype)));
  if (c.k.rank != 4 || c.v.rank != 4) fail("k, v: expected rank 4, got k " + c.k.shape_str() + ", v " + c.v.shape_str());
  if (c.k.dtype != c.v.dtype) fail("k, v: different dtypes");
  L.type = element_type(c.k.dtype);
  if (L.type < 0) fail("k: dtype " + std::string(dtype_name(c.k.dtype)) + " (expected float32, bfloat16, float16 or int8)");
  L.paged = !c.block_table.empty();
  L.B = q.shape[0], L.Hq = q.shape[1], L.dk = q.shape[q.rank - 1];
  L.Nq = q.rank == 4 ? q.shape[2] : 1;
  if (L.Nq < 1) fail("q: no query row (Nq = 0)");
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
  L.together = L.paged || (L.Hkv > 1 && L.k.s1 < L.k.s2 && L.v.s1 < L.v.s2);
  L.runs = L.together && (L.paged ? L.k.s2 == L.dk && L.v.s2 == L.dv : L.k.s1 == L.dk && L.v.s1 == L.dv);
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
      if (len < 0) fail("seq_lens[" + std::to_string(b) + "] = " + std::to_string(len) + ": a length must be >= 0");
      if (len > t.shape[1] * L.block_size)
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
  if (!c.seq_starts.empty()) {
    if (c.seq_starts.dtype != DType::i32 || c.seq_starts.rank != 1 || c.seq_starts.shape[0] != L.B)
      fail("seq_starts: expected int32 [" + std::to_string(L.B) + "], got " +
           std::string(dtype_name(c.seq_starts.dtype)) + " " + c.seq_starts.shape_str());
    L.starts = static_cast<const std::int32_t*>(c.seq_starts.data);
    L.starts_stride = c.seq_starts.strides[0];
    for (std::int64_t b = 0; b < L.B; ++b)
      if (L.start(b) < 0 || L.start(b) > L.length(b))
        fail("seq_starts[" + std::to_string(b) + "] = " + std::to_string(L.start(b)) + " is outside 0.." +
             std::to_string(L.length(b)) + ", the sequence's keys");
  }
  // out and lse: q's rank ([B, Hq, dv] and [B, Hq] for one row a head, else with Nq after Hq).
  const auto rows = [&] { return q.rank == 4 ? ", " + std::to_string(L.Nq) : std::string(); };  // for a message only
  if (out.rank != q.rank || out.shape[0] != L.B || out.shape[1] != L.Hq || out.shape[q.rank - 1] != L.dv ||
      (q.rank == 4 && out.shape[2] != L.Nq) || out.dtype != DType::f32)
    fail("out: expected float32 [" + std::to_string(L.B) + ", " + std::to_string(L.Hq) + rows() + ", " +
         std::to_string(L.dv) + "], got " + std::string(dtype_name(out.dtype)) + " " + out.shape_str());
  if (!lse.empty() && (lse.rank != q.rank - 1 || lse.shape[0] != L.B || lse.shape[1] != L.Hq ||
                       (q.rank == 4 && lse.shape[2] != L.Nq) || (lse.dtype != DType::f32 && lse.dtype != DType::f64)))
    fail("lse: expected float32 or float64 [" + std::to_string(L.B) + ", " + std::to_string(L.Hq) + rows() +
         "], got " + std::string(dtype_name(lse.dtype)) + " " + lse.shape_str());
  try {
    require_disjoint({{"out", &out}, {"lse", &lse}});
  } catch (const Error& e) {
    fail(e.what());
  }
  if (o.window_left < -1) fail("window_left: expected -1 (none) or >= 0, got " + std::to_string(o.window_left));
  if (o.window_right < -1 || (o.causal && o.window_right > 0))
    fail("window_right: expected -1 (none) or >= 0, and -1 or 0 when causal, got " + std::to_string(o.window_right) +
         (o.causal ? " with causal" : ""));
  if (o.threads < 0) fail("threads: must be >= 0, got " + std::to_string(o.threads));
  if (!(o.softcap >= 0.0) || !std::isfinite(o.softcap))
    fail("softcap: must be a finite number >= 0 (0: off), got " + number_text(o.softcap));
  L.softcap = o.softcap;
  if (!o.alibi_slopes.empty()) {
    const TensorView a = check_per_head("alibi_slopes", o.alibi_slopes, L.Hq, L.B);
    L.slopes.resize(static_cast<std::size_t>(L.B * L.Hq));
    for (std::int64_t b = 0; b < L.B; ++b)
      for (std::int64_t h = 0; h < L.Hq; ++h) {
        const std::int64_t e = (a.rank == 2 ? b * a.strides[0] : 0) + h * a.strides[a.rank - 1];
        L.slopes[b * L.Hq + h] = static_cast<float>(
            load(a, static_cast<const char*>(a.data) + e * static_cast<std::int64_t>(dtype_size(a.dtype))));
      }
  }
  L.window_left = o.window_left;
  L.causal = o.causal;
  L.window_right = o.window_right;
  L.scale = o.scale.resolve(L.dk);
  L.bf16_products = o.compute == Compute::bf16 && L.type == kv::kBF16;
  return L;
}

struct Scratch {
  std::vector<float> q, qp, s, o, m, l, alpha, kf;  // kf: K rows widened to float32 (a call's worth)
  std::vector<float> vf;                            // vf: a tile's int8 V rows widened (widens_values)
  std::vector<std::uint16_t> qb;                    // the rows packed for the bf16 scores (bf16_products)
  kv::bf16dot::AmxOperands amx;                     // the bf16 products' operands on AMX (bf16_products)
  std::vector<const void*> krow, vrow, kfrow, vfrow;
  std::vector<const float*> ksc, vsc;
  // Whether GQA's scores take K rows widened into kf (Chunk): int8 rows, and bf16 and float16 rows
  // where the target does not read them in place (kv::rows_in_place).
  static bool widens(const Layout& L) {
    return L.rows() >= kQuadRows && kv::quads_available() && L.type != kv::kF32 &&
           (L.type == kv::kI8 || !kv::rows_in_place());
  }
  // Whether P·V takes a tile's int8 V rows widened into vf first (Chunk::accumulate): where the
  // group has more rows than kv::accumulate() takes in one pass over a V row, which would widen
  // each V row once per block of rows, unless kv::accumulate() widens each V vector once itself
  // (kv::values_in_panels(): AVX2, a column block of the tile at a time into a panel that stays in
  // L1; int8 GQA 32/4 there 0.95 of the time of the widened tile in cache, docs/performance.md).
  // Widened once, with its block's scale as LoadRow does, the float32 P·V multiplies the same
  // values in the same order: the same bits. (The widened tile, before the panels, on Zen 3, AVX2,
  // Hq = 32, Hkv = 4, d = 128, processes alternated, one thread: Nkv = 65536 23.1 against 25.1 ms,
  // Nkv = 2048 0.716-0.719 against 0.783-0.793 ms; two threads from DRAM 12.0-12.7 against
  // 12.4-12.8. bf16 rows, whose widening is one shift, were slower so: 22.4-22.7 against 20.7-22.2.)
  static bool widens_values(const Layout& L) {
    return L.type == kv::kI8 && widens(L) && static_cast<std::size_t>(L.rows()) > kv::accumulate_row_block() &&
           !kv::values_in_panels();
  }
  static std::size_t vf_size(const Layout& L) {
    return widens_values(L) ? kTile * static_cast<std::size_t>(L.dv) : 0;
  }
  // Whether the scores widen K rows a key group at a time themselves (kv::scores_quads_widening,
  // 8-lane targets), into kf, rather than take rows widened into kf kv::widened_keys() at a time.
  static bool widens_in_scores(const Layout& L) { return widens(L) && !kv::rows_in_place(); }
  // Floats of kf: kv::widened_keys() rows of dk where the scores take widened rows, or the
  // scores' own buffer.
  static std::size_t kf_size(const Layout& L) {
    const auto dk = static_cast<std::size_t>(L.dk);
    return !widens(L) ? 0 : widens_in_scores(L) ? kv::widening_buffer(dk) : kv::widened_keys() * dk;
  }
  explicit Scratch(const Layout& L)
      : q(L.rows() * L.dk), qp(kv::quads_size(L.rows(), L.dk)), s(L.rows() * kTile), o(L.rows() * L.dv),
        m(L.rows()), l(L.rows()), alpha(L.rows()), kf(kf_size(L)),
        vf(vf_size(L)), qb(qb_size(L)),
        amx(L.bf16_products ? kv::bf16dot::AmxOperands(L.rows(), L.dk, L.dv) : kv::bf16dot::AmxOperands()),
        krow(kRows), vrow(kRows), kfrow(kf.empty() || widens_in_scores(L) ? 0 : kv::widened_keys()),
        vfrow(vf.empty() ? 0 : kTile), ksc(kRows), vsc(kRows) {
    for (std::size_t j = 0; j < kfrow.size(); ++j) kfrow[j] = kf.data() + j * L.dk;  // kf's rows (not copied)
    for (std::size_t j = 0; j < vfrow.size(); ++j) vfrow[j] = vf.data() + j * L.dv;
  }
  // Row pointers: a ring of kAhead + 1 tiles (a whole chunk, below, needs none).
  static constexpr std::size_t kRows = (kAhead + 1) * kTile;
  // One query row over a contiguous cache: a chunk is one kv::stream_row_strided call, rows at a
  // stride from the chunk's first (no pointers gathered), which prefetches ahead itself and
  // overlaps one tile's V rows with the next tile's K rows.
  static bool whole_chunk(const Layout& L) { return L.rows() == 1 && !L.together; }
  static std::size_t qb_size(const Layout& L) {
    return L.bf16_products ? kv::bf16dot::packed_size(L.rows(), L.dk) : 0;
  }
  // Whether it was built for a layout of L's sizes (then it serves L as well): its rows (m; s, l
  // and alpha follow), dk and dv. (Sizes that only match in product do not do: 16 rows of dk = 64
  // fill q, o and qp as 8 rows of 128 do, and once ran past m.)
  bool fits(const Layout& L) const {
    return m.size() == static_cast<std::size_t>(L.rows()) && q.size() == static_cast<std::size_t>(L.rows() * L.dk) &&
           qp.size() == kv::quads_size(L.rows(), L.dk) &&
           o.size() == static_cast<std::size_t>(L.rows() * L.dv) &&
           kf.size() == kf_size(L) && vf.size() == vf_size(L) &&
           qb.size() == qb_size(L) &&
           (L.bf16_products ? amx.fits(L.rows(), L.dk, L.dv) : amx.fits(0, 0, 0));
  }

  Scratch(const Scratch&) = delete;  // kfrow points into kf
  Scratch(Scratch&&) = default;      // moves keep kf's buffer
};

// The partial (o, m, l) of the group's rows over keys [j0, j1) of (b, kh), left in s, computed a
// tile at a time (step) so that the KV heads of a paged cache can go in lockstep (decode()).
class Chunk {
 public:
  // What follows from the layout alone, the same for every chunk.
  Chunk(const Layout& L, Scratch& s)
      : L_(L), s_(s), g_(L.rows()), group_(L.group()), kbytes_(L.dk * L.k.esize), vbytes_(L.dv * L.v.esize),
        int8_(L.type == kv::kI8), whole_(Scratch::whole_chunk(L)) {
    // GQA on 16- and 8-lane targets: the scores without lane sums (kv::scores_quads), bf16 and
    // int8 K rows widened to float32 first, a tile at a time (Hq = 32, Hkv = 4, d = 128: int8
    // Nkv = 1024 0.37 -> 0.12-0.17 ms, Nkv = 65536 11.5-11.7 -> 8.5-10.2; bf16, with the rows fed
    // as below, Nkv = 4096 0.33-0.34 -> 0.30 ms, 65536 5.9-6.5 -> 4.6-4.7 ms; AVX2, one thread,
    // against its lane-sum scores: float32 0.47-0.66 of the time, bf16 0.69, int8 0.76).
    quads_ = g_ >= kQuadRows && kv::quads_available();
    // bf16 and float16 rows are read in place on AVX-512, not widened (kv_kernels.h). Calls
    // alternated in one process, two threads, d = 128, time against the widened tile: bf16
    // Hq = 32, Hkv = 8, Nkv = 4096 0.73, 65536 0.82-0.99; Hq = 32, Hkv = 4, 4096 0.81, 65536 0.83;
    // float16 0.80 and 0.99 with Hkv = 8, 0.88 and 0.93 with Hkv = 4 (the same bits: its conversion
    // costs about what the widening did once the rows come from DRAM; docs/performance.md).
    in_place_ = quads_ && L.type != kv::kF32 && !Scratch::widens(L);
    // Float32 rows of a call whose K and V lie in cache (up to kNearBytes) are scored as widened
    // rows are, in the oct layout for groups of up to 4 rows (kv::QuadRows::f32_near): one
    // broadcast of a key's 8 columns feeds two multiply-adds where a quad feeds one. From DRAM
    // that was 3-5% slower than the quads (an Intel Xeon, GQA 32/8, d = 128, Nkv = 65536, two
    // threads, processes alternated: 17.5-17.8 against 16.8-17.0 ms; on Zen 5 3-4%), in cache
    // faster: Nkv = 64, one thread 12.9-13.1 against 14.5-14.8 µs, 512 keys (two threads)
    // 61.3-61.7 against 64.7-65.4 µs, 2048 keys 317-319 against 323-325 µs
    // (docs/performance.md, "2026-12-05, 15:48"). The rule follows from the call's sizes alone, so
    // every layout and thread count gives the same bits.
    near_f32_ = quads_ && L.type == kv::kF32 && L.bytes() <= kNearBytes;
    // Keys a call of the scores (step()): fed rows a whole tile (the call's setup and epilogue paid
    // once: float32 in L1 54 -> 46 cycles a key, Hq/Hkv = 8, d = 128; bf16 from DRAM 2-3% faster),
    // rows widened first kv::widened_keys() (the widened rows stay in L1), others a sub-tile of
    // kSub keys, their prefetch bursts between the calls.
    scores_keys_ = !quads_ ? kSub : Scratch::widens(L) ? static_cast<std::int64_t>(kv::widened_keys()) : kTile;
    // compute = bf16 over a bf16 cache: scores and P·V by vdpbf16ps (kv_bf16_dot.h) on the rows in
    // place, where the CPU has it and the rows split into its steps (8 columns of K, 32 of V); on
    // AMX tiles where the bf16 product path is AMX (below).
    dot_ = in_place_ && L.bf16_products && L.dk % 8 == 0 && L.dv % 32 == 0 && kv::bf16dot::available();
    // Where the bf16 products' path is AMX, on its tiles (kv::bf16dot::AmxOperands; decode() holds
    // a bfdot::TileScope on each thread), O's columns permuted until finish().
    amx_ = dot_ && kv::bf16dot::amx();
    // Float32 rows of more than 64 values: the hardware prefetcher keeps up with K rows read in
    // order by one query row, and a software prefetch of them slowed the one-row stream by 10-15%
    // (docs/performance.md). GQA's rows of the next tile (quad scores) are fed, a line or two
    // per step of the kernels' inner loops (LineFeed), K rows by the scores and V rows by P·V: a
    // tile's prefetches in one burst stalled the core until the misses drained, so that arithmetic
    // and memory added up (float32, Hq = 32, Hkv = 4, d = 128, Nkv = 65536: 8.2-8.6 -> 6.2-6.3 ms;
    // cache-resident, Nkv = 4096, 0.27 -> 0.29 ms). int8 rows are fed too since the quad scores
    // (2-4% faster than their bursts).
    const bool wide_f32 = L.type == kv::kF32 && L.dk + L.dv > 128;
    prefetch_k_ = !wide_f32;
    v_level_ = wide_f32 ? CacheLevel::near : CacheLevel::far;
    // The quad paths' scores feed their own tile's V rows (step(), v_first) unless the KV heads go
    // side by side over runs; begin() then leaves tile 0's V rows to that feed. Asked for in one
    // burst there as well, they stalled a short call (an Intel Xeon, GQA 32/8, d = 128, one
    // thread, processes alternated: Nkv = 64 float32 22.2-22.7 against 23.8-24.3 µs, bf16
    // 21.3-22.3 against 23.0-23.4; from DRAM, 32/4 over 65536 keys, the same within 2%;
    // docs/performance.md, "2026-12-05, 13:32").
    v_fed_ = quads_ && !L.split_runs();
    // One query row: kv::stream_row_strided prefetches, into the first-level cache, the rows of the keys
    // that lie kStreamAheadBytes of K and V (int8: counting their scales) past those it computes, in
    // whole groups of four keys; wide float32 rows go without (neither K nor V rows gained from it,
    // contiguous or paged). 16 KiB against 8 KiB, calls alternated in one process (H = 8,
    // Nkv = 65536, two threads, four runs): int8 d = 128 1.02-1.06 of a copy against 0.98-1.00;
    // int8 d = 64, a paged int8 cache and K and V in cache the same (docs/performance.md).
    const std::int64_t key_bytes = kbytes_ + vbytes_ + (int8_ ? 4 * (L.dk + L.dv) / 32 : 0);
    stream_ahead_ = wide_f32 ? 0 : std::max<std::int64_t>(4, (kStreamAheadBytes / key_bytes + 3) / 4 * 4);
  }

  void begin(const TensorView& q, std::int64_t b, std::int64_t kh, std::int64_t j0, std::int64_t j1) {
    b_ = b, kh_ = kh, j0_ = j0, j1_ = j1, i_ = 0;
    const float f = static_cast<float>(L_.scale);
    for (std::int64_t r = 0; r < g_; ++r) {  // q: [B, Hq, Nq, dk] (decode())
      const float* src = static_cast<const float*>(q.data) + b * q.strides[0] +
                         (kh * group_ + r / L_.Nq) * q.strides[1] + r % L_.Nq * q.strides[2];
      // By vectors where the row is contiguous (the same products): element by element the rows
      // took about 2% of a short call (GQA 32/8, 64 keys, bf16 in cache, one thread).
      if (q.strides[3] == 1) simd::scaled_copy(src, f, s_.q.data() + r * L_.dk, static_cast<std::size_t>(L_.dk));
      else for (std::int64_t c = 0; c < L_.dk; ++c) s_.q[r * L_.dk + c] = src[c * q.strides[3]] * f;
    }
    if (amx_) s_.amx.pack(s_.q.data(), L_.dk);
    else if (dot_) kv::bf16dot::pack(g_, L_.dk, s_.q.data(), L_.dk, s_.qb.data());
    else if (quads_) kv::pack_quads(g_, L_.dk, s_.q.data(), L_.dk, s_.qp.data(), in_place_ && L_.type == kv::kBF16);
    std::fill(s_.m.begin(), s_.m.end(), -std::numeric_limits<float>::infinity());
    std::fill(s_.l.begin(), s_.l.end(), 0.0f);
    std::fill(s_.o.begin(), s_.o.end(), 0.0f);
    if (whole_) {
      tiles_ = 1;
      return;
    }
    tiles_ = (j1 - j0 + kTile - 1) / kTile;
    for (std::int64_t i = 0; i < std::min(kAhead, tiles_); ++i) {
      gather(j0 + i * kTile, tile_keys(i), (i % kSets) * kTile);
      if (prefetch_k_) prefetch_rows(s_.krow.data() + (i % kSets) * kTile, tile_keys(i), kbytes_);
      if (!v_fed_) prefetch_rows(s_.vrow.data() + (i % kSets) * kTile, tile_keys(i), vbytes_, v_level_);
    }
  }
  bool done() const { return i_ >= tiles_; }
  // The chunk's o in place once done (the AMX products leave its columns permuted).
  void finish() {
    if (amx_) s_.amx.unpermute(static_cast<std::size_t>(g_), s_.o.data(), static_cast<std::size_t>(L_.dv));
  }

  // The K and V row pointers of the tile this chunk's next step() computes, and its keys (0 when
  // done); GQA's tiles (a ring of pointer sets) only.
  struct TileRows {
    const void* const* k;
    const void* const* v;
    std::int64_t n;
  };
  TileRows upcoming() const {
    const std::int64_t at = (i_ % kSets) * kTile;
    return {s_.krow.data() + at, s_.vrow.data() + at, tile_keys(i_)};
  }

  // A whole chunk (one query row, contiguous cache) is one stream_row_strided call (one query row,
  // heads together: step_heads). Otherwise tiles go round a ring of kAhead + 1 pointer sets: while
  // tile i is computed, tile i + kAhead's rows are looked up and prefetched, GQA with quad
  // scores: the rows a line or two per step of the kernels' inner loops (LineFeed: this tile's V
  // rows by the scores, the next tile's K rows by P·V; below), on others a
  // sub-tile's worth before each sub-tile of scores, so that the fetch runs beside the
  // arithmetic rather than in a burst that stalls on the full miss queue (docs/performance.md).
  // The first kAhead tiles are prefetched by begin().
  // With the KV heads of a chunk side by side (decode()), `first` is head 0's chunk, this one head
  // `head` of `heads`. Where a key's rows of all heads are one run of memory (Layout::runs), GQA's
  // steps feed the next tile's runs in address order, head x the x-th of `heads` parts of the keys
  // (head 0's rows are the runs' starts), rather than each head its own next tile: that one is a
  // stride through the same runs, which the heads after it then read again (FlashAttention's cache
  // layout, Hq = 32, Hkv = 4, d = 128: float32 0.77-0.86, bf16 0.90-0.93, int8 0.93 of the time;
  // docs/performance.md, "FlashAttention's cache layout").
  void step(const Chunk* first = nullptr, std::int64_t head = 0, std::int64_t heads = 1) {
    Scratch& s = s_;
    const bool int8 = int8_;
    if (whole_) {
      i_ = tiles_;
      const Rows &k = L_.k, &v = L_.v;
      const kv::RowTransform tf = row_transform(j0_);
      kv::stream_row_strided(L_.type, static_cast<std::size_t>(j1_ - j0_), L_.dk, L_.dv, k.row(b_, kh_, j0_),
                             k.row_bytes(), int8 ? k.scale(b_, kh_, j0_) : nullptr, k.c2, v.row(b_, kh_, j0_),
                             v.row_bytes(), int8 ? v.scale(b_, kh_, j0_) : nullptr, v.c2, s.q.data(), s.m.data(),
                             s.l.data(), s.o.data(), static_cast<std::size_t>(stream_ahead_),
                             L_.transforms() ? &tf : nullptr);
      return;
    }
    const std::int64_t i = i_++, g = g_;
    const std::int64_t t0 = j0_ + i * kTile, nk = tile_keys(i), next = tile_keys(i + kAhead);
    const std::int64_t x = (i % kSets) * kTile, y = ((i + kAhead) % kSets) * kTile;
    if (next) gather(t0 + kAhead * kTile, next, y);
    // The next tile's rows (its own, or its part of all heads' runs), each `fk` (`fv`) bytes long:
    // what this step feeds, with this tile's V rows (below). Head 0 has gathered its next tile by
    // now (it steps first).
    TileRows f = upcoming();  // tile i + 1, at y
    std::int64_t fk = kbytes_, fv = vbytes_;
    // The quad paths' feeds: the scores feed this tile's V rows and P·V the next tile's K rows, so
    // that each arrives in L1 about one phase before it is read. Fed the other way (the scores the
    // next tile's K, P·V its V), L1 (48 KiB here) had to hold a tile's V from the P·V before it
    // through the scores, beside the K they read and the next K they fed (32 KiB each at float32,
    // d = 128). Time against that, calls alternated in one process, two threads, Hq = 32, Hkv = 4
    // unless said: d = 128, Nkv = 65536: float32 0.937-0.974, bf16 0.963, float16 0.907-0.924;
    // d = 64, Nkv = 131072: float32 0.86-0.90 (one run of three 1.03), bf16 0.889; d = 256 0.942;
    // Hq = 8, Hkv = 1, Nkv = 262144: 0.944; Hkv = 8: 0.979. int8 (its K rows widened first), a
    // paged cache and K and V in cache: 0.98-1.02 (docs/performance.md). Runs of all heads side by
    // side keep the old order: their feed is a part of the next tile's runs.
    const bool v_first = !(first && L_.split_runs());
    if (!v_first) {
      const TileRows all = first->upcoming();
      const std::int64_t part = (all.n + heads - 1) / heads, from = std::min(all.n, head * part);
      f = {all.k + from, all.v + from, std::min(part, all.n - from)};
      fk *= heads, fv *= heads;
    }
    const std::int64_t sub = scores_keys_;  // keys a call (the constructor)
    for (std::int64_t a = 0; a < nk; a += sub) {
      const std::int64_t n = std::min(sub, nk - a);
      const std::int64_t ahead = a < f.n ? std::min(sub, f.n - a) : 0;  // rows of the tile computed next
      if (quads_) {  // float32 rows, and bf16 and float16 rows in_place_, as they are; others widened into kf
        const void* const* rows = s.krow.data() + x + a;
        const kv::QuadRows form = L_.type == kv::kF32  ? (near_f32_ ? kv::QuadRows::f32_near : kv::QuadRows::f32)
                                  : !in_place_           ? kv::QuadRows::widened
                                  : L_.type == kv::kBF16 ? kv::QuadRows::bf16
                                                         : kv::QuadRows::f16;
        LineFeed feed = v_first ? LineFeed(s.vrow.data() + x + a, n, vbytes_) : LineFeed(f.k + a, ahead, fk);
        if (form == kv::QuadRows::widened && s.kfrow.empty()) {  // Scratch::widens_in_scores
          kv::scores_quads_widening(L_.type, n, g, L_.dk, rows, int8 ? s.ksc.data() + x + a : nullptr,
                                    s.qp.data(), s.s.data() + a, kTile, feed, s.kf.data());
          feed.rest();
          continue;
        }
        if (form == kv::QuadRows::widened) {
          kv::widen(L_.type, n, L_.dk, rows, int8 ? s.ksc.data() + x + a : nullptr, s.kf.data(), L_.dk);
          rows = s.kfrow.data();
        }
        if (amx_) s.amx.scores(n, rows, s.s.data() + a, kTile, feed);
        else if (dot_) kv::bf16dot::scores(n, g, L_.dk, rows, s.qb.data(), s.s.data() + a, kTile, feed);
        else kv::scores_quads(n, g, L_.dk, rows, s.qp.data(), s.s.data() + a, kTile, feed, form);
        feed.rest();
      } else {
        if (prefetch_k_) prefetch_rows(f.k + a, ahead, fk);
        prefetch_rows(f.v + a, ahead, fv, v_level_);
        kv::scores(L_.type, n, g, L_.dk, s.krow.data() + x + a, int8 ? s.ksc.data() + x + a : nullptr, s.q.data(),
                   L_.dk, s.s.data() + a, kTile);
      }
    }
    if (L_.transforms()) transform(t0, nk);
    if (L_.Nq > 1) mask_rows(t0, nk);
    simd::softmax_update_rows(s.s.data(), kTile, g, nk, s.m.data(), s.l.data(), s.alpha.data());
    // P·V in one call over the tile: each call loads, rescales and stores the group's output rows,
    // which per 8-key call cost more than it gained (Hq = 32, Hkv = 4, d = 128, Nkv = 65536).
    LineFeed feed = !quads_ ? LineFeed() : v_first ? LineFeed(f.k, f.n, fk) : LineFeed(f.v, f.n, fv);
    if (L_.Nq > 1 && hidden_value_not_finite(t0, nk, x))
      accumulate_visible(t0, nk, x);
    else
      accumulate(0, nk, 0, g, x, feed);
    feed.rest();
  }

  // O[r] = alpha[r]·O[r] + Σ_j P[r][j]·V_j over the tile's keys [x0, x0 + nk) for rows [r0, r0 + rows).
  void accumulate(std::int64_t x0, std::int64_t nk, std::int64_t r0, std::int64_t rows, std::int64_t x,
                  LineFeed& feed) {
    Scratch& s = s_;
    const void* const* v = s.vrow.data() + x + x0;
    const float* p = s.s.data() + r0 * kTile + x0;
    if (amx_)  // the same on AMX tiles, O's columns permuted
      s.amx.accumulate(nk, rows, v, p, s.alpha.data() + r0, s.o.data() + r0 * L_.dv, L_.dv, feed);
    else if (dot_)  // P rounded to bf16 there; l summed it in float32 (softmax_update_rows)
      kv::bf16dot::accumulate(nk, rows, L_.dv, v, p, s.alpha.data() + r0, s.o.data() + r0 * L_.dv, L_.dv, feed);
    else if (!s.vf.empty() && rows == g_) {  // the whole group (Scratch::widens_values)
      kv::widen(L_.type, nk, L_.dv, v, s.vsc.data() + x + x0, s.vf.data(), L_.dv);
      kv::accumulate(kv::kF32, nk, rows, L_.dv, s.vfrow.data(), nullptr, p, s.alpha.data() + r0,
                     s.o.data() + r0 * L_.dv, L_.dv, feed);
    } else
      kv::accumulate(L_.type, nk, rows, L_.dv, v, int8_ ? s.vsc.data() + x + x0 : nullptr, p, s.alpha.data() + r0,
                     s.o.data() + r0 * L_.dv, L_.dv, feed);
  }

  // Several new tokens: a key of the tile that some rows see and others do not (the last tokens'
  // own keys under a causal mask, a window's first keys), whose V row holds an Inf or NaN, would
  // reach the rows that do not see it as 0·Inf = NaN through the tile's P·V. Such a tile goes row
  // by row, each over the keys it sees (docs/numerics.md, "Visible keys").
  bool hidden_value_not_finite(std::int64_t t0, std::int64_t nk, std::int64_t x) const {
    const std::int64_t all_lo = L_.lo(b_, L_.Nq - 1) - t0, all_hi = L_.hi(b_, 0) - t0;  // keys every row sees
    if (all_lo <= 0 && nk <= all_hi) return false;  // most tiles
    for (std::int64_t j = 0; j < nk; ++j)
      if ((j < all_lo || j >= all_hi) && !finite_row(s_.vrow[x + j], int8_ ? s_.vsc[x + j] : nullptr)) return true;
    return false;
  }
  bool finite_row(const void* row, const float* scales) const {
    switch (L_.type) {
      case kv::kF32: return !any_nonfinite_bits(static_cast<const FloatBits*>(row), L_.dv);  // tiles.h
      case kv::kBF16: return !any_nonfinite_bits(static_cast<const std::uint16_t*>(row), L_.dv);
      case kv::kF16: {  // exponent field 0x7c00
        const auto* half = static_cast<const std::uint16_t*>(row);
        return std::none_of(half, half + L_.dv, [](std::uint16_t h) { return (h & 0x7c00) == 0x7c00; });
      }
      default: return all_finite(scales, 0, 1, L_.dv / 32);  // int8: its values are finite, its scales may not be
    }
  }
  void accumulate_visible(std::int64_t t0, std::int64_t nk, std::int64_t x) {
    LineFeed none;
    for (std::int64_t r = 0; r < g_; ++r) {
      const std::int64_t i = r % L_.Nq;
      const std::int64_t lo = std::clamp<std::int64_t>(L_.lo(b_, i) - t0, 0, nk);
      const std::int64_t hi = std::clamp<std::int64_t>(L_.hi(b_, i) - t0, lo, nk);
      accumulate(lo, hi - lo, r, 1, x, none);  // no key: O[r] rescaled only
    }
  }

  // One query row for each KV head of a chunk taken side by side (Layout::together): this is head
  // 0's chunk, `all` every head's (their scratch holds each head's q, m, l and o). A tile is one
  // kv::stream_heads call, which reads the tile's keys in address order, each key's rows of all
  // heads, where a step of each head in turn (step()) read a head's rows a run's length apart:
  // H = 8, Nkv = 65536, blocks of 16 keys, two threads, calls alternated, time over a contiguous
  // cache's, d = 128: float32 2.19 -> 1.13, bf16 1.69 -> 1.12, float16 1.80 -> 1.13, int8 2.32 ->
  // 1.41; d = 64: 1.7-3.3 -> 1.15-1.38 (docs/performance.md). The same bits.
  // hr, tf: a slot per head; work: kv::stream_heads_work floats.
  void step_heads(std::vector<Chunk>& all, kv::HeadRow* hr, kv::RowTransform* tf, float* work) {
    const std::int64_t i = i_, t0 = j0_ + i * kTile, nk = tile_keys(i), next = tile_keys(i + kAhead);
    static_assert(kAhead == 1, "the next tile is tile i + 1, gathered behind tile i");
    if (next) gather(t0 + kTile, next, kTile);
    const std::size_t heads = all.size();
    for (std::size_t x = 0; x < heads; ++x) {
      Chunk& c = all[x];
      ++c.i_;
      if (L_.transforms()) tf[x] = c.row_transform(t0);
      hr[x] = {c.s_.q.data(), c.s_.m.data(), c.s_.l.data(), c.s_.o.data(), L_.transforms() ? tf + x : nullptr};
    }
    const bool int8 = int8_;
    const kv::HeadRows k{s_.krow.data(), head_bytes(L_.k), int8 ? s_.ksc.data() : nullptr, head_scales(L_.k)};
    const kv::HeadRows v{s_.vrow.data(), head_bytes(L_.v), int8 ? s_.vsc.data() : nullptr, head_scales(L_.v)};
    // A paged cache prefetches the rows of the key kPagedAheadBytes of K and V (all heads of a key:
    // one run) past the one it reads, at most a tile ahead (the rows gathered reach a tile past
    // the one read): its blocks are too short for the hardware prefetcher, which starts anew at
    // each. On a Zen 5 core, blocks of 16 keys in shuffled order, d = 128, Nkv = 65536, two
    // threads, calls alternated in one process, time over a contiguous cache's (docs/performance.md):
    // 8 heads, without -> with, float32 1.88 -> 1.63, bf16 1.94 -> 1.58, int8 2.28 -> 1.75; against
    // the 16 KiB ahead that runs of 1 KiB or less took before, float32 1 head 1.61 -> 1.25, bf16 2
    // heads 2.43 -> 1.64, shorter runs (bf16 1 head, int8 1 and 2 heads) the same. Half a block
    // ahead (64 KiB at 8 float32 heads) was slower than none: every other key's prefetch then falls
    // in the block being read, which the hardware prefetcher already fetches.
    const std::int64_t run = (L_.dk * L_.k.esize + L_.dv * L_.v.esize) * static_cast<std::int64_t>(heads);
    const std::size_t ahead =
        L_.paged ? static_cast<std::size_t>(std::clamp<std::int64_t>(kPagedAheadBytes / run, 4, kTile)) : 0;
    kv::stream_heads(L_.type, static_cast<std::size_t>(nk), heads, L_.dk, L_.dv, k, v, hr, ahead,
                     static_cast<std::size_t>(next ? kTile + next : nk), work);
    for (auto* rows : {&s_.krow, &s_.vrow}) std::copy_n(rows->begin() + kTile, next, rows->begin());
    if (int8)
      for (auto* sc : {&s_.ksc, &s_.vsc}) std::copy_n(sc->begin() + kTile, next, sc->begin());
  }

 private:
  static constexpr std::int64_t kSets = kAhead + 1;

  std::int64_t tile_keys(std::int64_t i) const { return i < tiles_ ? std::min(kTile, j1_ - j0_ - i * kTile) : 0; }

  // The score transforms (Layout) on the tile's scores of keys [t0, t0 + nk), row r being new token
  // r % Nq of query head kh·group + r / Nq: as transform_scores (score_transforms.h) with the
  // diagonal at the token's key, the cap by the same vector tanh, ALiBi by the same subtract_alibi.
  void transform(std::int64_t t0, std::int64_t nk) {
    for (std::int64_t r = 0; r < g_; ++r) {
      const std::int64_t diag = L_.position(b_, r % L_.Nq);
      float* row = s_.s.data() + r * kTile;
      if (L_.softcap > 0.0) simd::softcap(row, nk, static_cast<float>(L_.softcap));
      const float slope = L_.slopes.empty() ? 0.0f : L_.slopes[b_ * L_.Hq + kh_ * group_ + r / L_.Nq];
      if (slope == 0.0f) continue;
      subtract_alibi(row, static_cast<std::int32_t>(nk), 1, slope, static_cast<std::int32_t>(diag - t0));
    }
  }

  // Several new tokens: the keys of the tile [t0, t0 + nk) a row does not see (before its window,
  // after its own key when causal or past its right window; the chunk covers the union of the rows'
  // keys) set to -inf.
  void mask_rows(std::int64_t t0, std::int64_t nk) {
    // Keys every row sees: from the last row's first to the first row's last. Most tiles lie there.
    if (t0 >= L_.lo(b_, L_.Nq - 1) && t0 + nk <= L_.hi(b_, 0)) return;
    for (std::int64_t r = 0; r < g_; ++r) {
      const std::int64_t i = r % L_.Nq, lo = L_.lo(b_, i) - t0, hi = L_.hi(b_, i) - t0;
      float* row = s_.s.data() + r * kTile;
      for (std::int64_t x = 0; x < nk; ++x)
        if (x < lo || x >= hi) row[x] = -std::numeric_limits<float>::infinity();
    }
  }

  // The transforms of a one-row chunk (query head kh) for a stream_row_strided call from key t0.
  kv::RowTransform row_transform(std::int64_t t0) const {
    kv::RowTransform tf;
    tf.cap = static_cast<float>(L_.softcap);
    tf.slope = L_.slopes.empty() ? 0.0f : L_.slopes[b_ * L_.Hq + kh_];
    tf.diag = L_.position(b_, 0) - t0;
    return tf;
  }

  static void prefetch_rows(const void* const* rows, std::int64_t n, std::int64_t bytes,
                            CacheLevel level = CacheLevel::far) {
    for (std::int64_t j = 0; j < n; ++j) prefetch_bytes(rows[j], bytes, level);
  }

  // From a head's row of a key to the next head's (heads together): bytes, and floats of int8 scales.
  std::ptrdiff_t head_bytes(const Rows& r) const { return (L_.paged ? r.s2 : r.s1) * r.esize; }
  std::ptrdiff_t head_scales(const Rows& r) const { return L_.paged ? r.c2 : r.c1; }

  // The row pointers of keys [t0, t0 + nk) from entry `at` of the pointer arrays: contiguous, one
  // stride per row; paged, through the block table (blocks in any order, a [.., block, Hkv, d]
  // pool whose rows of one head are Hkv·d apart).
  void gather(std::int64_t t0, std::int64_t nk, std::int64_t at) {
    const Layout& L = L_;
    const std::int64_t b = b_, kh = kh_;
    const void** kr = s_.krow.data() + at;
    const void** vr = s_.vrow.data() + at;
    const float** ksc = s_.ksc.data() + at;
    const float** vsc = s_.vsc.data() + at;
    if (!L.paged) {
      const char *k = L.k.row(b, kh, t0), *v = L.v.row(b, kh, t0);
      for (std::int64_t j = 0; j < nk; ++j) {
        kr[j] = k + j * L.k.row_bytes();
        vr[j] = v + j * L.v.row_bytes();
      }
      if (int8_)
        for (std::int64_t j = 0; j < nk; ++j) {
          ksc[j] = L.k.scale(b, kh, t0 + j);
          vsc[j] = L.v.scale(b, kh, t0 + j);
        }
      return;
    }
    // Paged: a block at a time (one division for the call, not one per key); key t lies in block
    // table[t / block_size] at row t % block_size, head kh.
    std::int64_t j = 0, blk = t0 / L.block_size, at_row = t0 % L.block_size;
    while (j < nk) {
      const std::int64_t i0 = L.table[b * L.t0 + blk * L.t1];
      const char* k = L.k.data + (i0 * L.k.s0 + kh * L.k.s2) * L.k.esize;
      const char* v = L.v.data + (i0 * L.v.s0 + kh * L.v.s2) * L.v.esize;
      const std::int64_t rows = std::min(L.block_size - at_row, nk - j);
      for (std::int64_t r = at_row; r < at_row + rows; ++r, ++j) {
        kr[j] = k + r * L.k.s1 * L.k.esize;
        vr[j] = v + r * L.v.s1 * L.v.esize;
        if (int8_) {
          ksc[j] = L.k.scales + i0 * L.k.c0 + r * L.k.c1 + kh * L.k.c2;
          vsc[j] = L.v.scales + i0 * L.v.c0 + r * L.v.c1 + kh * L.v.c2;
        }
      }
      ++blk, at_row = 0;
    }
  }

  const Layout& L_;
  Scratch& s_;
  // Set once, from the layout (the constructor).
  const std::int64_t g_, group_, kbytes_, vbytes_;  // g_: the query rows (Layout::rows), group_: heads
  const bool int8_, whole_;
  bool quads_ = false, in_place_ = false, near_f32_ = false, dot_ = false, amx_ = false, prefetch_k_ = true,
       v_fed_ = false;
  std::int64_t scores_keys_ = kSub;  // keys a call of the scores (the constructor)
  std::int64_t stream_ahead_ = 0;  // keys kv::stream_row_strided prefetches ahead (0: none)
  CacheLevel v_level_ = CacheLevel::far;  // where GQA's V rows are prefetched to
  // The chunk's (begin).
  std::int64_t b_ = 0, kh_ = 0, j0_ = 0, j1_ = 0, i_ = 0, tiles_ = 0;
};

// The chunks' partial (o, m, l), kept between calls (see PerThread): a decode step over a long cache
// has hundreds of KiB of them, which freshly allocated cost page faults and page clearing on every
// call.
struct Partials {
  std::vector<float> o, m, l;
  Partials(std::int64_t rows, std::int64_t dv)
      : o(static_cast<std::size_t>(rows * dv)), m(static_cast<std::size_t>(rows)), l(static_cast<std::size_t>(rows)) {}
  bool fits(std::int64_t rows, std::int64_t dv) const {
    return o.size() >= static_cast<std::size_t>(rows * dv) && m.size() >= static_cast<std::size_t>(rows);
  }
};

// The scratch of one work unit: a Scratch and its Chunk per KV head taken side by side. Kept
// between calls (PerThread): one built for the same sizes serves a later call, its Chunks rebuilt
// for that call's layout (bind), which they refer to, once a call: `call` numbers the decode calls
// of the process, so that a scratch bound to an earlier call's layout (perhaps at the same address)
// is rebound.
struct HeadScratch {
  std::vector<Scratch> scratch;
  std::vector<Chunk> chunk;
  // One query row a head, heads together (Chunk::step_heads): a slot per head, and the kernel's work.
  std::vector<kv::HeadRow> rows;
  std::vector<kv::RowTransform> tf;
  std::vector<float> work;
  std::uint64_t call = 0;  // the call whose layout the chunks refer to (0: none)
  HeadScratch(const Layout& L, std::int64_t heads) {
    scratch.reserve(static_cast<std::size_t>(heads));  // no reallocation: each Chunk holds its Scratch
    chunk.reserve(static_cast<std::size_t>(heads));
    for (std::int64_t h = 0; h < heads; ++h) scratch.emplace_back(L);
    if (heads_together(L)) {
      rows.resize(static_cast<std::size_t>(heads));
      tf.resize(static_cast<std::size_t>(heads));
      work.resize(kv::stream_heads_work(static_cast<std::size_t>(heads), static_cast<std::size_t>(L.dk)));
    }
  }
  // Whether a work unit's heads go through kv::stream_heads (Chunk::step_heads).
  static bool heads_together(const Layout& L) { return L.together && L.rows() == 1; }
  bool fits(const Layout& L, std::int64_t heads) const {
    return scratch.size() == static_cast<std::size_t>(heads) && scratch.front().fits(L) &&
           work.size() == (heads_together(L) ? kv::stream_heads_work(scratch.size(), static_cast<std::size_t>(L.dk))
                                             : 0);
  }
  void bind(const Layout& L, std::uint64_t this_call) {
    if (call == this_call) return;
    chunk.clear();  // the capacity stays
    for (Scratch& s : scratch) chunk.emplace_back(L, s);
    call = this_call;
  }
};

}  // namespace
}  // namespace detail

void decode(const TensorView& q_in, const KVCache& cache, const TensorView& out_in, const TensorView& lse_in,
            const DecodeOptions& options) {
  using namespace detail;
  const Layout L = make_layout(q_in, cache, out_in, lse_in, options);
  simd::init_target_from_env();
  // One row a head ([B, Hq, d], [B, Hq]) seen as Nq = 1 ([B, Hq, 1, d], [B, Hq, 1]): dimension 2
  // inserted with extent 1.
  const auto with_rows = [](const TensorView& t, int rank) {
    if (t.empty() || t.rank == rank) return t;
    TensorView v = t;
    v.rank = rank;
    for (int d = rank - 1; d > 2; --d) v.shape[d] = t.shape[d - 1], v.strides[d] = t.strides[d - 1];
    v.shape[2] = 1, v.strides[2] = 0;
    return v;
  };
  const TensorView q = with_rows(q_in, 4), out = with_rows(out_in, 4), lse = with_rows(lse_in, 3);
  const std::int64_t g = L.rows(), heads = L.B * L.Hkv, chunk_len = chunk_keys(L.B, L.Hkv, L.max_len);
  const std::int64_t chunks = std::max<std::int64_t>(1, (L.max_len + chunk_len - 1) / chunk_len);
  const std::int64_t items = heads * chunks;
  PerThread<Partials> partials(1);  // several chunks: each unit's partial, merged after
  float *po = nullptr, *pm = nullptr, *pl = nullptr;
  if (chunks > 1) {
    Partials& part = partials.get(0, items * g, L.dv);
    po = part.o.data(), pm = part.m.data(), pl = part.l.data();
  }
  // out = o / l and lse = M + ln l for row r of KV head `head` (b·Hkv + kh); out = 0 and lse = -inf
  // where no key was seen (l = 0; o is not read then). With one chunk (most calls of a few
  // thousand keys) each unit writes its heads' rows from its partial as it is (merge_row would give
  // M = m, l = 1·l and o = 0 + 1·o: the same values, but for the sign of a zero in o) on the thread
  // that computed them: collected by the calling thread, a unit's partial crossed from the other
  // core's cache each call, and its lines back again at the next (a short decode call on two
  // threads; docs/performance.md).
  const auto write_row = [&](std::int64_t head, std::int64_t r, float M, float l, const float* o) {
    const std::int64_t b = head / L.Hkv, kh = head % L.Hkv;
    const std::int64_t h = kh * L.group() + r / L.Nq, i = r % L.Nq;
    float* dst = static_cast<float*>(out.data) + b * out.strides[0] + h * out.strides[1] + i * out.strides[2];
    const float inv = l == 0.0f ? 0.0f : 1.0f / l;
    if (l == 0.0f)
      for (std::int64_t d = 0; d < L.dv; ++d) dst[d * out.strides[3]] = 0.0f;
    else if (out.strides[3] == 1 && !std::isnan(inv))  // a NaN inv: as write_row_vectors (flash_forward.h)
      simd::scaled_copy(o, inv, dst, static_cast<std::size_t>(L.dv));
    else
      for (std::int64_t d = 0; d < L.dv; ++d) dst[d * out.strides[3]] = o[d] * inv;
    if (!lse.empty()) {
      const double v = l == 0.0f ? -INFINITY : static_cast<double>(M) + std::log(static_cast<double>(l));
      void* p = static_cast<char*>(lse.data) +
                (b * lse.strides[0] + h * lse.strides[1] + i * lse.strides[2]) * static_cast<std::int64_t>(dtype_size(lse.dtype));
      if (lse.dtype == DType::f32) *static_cast<float*>(p) = static_cast<float>(v);
      else *static_cast<double*>(p) = v;
    }
  };
  // A work unit is one KV head's chunk, or, where the heads' rows of a key lie together (a paged
  // cache's blocks [block, Hkv, d], a contiguous [B, Nkv, Hkv, d] cache), one chunk of all KV heads
  // taken tile by tile side by side, which reads those rows as one run instead of Hkv strided passes.
  const std::int64_t lockstep = L.lockstep(), units = items / lockstep;
  // Threads: unless the caller names a count, a call that reads less than kOneThreadBytes of K and
  // V runs on one, since handing work to a second thread costs about as much as it saves there
  // (about 1.3 µs a call for the hand-off and the wait on this pool). An Intel Xeon, GQA 32/8,
  // d = 128, µs a call on one / two threads, one cache called again and again (warm) and the
  // caches of 1024 layers in turn (cold, as in inference, where the other layers evict a layer's
  // cache between its calls), float32: 1 key (8 KiB) warm 3.59 / 3.37, cold 3.50 / 3.43; 4 keys
  // 3.66 / 3.53, 6.19 / 4.74; 16 keys 5.36 / 4.28, 15.3 / 9.98; 64 keys 14.2 / 9.27, 52.4 / 29.9;
  // bf16 1 key 3.70 / 3.48, 3.75 / 3.35; 16 keys 5.64 / 4.53, 10.1 / 7.10 (docs/performance.md,
  // "2026-12-06, 02:09"; before each unit wrote its own rows, two threads lost to one below 128
  // KiB in cache). The units' arithmetic does not depend on it.
  const int threads =
      options.threads == 0 && L.bytes() < kOneThreadBytes ? 1 : resolve_threads(options.threads, units);
  PerThread<HeadScratch> scratch(threads);
  static std::atomic<std::uint64_t> calls{0};
  const std::uint64_t call = ++calls;
  // The bf16 products on AMX: the tiles configured once on each thread for all its units.
  const bool tiles = L.bf16_products && kv::bf16dot::amx();
  // Units in contiguous runs, one a thread, where they are all alike (one chunk, every sequence of
  // the full length): the caller takes the first run and each worker its own, so a thread meets
  // the heads (K, V, and their scratch) it had at the call before, in its own core's cache; a
  // counter handing out single units gave them to whichever thread came first. Short decode, GQA
  // 32/8, 64 keys, bf16, two threads, warm: 9.2-9.5 -> 8.5-9.1 µs a call (docs/performance.md).
  const std::int64_t grain = chunks == 1 && !L.lens ? (units + threads - 1) / threads : 1;
  parallel_for(units, grain, threads, [&](std::int64_t u0, std::int64_t u1, int t) {
    const bfdot::TileScope configured(tiles ? bfdot::Path::amx : bfdot::Path::portable);
    HeadScratch& hs = scratch.get(t, L, lockstep);
    hs.bind(L, call);
    for (std::int64_t u = u0; u < u1; ++u) {
      // Item (head, c), head = b·Hkv + kh: unit u covers heads [h0, h0 + lockstep) of chunk c.
      const std::int64_t c = u % chunks, h0 = u / chunks * lockstep, b = h0 / L.Hkv;
      // The keys any row sees: from row 0's first to the last row's last.
      const std::int64_t j0 = std::max(c * chunk_len, L.lo(b, 0)), j1 = std::min((c + 1) * chunk_len, L.hi(b, L.Nq - 1));
      if (j0 >= j1) {  // a chunk the sequence does not reach, or before its window
        for (std::int64_t h = h0; h < h0 + lockstep; ++h) {
          if (chunks == 1) {
            for (std::int64_t r = 0; r < g; ++r) write_row(h, r, -std::numeric_limits<float>::infinity(), 0.0f, nullptr);
            continue;
          }
          std::fill_n(pm + (h * chunks + c) * g, g, -std::numeric_limits<float>::infinity());
          std::fill_n(pl + (h * chunks + c) * g, g, 0.0f);
        }
        continue;
      }
      for (std::int64_t x = 0; x < lockstep; ++x) hs.chunk[x].begin(q, b, (h0 + x) % L.Hkv, j0, j1);
      if (HeadScratch::heads_together(L)) {
        while (!hs.chunk[0].done()) hs.chunk[0].step_heads(hs.chunk, hs.rows.data(), hs.tf.data(), hs.work.data());
      } else {
        while (!hs.chunk[0].done())
          for (std::int64_t x = 0; x < lockstep; ++x)
            hs.chunk[x].step(&hs.chunk[0], x, lockstep);
      }
      for (std::int64_t x = 0; x < lockstep; ++x) {
        hs.chunk[x].finish();
        const Scratch& s = hs.scratch[x];
        if (chunks == 1) {
          for (std::int64_t r = 0; r < g; ++r) write_row(h0 + x, r, s.m[r], s.l[r], s.o.data() + r * L.dv);
          continue;
        }
        const std::int64_t item = (h0 + x) * chunks + c;
        std::copy(s.o.begin(), s.o.end(), po + item * g * L.dv);
        std::copy(s.m.begin(), s.m.end(), pm + item * g);
        std::copy(s.l.begin(), s.l.end(), pl + item * g);
      }
    }
  });
  // Merge in chunk order, then write (write_row). With one chunk the units wrote their rows.
  if (chunks == 1) return;
  std::vector<float> merged(L.dv);
  for (std::int64_t head = 0; head < heads; ++head)
    for (std::int64_t r = 0; r < g; ++r) {
      const auto slot = [&](std::int64_t c) { return (head * chunks + c) * g + r; };
      float M = pm[slot(0)], l = pl[slot(0)];
      detail::merge_row<float>(
          chunks, L.dv, [](float x) { return std::exp(x); }, [&](std::int64_t c) { return pm[slot(c)]; },
          [&](std::int64_t c) { return pl[slot(c)]; },
          [&](std::int64_t c, std::int64_t d) { return po[slot(c) * L.dv + d]; }, M, l, merged.data());
      write_row(head, r, M, l, merged.data());
    }
}

}  // namespace attnscale
