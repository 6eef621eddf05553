// The bf16 forward: the tiled online softmax of flash_forward.h with both products in bfloat16
// (float32 accumulation) through bf16_kernels.h. Used for bfloat16 inputs and for float32 inputs
// with Options::compute = Compute::bf16 (rounded to bfloat16 as they are packed).
//
// K and V are packed to bfloat16 once per (batch, KV head), before any query block runs:
//   Kp = K in VNNI pairs over the head dimension [dk32/2][ldk][2] (the B operand of Q·Kᵀ; ldk: PackedKV),
//   Vp = V in VNNI pairs over the keys [Nkv64/2][ldv][2] (the B operand of P·V),
// zero beyond Nkv (one tile more than needed: a tile that starts off the grid of kKeys may read
// up to 32 keys past Nkv) and beyond dk, so every query block and key tile reads them in place.
// Per block of up to kRows = 2·kBr rows (two consecutive RowBlocks of one head, WideBlock):
// Qb = Q rows [kRows][dk32] bf16; per key tile, in row layout (one query per row):
//   S = s · Qb·Kp  (float32),  online softmax along the rows (kernels.h),
//   Pb = bf16(P) [query][key],  O = alpha·O + Pb·Vp  (float32).
// The scale is applied to the float32 scores, not folded into Q, so Q is rounded only once.
// The optional probs recompute S tile by tile with the same GEMM (write_probs below).
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "attention/bf16_kernels.h"
#include "attention/flash_forward.h"
#include "attention/score_transforms.h"
#include "common/parallel.h"

namespace attnscale::detail::bfdot {
namespace {

// Keys per tile. Each tile pays per row for the softmax's two reductions and its rescale factor,
// and per output element for one load, rescale and store of O in P·V; the products grow with the
// tile.
constexpr std::int64_t kKeys = 128;
// Keys per tile where every row of the block sees all of them (wide_span): O passes through
// memory and each row's softmax statistics are updated once per kWideKeys keys. Tiles that
// reach a causal diagonal, a window's edge or a mask stay kKeys wide: 256-key tiles there had
// made the causal forward 2-5% slower while the full one gained 3-8% (docs/performance.md).
constexpr std::int64_t kWideKeys = 2 * kKeys;
// Row stride of Pb: a tile that starts at an odd key (a window's first key) spans its keys + 1 key
// slots from the even key before it, rounded up to 32 for the products.
constexpr std::int64_t kPbLd = kWideKeys + 32;
// Rows of the score tile a softmax call takes before they are rounded to bfloat16 (attend). On an
// Intel Xeon with AMX (N = 4096, d = 128, B·H = 8, two threads, six runs alternated, 16:24 UTC,
// 2026-12-05): 0.201-0.206 of the AMX peak against 0.187-0.199 with the whole tile's softmax first;
// 4 and 32 rows no better than 16 (docs/performance.md).
constexpr std::int64_t kSoftmaxRows = 16;
// Rows of the score product per call where the softmax follows it directly (attend): AMX's blocks
// are 32 rows, so the panels compute the same blocks as one call over the whole tile.
constexpr std::int64_t kPanelRows = 32;

// Element (a, b, c, d) of a float32 or bfloat16 view as bfloat16 bits.
inline std::uint16_t bits(const TensorView& t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  if (t.dtype == DType::bf16) return at<const std::uint16_t>(t, a, b, c, d)[0];
  if (t.dtype == DType::f32) return round_to_bf16(*at<const float>(t, a, b, c, d));
  return round_to_bf16(value<float>(t, a, b, c, d));
}

// Row (a, b, c) of a view, d elements, as bfloat16 bits: read through a row pointer when the row
// is contiguous bfloat16 or float32 (the common case; bits() per element looks the dtype up each time).
void row_bits(const TensorView& t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d, std::uint16_t* out) {
  if (t.strides[3] == 1 && t.dtype == DType::bf16) {
    const std::uint16_t* row = at<const std::uint16_t>(t, a, b, c, 0);
    std::copy(row, row + d, out);
  } else if (t.strides[3] == 1 && t.dtype == DType::f32) {
    round_bits(at<const float>(t, a, b, c, 0), static_cast<std::size_t>(d), out);
  } else {
    for (std::int64_t e = 0; e < d; ++e) out[e] = bits(t, a, b, c, e);
  }
}

// K and V of every (batch, KV head), packed once (layouts above). All heads share one K and one V
// allocation: blocks of 4 MiB and more come in huge pages (allocate_block), where a buffer per
// head (1.1 MiB each at Nkv = 4096, d = 128) took a page fault per 4 KiB at every call.
// Kp's rows (one per pair of head columns) lie ldk·4 bytes apart, and a product's B operand reads
// 64 keys (4 lines) of each of them. With ldk = nkv64, a multiple of kKeys, consecutive rows start
// 8·(nkv64/128) lines apart and share 8 or fewer of L1's 64 sets; where nkv64 is a multiple of
// 1024 (Nkv = 2944, 3968) every row falls in the same 4 sets, and a score tile ran at 0.71 of the
// bf16 peak against 0.94 (64 x 128 x 128 in L1). A row kRowSkew keys longer makes the step an odd
// number of lines, which spreads the rows over every set (docs/performance.md).
constexpr std::int64_t kRowSkew = 16;

struct PackedKV {
  std::int64_t dk32, ldv, nkv64;  // nkv64: keys allocated, round_up(Nkv, kKeys) + kKeys
  std::int64_t ldk;               // Kp's row length in keys: nkv64 + kRowSkew
  std::int64_t kn, vn;            // elements per head
  Buffer<std::uint16_t> ks, vs;   // head bh = b·Hkv + kh from element bh·kn (bh·vn) on
  std::vector<std::uint8_t> v_finite;  // per head: every packed V value finite
  const std::uint16_t* k(std::int64_t bh) const { return ks.get() + bh * kn; }
  const std::uint16_t* v(std::int64_t bh) const { return vs.get() + bh * vn; }
  PackedKV(const Params& p, int threads)
      : dk32(round_up(p.dk, 32)), ldv(round_up(p.dv, 16)), nkv64(round_up(p.Nkv, kKeys) + kKeys),
        ldk(nkv64 + kRowSkew), kn(dk32 * ldk), vn(nkv64 * ldv), ks(p.B * p.Hkv * kn), vs(p.B * p.Hkv * vn),
        v_finite(p.B * p.Hkv, 1) {
    parallel_for(p.B * p.Hkv, 1, threads, [&](std::int64_t t0, std::int64_t t1, int) {
      for (std::int64_t bh = t0; bh < t1; ++bh) {
        const std::int64_t b = bh / p.Hkv, kh = bh % p.Hkv;
        std::uint16_t* K = ks.get() + bh * kn;
        std::uint16_t* V = vs.get() + bh * vn;
        // Zeros only where the packing below writes nothing (keys past the last block of 16, the
        // pair rows past Nkv, the columns past dk and dv): a fill of the whole head first had it
        // all written twice.
        const std::int64_t words = (p.dk + 1) / 2, keys16 = round_up(p.Nkv, 16), pairs = (p.Nkv + 1) / 2;
        std::uint32_t* K32 = reinterpret_cast<std::uint32_t*>(K);
        for (std::int64_t w = 0; w < words; ++w) std::fill(K32 + w * ldk + keys16, K32 + (w + 1) * ldk, 0u);
        std::fill(K32 + words * ldk, K32 + (dk32 / 2) * ldk, 0u);
        if (ldv > p.dv)
          for (std::int64_t j = 0; j < pairs; ++j)
            std::fill(V + j * ldv * 2 + 2 * p.dv, V + (j + 1) * ldv * 2, std::uint16_t{0});
        std::fill(V + pairs * ldv * 2, V + vn, std::uint16_t{0});
        // K in blocks of 16 keys, each pair of columns (one 32-bit word per key) written as one
        // 64-byte run (transpose_words16). Written key by key, the 64 words of a key went to 64
        // lines ldk·4 bytes apart, which fall in a few L1 sets and evicted each other. The rows are
        // read in place where they are contiguous bfloat16 of even length, else staged (rounded
        // from float32, or an odd dk's last word completed by a zero).
        std::vector<std::uint16_t> stage(16 * dk32, 0), v0(p.dv), v1(p.dv), zeros(std::max(p.dv, dk32), 0);
        const bool k_in_place = p.k.dtype == DType::bf16 && p.k.strides[3] == 1 && p.dk % 2 == 0;
        const std::uint16_t* rows[16];
        for (std::int64_t j0 = 0; j0 < p.Nkv; j0 += 16) {
          const std::int64_t n = std::min<std::int64_t>(16, p.Nkv - j0);
          for (std::int64_t x = 0; x < 16; ++x) {
            if (x >= n) {
              rows[x] = zeros.data();
            } else if (k_in_place) {
              rows[x] = at<const std::uint16_t>(p.k, b, kh, j0 + x, 0);
            } else {
              row_bits(p.k, b, kh, j0 + x, p.dk, stage.data() + x * dk32);
              rows[x] = stage.data() + x * dk32;
            }
          }
          transpose_words16(rows, static_cast<std::size_t>(words), K32 + j0, static_cast<std::size_t>(ldk));
        }
        // V's pairs: rows j and j + 1 (zero past Nkv), read in place where they are contiguous
        // bfloat16.
        const bool in_place = p.v.dtype == DType::bf16 && p.v.strides[3] == 1;
        bool finite = true;
        for (std::int64_t j = 0; j < p.Nkv; j += 2) {
          const std::uint16_t *r0 = v0.data(), *r1 = v1.data();
          if (in_place) {
            r0 = at<const std::uint16_t>(p.v, b, kh, j, 0);
            if (j + 1 < p.Nkv) r1 = at<const std::uint16_t>(p.v, b, kh, j + 1, 0);
          } else {
            row_bits(p.v, b, kh, j, p.dv, v0.data());
            if (j + 1 < p.Nkv) row_bits(p.v, b, kh, j + 1, p.dv, v1.data());
          }
          if (j + 1 >= p.Nkv) r1 = zeros.data();
          finite = finite && !any_nonfinite_bits(r0, p.dv) && !any_nonfinite_bits(r1, p.dv);
          interleave_rows(r0, r1, p.dv, V + (j / 2) * ldv * 2);
        }
        v_finite[bh] = finite;
      }
    });
  }
};

// Query rows per block: two consecutive blocks of the float32 forward's kBr rows (RowBlock) of one
// head, as one. Each product of a key tile then runs over 128 rows, its B operand (the tile's K or
// V, from L3) read from L3 once for all of them. N = 4096, d = 128, B·H = 8, two threads, processes
// of the two builds alternated: 695-704 against 691-697 GFLOP/s, causal 526-571 against 501-546
// (docs/performance.md). A half that sees none of a tile computes it with P = 0.
constexpr std::int64_t kHalves = 2, kRows = kHalves * kBr;

// A block: `halves` consecutive RowBlocks of one head, rows h·kBr + r (every half but the last is
// whole, kBr rows), and the union of their key ranges.
struct WideBlock {
  RowBlock half[kHalves];
  std::int64_t halves = 0;
  std::int64_t rows() const { return (halves - 1) * kBr + half[halves - 1].n; }
  bool empty() const {
    for (std::int64_t h = 0; h < halves; ++h)
      if (!half[h].empty()) return false;
    return true;
  }
  std::int64_t lo() const {
    std::int64_t x = std::numeric_limits<std::int64_t>::max();
    for (std::int64_t h = 0; h < halves; ++h)
      if (!half[h].empty()) x = std::min(x, half[h].lo_min);
    return x;
  }
  std::int64_t hi() const {
    std::int64_t x = 0;
    for (std::int64_t h = 0; h < halves; ++h)
      if (!half[h].empty()) x = std::max(x, half[h].hi_max);
    return x;
  }
};

// Work item `item` over B·Hq·npairs blocks: query blocks qb − 1 and qb of kBr rows (qb alone when
// it is the first), qb = nqb − 1 − 2·(item mod npairs): the last blocks first, as query_block().
WideBlock wide_block(const Params& p, std::int64_t item, std::int64_t nqb, std::int64_t npairs) {
  const std::int64_t last = nqb - 1 - 2 * (item % npairs), bh = item / npairs;
  WideBlock wb;
  for (std::int64_t qb = std::max<std::int64_t>(last - 1, 0); qb <= last; ++qb)
    wb.half[wb.halves++] = query_block(p, bh * nqb + (nqb - 1 - qb), nqb);  // its item for block qb
  return wb;
}

struct Scratch {
  static constexpr std::int64_t lds = kWideKeys;  // columns of the row-layout score tile (keys)
  std::int64_t dk32;
  Buffer<std::uint16_t> qb, pb, vt;
  Buffer<float> s, o, m, l, alpha;
  Buffer<float> vp, sub, mul;  // the visible-pairs path's V rows (rows_operand); write_probs' e^(t − sub)·mul
  explicit Scratch(const Params& p)
      : dk32(round_up(p.dk, 32)), qb(kRows * dk32), pb(kRows * kPbLd), vt(kPbLd * round_up(p.dv, 16)), s(kRows * lds),
        o(kRows * p.dv), m(kRows), l(kRows), alpha(kRows), vp(kKeys * p.dv), sub(kBr), mul(kBr) {
    qb.fill(0);
    pb.fill(0);
    this->s.fill(0.0f);  // columns past a ragged tile's keys are read (never used) by exp2_rows
  }
};

// The B operand of P·V for the keys [k0, k0 + n) of the packed V (k0 even, n a multiple of 32),
// of which only [j0, j1) belong to the tile. The GEMM reads whole 32-key blocks and P is zero
// outside the tile, but 0 · NaN = NaN: when real keys outside [j0, j1) fall in the span (the end
// of a causal row's keys, a window's first key), the span is copied with them zeroed, so a
// non-finite value of a key the tile's rows cannot see never reaches them.
const std::uint16_t* value_span(const Params& p, const PackedKV& kv, const std::uint16_t* V, std::int64_t k0,
                                std::int64_t n, std::int64_t j0, std::int64_t j1, Scratch& s) {
  const std::uint16_t* span = V + (k0 / 2) * kv.ldv * 2;
  if (k0 == j0 && std::min(k0 + n, p.Nkv) <= j1) return span;  // beyond Nkv the packing is zero
  std::uint16_t* dst = s.vt.get();
  std::copy(span, span + n * kv.ldv, dst);
  for (std::int64_t j = k0; j < k0 + n; ++j)
    if (j < j0 || j >= j1)
      for (std::int64_t c = 0; c < kv.ldv; ++c) dst[(((j - k0) / 2) * kv.ldv + c) * 2 + (j - k0) % 2] = 0;
  return dst;
}

// Whether every row of the block sees all of the keys [j0, j0 + kWideKeys) (within [.., je)).
bool wide_span(const Params& p, const WideBlock& wb, std::int64_t j0, std::int64_t je) {
  if (j0 + kWideKeys > je) return false;
  for (std::int64_t h = 0; h < wb.halves; ++h)
    if (wb.half[h].empty() || classify(p, wb.half[h], j0, j0 + kWideKeys) != TileKind::full) return false;
  return true;
}

void attend(const Params& p, const PackedKV& kv, const WideBlock& wb, Path path, Scratch& s) {
  const std::int64_t M = wb.rows();
  s.m.fill(-INFINITY);
  s.l.fill(0.0f);
  std::fill(s.o.get(), s.o.get() + M * p.dv, 0.0f);
  for (std::int64_t h = 0; h < wb.halves; ++h)
    for (std::int64_t r = 0; r < wb.half[h].n; ++r) {
      const RowBlock& rb = wb.half[h];
      row_bits(p.q, rb.b, rb.h[r], rb.i[r], p.dk, s.qb.get() + (h * kBr + r) * s.dk32);
    }
  if (wb.empty()) return;
  const RowBlock& first = wb.half[0];  // every half has its b and kh
  const std::uint16_t* K = kv.k(first.b * p.Hkv + first.kh);
  const std::uint16_t* V = kv.v(first.b * p.Hkv + first.kh);
  const float scale = static_cast<float>(p.scale);
  // The scale applied where the softmax reads the scores (softmax_update_rows_bf16_scaled: the same
  // t = x·s, one rounded multiply), so that the score product's tiles are stored in place rather
  // than through a scratch and a scaling pass (gemm_amx); else the product scales them.
  const bool fold = p.scale_when_exp_reads();
  // e^(x·s − m) by one multiply-add from x (kernels.h), unless the probabilities are written: those
  // are e^(x·s − m) / l by the three operations, which keeps each of them in [0, 1] with l their sum.
  const bool fold_exp = p.probs.empty();
  // P rounded to bfloat16 by the softmax itself where the path has vcvtneps2bf16.
  const bool fused = bfdot::vdpbf16ps_path(path);
  const std::int64_t jb = wb.lo(), je = wb.hi();
  for (std::int64_t j0 = jb, j1 = jb; j0 < je; j0 = j1) {
    j1 = std::min(j0 + (wide_span(p, wb, j0, je) ? kWideKeys : kKeys), je);
    const std::int64_t nk = j1 - j0, nk16 = round_up(nk, 16), nk32 = round_up(nk, 32);
    TileKind kind[kHalves];
    bool any = false, all_full = true;
    for (std::int64_t h = 0; h < wb.halves; ++h) {
      kind[h] = wb.half[h].empty() ? TileKind::skip : classify(p, wb.half[h], j0, j1);
      any |= kind[h] != TileKind::skip;
      all_full &= kind[h] == TileKind::full;
    }
    if (!any) continue;
    // j0 need not be even (a window's first key): the pair layouts are indexed from key 0, so a
    // tile starting at an odd key begins one key earlier with that key's probability zero.
    const std::int64_t j0e = j0 & ~std::int64_t{1}, shift = j0 - j0e;
    // The scores of rows [r0, r0 + n) of the block, at the start of the score tile.
    const auto scores = [&](std::int64_t r0, std::int64_t n) {
      gemm(path, n, nk, s.dk32, s.qb.get() + r0 * s.dk32, s.dk32, K + j0 * 2, kv.ldk, s.s.get(), s.lds, 0, nullptr,
           fold ? 1.0f : scale);
    };
    // The online softmax over rows [r0, r0 + n) of the tile, their scores at S (each row's
    // statistics its own).
    const auto softmax = [&](float* S, std::int64_t r0, std::int64_t n) {
      float *m = s.m.get() + r0, *l = s.l.get() + r0, *alpha = s.alpha.get() + r0;
      if (fold) simd::softmax_update_rows_bf16_scaled(S, s.lds, n, nk, m, l, alpha, scale, fold_exp);
      else simd::softmax_update_rows(S, s.lds, n, nk, m, l, alpha, simd::ExpFor::bf16);
    };
    // Where P goes straight to P·V (whole tiles, no dropout, an even first key) it is rounded to
    // bfloat16 as the softmax makes it, where the path has vcvtneps2bf16 (`fused`: no float32 P
    // stored and read back; the same bits, 1-3% less time at N = 1000-4096); else each kSoftmaxRows
    // rows right after their softmax, while their scores (8 KiB) are in L1 (the whole tile's, 64 KiB
    // at 128 x 128, had left it by then).
    const bool direct = shift == 0 && all_full && !p.has_dropout();
    const auto softmax_to_bf16 = [&](float* S, std::int64_t r0, std::int64_t n) {
      if (fused)
        return simd::softmax_update_rows_to_bf16(S, s.lds, n, nk, s.m.get() + r0, s.l.get() + r0,
                                                 s.alpha.get() + r0, scale, fold, fold_exp, s.pb.get() + r0 * kPbLd,
                                                 kPbLd);
      for (std::int64_t q = 0; q < n; q += kSoftmaxRows) {
        const std::int64_t nq = std::min(kSoftmaxRows, n - q);
        softmax(S + q * s.lds, r0 + q, nq);
        to_bf16(path, S + q * s.lds, s.lds, nq, nk16, s.pb.get() + (r0 + q) * kPbLd, kPbLd);
      }
    };
    if (direct && !p.transforms_scores() && nk > kKeys) {
      // A wide tile by panels of kPanelRows rows, each panel's scores into the start of the score
      // tile, so that their stores and the softmax's reads stay in L1 rather than pass through L2
      // (128 KiB at 128 x 256; the same bits). Over tiles of kKeys the four calls cost more than
      // they saved (N = 333, d = 80: 2-3% slower).
      for (std::int64_t r0 = 0; r0 < M; r0 += kPanelRows) {
        const std::int64_t n = std::min(kPanelRows, M - r0);
        scores(r0, n);
        softmax_to_bf16(s.s.get(), r0, n);
      }
    } else {
      scores(0, M);
      for (std::int64_t h = 0; h < wb.halves; ++h) {
        const RowBlock& rb = wb.half[h];
        float* S = s.s.get() + h * kBr * s.lds;
        if (kind[h] == TileKind::skip) {  // a half that sees none of the tile: its rows' P = 0
          for (std::int64_t r = 0; r < rb.n; ++r) std::fill(S + r * s.lds, S + r * s.lds + nk, -INFINITY);
          continue;
        }
        if (p.transforms_scores()) transform_scores(p, rb, j0, nk, S, s.lds, 1);
        if (kind[h] == TileKind::partial) apply_mask_rows(p, rb, j0, j1, S, s.lds);
      }
      if (direct) softmax_to_bf16(s.s.get(), 0, M);
      else softmax(s.s.get(), 0, M);
    }
    if (p.has_dropout())  // l keeps every P
      for (std::int64_t h = 0; h < wb.halves; ++h)
        if (kind[h] != TileKind::skip) apply_dropout(p, wb.half[h], j0, nk, s.s.get() + h * kBr * s.lds, s.lds, 1);
    // A hidden key's non-finite value must not reach a row through its zero weight (0 · NaN = NaN):
    // such a tile reads only the visible pairs, in float32, as flash_forward.h does. The test reads
    // the packed values (bfloat16, as the product would take them: a float32 above bfloat16's
    // largest value is infinite there), the tile's pairs of rows, and only in a head that holds a
    // non-finite one (PackedKV); converting each partial tile's V rows to float32 to test them had
    // taken 10-12% of a causal forward.
    const auto packed_finite = [&] {
      const std::uint16_t* from = V + (j0 / 2) * kv.ldv * 2;
      return !any_nonfinite_bits(from, ((j1 + 1) / 2 - j0 / 2) * kv.ldv * 2);
    };
    if (!all_full && !kv.v_finite[first.b * p.Hkv + first.kh] && !packed_finite()) {
      const Operand vo = rows_operand<float>(p.v, first.b, first.kh, j0, nk, p.dv, s.vp.get());
      const float* Vf = static_cast<const float*>(vo.ptr);
      for (std::int64_t r = 0; r < M; ++r)
        for (std::int64_t c = 0; c < p.dv; ++c) s.o[r * p.dv + c] *= s.alpha[r];
      for (std::int64_t h = 0; h < wb.halves; ++h)
        if (kind[h] != TileKind::skip)
          visible_product(p, wb.half[h], j0, nk, s.s.get() + h * kBr * s.lds, s.lds, 1, Vf, vo.ld, p.dv,
                          s.o.get() + h * kBr * p.dv, p.dv, /*into_rows=*/true);
      continue;
    }
    if (shift == 0) {
      if (!direct) to_bf16(path, s.s.get(), s.lds, M, nk16, s.pb.get(), kPbLd);
      for (std::int64_t r = 0; r < M; ++r) std::fill(s.pb.get() + r * kPbLd + nk16, s.pb.get() + r * kPbLd + nk32, 0);
      gemm(path, M, p.dv, nk32, s.pb.get(), kPbLd, value_span(p, kv, V, j0, nk32, j0, j1, s), kv.ldv, s.o.get(), p.dv,
           2, s.alpha.get(), 1.0f);
    } else {  // odd j0: Pb column 0 is key j0 - 1 (probability 0)
      for (std::int64_t r = 0; r < M; ++r) {
        std::uint16_t* row = s.pb.get() + r * kPbLd;
        row[0] = 0;
        for (std::int64_t j = 0; j < nk; ++j) row[j + 1] = round_to_bf16(s.s[r * s.lds + j]);
        std::fill(row + nk + 1, row + kPbLd, 0);
      }
      const std::int64_t n = round_up(nk + 1, 32);
      gemm(path, M, p.dv, n, s.pb.get(), kPbLd, value_span(p, kv, V, j0e, n, j0, j1, s), kv.ldv, s.o.get(), p.dv, 2,
           s.alpha.get(), 1.0f);
    }
  }
}

// The probs output, P = e^(t − m) / l, from the very scores t that attend() turned into m and l:
// the same bf16 GEMM of the same Qb and Kp with the same float32 scale, then the same mask. m is
// the largest of these t and Exp2 of a non-positive argument is at most 1 (its polynomial is
// 1 + f·p(f) with f·p(f) ≤ 0), so every entry lies in [0, 1]; l is the float32 sum of the same
// e^(t − m), one of which is exactly e^0 = 1, so 1/l ≤ 1 and the row sums to 1 up to float32
// rounding over Nkv terms. Scores recomputed any other way (e.g. from the unrounded float32 Q,
// with s folded into Q) differ from these by a rounding error relative to |t|, which for logits
// of order 1e23 (scale 1e30) is itself astronomically large, and e^(error) is not a probability.
// Half h of the block (its rows of Qb, m and l from row h·kBr).
void write_probs(const Params& p, const WideBlock& wb, std::int64_t h, const PackedKV& kv, Path path, Scratch& s) {
  const RowBlock& rb = wb.half[h];
  const float *m = s.m.get() + h * kBr, *l = s.l.get() + h * kBr;
  for (std::int64_t r = 0; r < rb.n; ++r) {
    const bool seen = l[r] != 0.0f;
    s.sub[r] = seen ? m[r] : INFINITY;  // e^(t − inf) = 0: a row with no visible key stays 0
    s.mul[r] = seen ? 1.0f / l[r] : 0.0f;
  }
  const auto set = [&](std::int64_t r, std::int64_t j, float x) { put(p.probs, rb.b, rb.h[r], rb.i[r], j, x); };
  for (std::int64_t r = 0; r < rb.n; ++r)
    for (std::int64_t j = 0; j < p.Nkv; ++j) set(r, j, 0.0f);  // keys no tile reaches
  const std::uint16_t* K = kv.k(rb.b * p.Hkv + rb.kh);
  const float scale = static_cast<float>(p.scale);
  for (std::int64_t j0 = rb.lo_min; !rb.empty() && j0 < rb.hi_max; j0 += kKeys) {
    const std::int64_t j1 = std::min(j0 + kKeys, rb.hi_max), nk = j1 - j0;
    const TileKind kind = classify(p, rb, j0, j1);
    if (kind == TileKind::skip) continue;
    gemm(path, rb.n, nk, s.dk32, s.qb.get() + h * kBr * s.dk32, s.dk32, K + j0 * 2, kv.ldk, s.s.get(), s.lds, 0,
         nullptr, scale);
    if (p.transforms_scores()) transform_scores(p, rb, j0, nk, s.s.get(), s.lds, 1);
    if (kind == TileKind::partial) apply_mask_rows(p, rb, j0, j1, s.s.get(), s.lds);
    simd::exp2_rows(s.s.get(), s.lds, rb.n, round_up(nk, simd::kColumnPad), s.sub.get(), nullptr, simd::ExpFor::bf16);
    for (std::int64_t r = 0; r < rb.n; ++r)
      for (std::int64_t j = 0; j < nk; ++j) set(r, j0 + j, s.s[r * s.lds + j] * s.mul[r]);
  }
}

}  // namespace

void forward(const Params& p) {
  const Path path = bfdot::path();
  const std::int64_t nqb = (p.Nq + kBr - 1) / kBr, npairs = (nqb + 1) / 2, items = p.B * p.Hq * npairs;
  const int threads = resolve_threads(p.threads, items);
  const PackedKV kv(p, threads);
  PerThread<Scratch> scratch(threads);
  parallel_for(items, 1, threads, [&](std::int64_t i0, std::int64_t i1, int t) {
    Scratch& s = scratch.get(t, p);
    const TileScope tiles(path);  // AMX: the tiles configured once for the chunk
    for (std::int64_t item = i0; item < i1; ++item) {
      const WideBlock wb = wide_block(p, item, nqb, npairs);
      attend(p, kv, wb, path, s);
      for (std::int64_t h = 0; h < wb.halves; ++h) {
        const RowBlock& rb = wb.half[h];
        float *o = s.o.get() + h * kBr * p.dv, *m = s.m.get() + h * kBr, *l = s.l.get() + h * kBr;
        if (!p.sinks.empty()) fold_sinks(p, rb, o, m, l);
        write_rows(p, rb, o, m, l);
        if (!p.probs.empty()) {
          write_probs(p, wb, h, kv, path, s);  // Qb is still this block's
          if (p.has_dropout()) mark_dropped_probs<float>(p, rb);
        }
      }
    }
  });
}

}  // namespace attnscale::detail::bfdot
