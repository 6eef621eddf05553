// The bf16 forward: the tiled online softmax of flash_forward.h with both products in bfloat16
// (float32 accumulation) through bf16_kernels.h. Used for bfloat16 inputs and for float32 inputs
// with Options::compute = Compute::bf16 (rounded to bfloat16 as they are packed).
//
// K and V are packed to bfloat16 once per (batch, KV head), before any query block runs:
//   Kp = K in VNNI pairs over the head dimension [dk32/2][ldk][2] (the B operand of Q·Kᵀ; ldk: PackedKV),
//   Vp = V in VNNI pairs over the keys [Nkv64/2][ldv][2] (the B operand of P·V),
// zero beyond Nkv (one tile more than needed: a tile that starts off the grid of kKeys may read
// up to 32 keys past Nkv) and beyond dk, so every query block and key tile reads them in place. Per block:
// Qb = Q rows [kBr][dk32] bf16; per key tile, in row layout (one query per row):
//   S = s · Qb·Kp  (float32),  online softmax along the rows (kernels.h),
//   Pb = bf16(P) [query][key],  O = alpha·O + Pb·Vp  (float32).
// The scale is applied to the float32 scores, not folded into Q, so Q is rounded only once.
// The optional probs recompute S tile by tile with the same GEMM (write_probs below).
#include <cstring>
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
// Row stride of Pb: a tile that starts at an odd key (a window's first key) spans kKeys + 1 key
// slots from the even key before it, rounded up to 32 for the products.
constexpr std::int64_t kPbLd = kKeys + 32;

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
  const std::uint16_t* k(std::int64_t bh) const { return ks.get() + bh * kn; }
  const std::uint16_t* v(std::int64_t bh) const { return vs.get() + bh * vn; }
  PackedKV(const Params& p, int threads)
      : dk32(round_up(p.dk, 32)), ldv(round_up(p.dv, 16)), nkv64(round_up(p.Nkv, kKeys) + kKeys),
        ldk(nkv64 + kRowSkew), kn(dk32 * ldk), vn(nkv64 * ldv), ks(p.B * p.Hkv * kn), vs(p.B * p.Hkv * vn) {
    parallel_for(p.B * p.Hkv, 1, threads, [&](std::int64_t t0, std::int64_t t1, int) {
      for (std::int64_t bh = t0; bh < t1; ++bh) {
        const std::int64_t b = bh / p.Hkv, kh = bh % p.Hkv;
        std::uint16_t* K = ks.get() + bh * kn;
        std::uint16_t* V = vs.get() + bh * vn;
        std::fill(K, K + kn, std::uint16_t{0});
        std::fill(V, V + vn, std::uint16_t{0});
        // K in blocks of 16 keys: their rows staged, then each pair of columns (one 32-bit word per
        // key) written as one 64-byte run. Written key by key, the 64 words of a key went to 64
        // lines ldk·4 bytes apart, which fall in a few L1 sets and evicted each other.
        std::vector<std::uint16_t> stage(16 * dk32, 0), vr(p.dv);
        std::uint32_t* K32 = reinterpret_cast<std::uint32_t*>(K);
        const std::uint32_t* S32 = reinterpret_cast<const std::uint32_t*>(stage.data());
        for (std::int64_t j0 = 0; j0 < p.Nkv; j0 += 16) {
          const std::int64_t n = std::min<std::int64_t>(16, p.Nkv - j0);
          for (std::int64_t x = 0; x < 16; ++x) {
            if (x < n) row_bits(p.k, b, kh, j0 + x, p.dk, stage.data() + x * dk32);
            else std::fill(stage.data() + x * dk32, stage.data() + (x + 1) * dk32, std::uint16_t{0});
          }
          for (std::int64_t w = 0; w < (p.dk + 1) / 2; ++w)
            for (std::int64_t x = 0; x < 16; ++x) K32[w * ldk + j0 + x] = S32[x * (dk32 / 2) + w];
        }
        for (std::int64_t j = 0; j < p.Nkv; ++j) {
          row_bits(p.v, b, kh, j, p.dv, vr.data());
          for (std::int64_t c = 0; c < p.dv; ++c) V[((j / 2) * ldv + c) * 2 + j % 2] = vr[c];
        }
      }
    });
  }
};

struct Scratch {
  static constexpr std::int64_t lds = kKeys;  // columns of the row-layout score tile (keys)
  std::int64_t dk32;
  Buffer<std::uint16_t> qb, pb, vt;
  Buffer<float> s;
  ForwardScratch<float> f;
  explicit Scratch(const Params& p)
      : dk32(round_up(p.dk, 32)), qb(kBr * dk32), pb(kBr * kPbLd), vt(kPbLd * round_up(p.dv, 16)), s(kBr * lds),
        f(p, kKeys) {
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

void attend(const Params& p, const PackedKV& kv, const RowBlock& rb, Path path, Scratch& s) {
  ForwardScratch<float>& f = s.f;
  f.m.fill(-INFINITY);
  f.l.fill(0.0f);
  f.o.fill(0.0f);
  for (std::int64_t r = 0; r < rb.n; ++r) row_bits(p.q, rb.b, rb.h[r], rb.i[r], p.dk, s.qb.get() + r * s.dk32);
  const std::uint16_t* K = kv.k(rb.b * p.Hkv + rb.kh);
  const std::uint16_t* V = kv.v(rb.b * p.Hkv + rb.kh);
  const float scale = static_cast<float>(p.scale);
  const std::int64_t jb = rb.lo_min, je = rb.hi_max;
  for (std::int64_t j0 = jb; !rb.empty() && j0 < je; j0 += kKeys) {
    const std::int64_t j1 = std::min(j0 + kKeys, je), nk = j1 - j0, nk16 = round_up(nk, 16), nk32 = round_up(nk, 32);
    const TileKind kind = classify(p, rb, j0, j1);
    if (kind == TileKind::skip) continue;
    // j0 need not be even (a window's first key): the pair layouts are indexed from key 0, so a
    // tile starting at an odd key begins one key earlier with that key's probability zero.
    const std::int64_t j0e = j0 & ~std::int64_t{1}, shift = j0 - j0e;
    gemm(path, rb.n, nk, s.dk32, s.qb.get(), s.dk32, K + j0 * 2, kv.ldk, s.s.get(), s.lds, 0,
         nullptr, scale);
    if (p.transforms_scores()) transform_scores(p, rb, j0, nk, s.s.get(), s.lds, 1);
    if (kind == TileKind::partial) apply_mask_rows(p, rb, j0, j1, s.s.get(), s.lds);
    simd::softmax_update_rows(s.s.get(), s.lds, rb.n, nk, f.m.get(), f.l.get(), f.alpha.get(), simd::ExpFor::bf16);
    if (p.has_dropout()) apply_dropout(p, rb, j0, nk, s.s.get(), s.lds, 1);  // l keeps every P
    // A hidden key's non-finite value must not reach a row through its zero weight (0 · NaN = NaN):
    // such a partial tile reads only the visible pairs, in float32, as flash_forward.h does.
    if (kind == TileKind::partial) {
      const Operand vo = rows_operand<float>(p.v, rb.b, rb.kh, j0, nk, p.dv, f.vp.get());
      const float* Vf = static_cast<const float*>(vo.ptr);
      if (!all_finite(Vf, vo.ld, nk, p.dv)) {
        accumulate_visible(p, rb, j0, nk, s.s.get(), s.lds, 1, Vf, vo.ld, f);
        continue;
      }
    }
    if (shift == 0) {
      to_bf16(path, s.s.get(), s.lds, rb.n, nk16, s.pb.get(), kPbLd);
      for (std::int64_t r = 0; r < rb.n; ++r) std::fill(s.pb.get() + r * kPbLd + nk16, s.pb.get() + r * kPbLd + nk32, 0);
      gemm(path, rb.n, p.dv, nk32, s.pb.get(), kPbLd, value_span(p, kv, V, j0, nk32, j0, j1, s), kv.ldv, f.o.get(),
           p.dv, 2, f.alpha.get(), 1.0f);
    } else {  // odd j0: Pb column 0 is key j0 - 1 (probability 0)
      for (std::int64_t r = 0; r < rb.n; ++r) {
        std::uint16_t* row = s.pb.get() + r * kPbLd;
        row[0] = 0;
        for (std::int64_t j = 0; j < nk; ++j) row[j + 1] = round_to_bf16(s.s[r * s.lds + j]);
        std::fill(row + nk + 1, row + kPbLd, 0);
      }
      const std::int64_t n = round_up(nk + 1, 32);
      gemm(path, rb.n, p.dv, n, s.pb.get(), kPbLd, value_span(p, kv, V, j0e, n, j0, j1, s), kv.ldv, f.o.get(), p.dv, 2,
           f.alpha.get(), 1.0f);
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
void write_probs(const Params& p, const RowBlock& rb, const PackedKV& kv, Path path, Scratch& s) {
  ForwardScratch<float>& f = s.f;
  for (std::int64_t r = 0; r < rb.n; ++r) {
    const bool seen = f.l[r] != 0.0f;
    f.sub[r] = seen ? f.m[r] : INFINITY;  // e^(t − inf) = 0: a row with no visible key stays 0
    f.mul[r] = seen ? 1.0f / f.l[r] : 0.0f;
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
    gemm(path, rb.n, nk, s.dk32, s.qb.get(), s.dk32, K + j0 * 2, kv.ldk, s.s.get(), s.lds, 0, nullptr, scale);
    if (p.transforms_scores()) transform_scores(p, rb, j0, nk, s.s.get(), s.lds, 1);
    if (kind == TileKind::partial) apply_mask_rows(p, rb, j0, j1, s.s.get(), s.lds);
    simd::exp2_rows(s.s.get(), s.lds, rb.n, round_up(nk, simd::kColumnPad), f.sub.get(), nullptr, simd::ExpFor::bf16);
    for (std::int64_t r = 0; r < rb.n; ++r)
      for (std::int64_t j = 0; j < nk; ++j) set(r, j0 + j, s.s[r * s.lds + j] * f.mul[r]);
  }
}

}  // namespace

void forward(const Params& p) {
  const Path path = bfdot::path();
  const std::int64_t nqb = (p.Nq + kBr - 1) / kBr, items = p.B * p.Hq * nqb;
  const int threads = resolve_threads(p.threads, items);
  const PackedKV kv(p, threads);
  PerThread<Scratch> scratch(threads);
  parallel_for(items, 1, threads, [&](std::int64_t i0, std::int64_t i1, int t) {
    Scratch& s = scratch.get(t, p);
    for (std::int64_t item = i0; item < i1; ++item) {
      const RowBlock rb = query_block(p, item, nqb);
      attend(p, kv, rb, path, s);
      if (!p.sinks.empty()) fold_sinks(p, rb, s.f.o.get(), s.f.m.get(), s.f.l.get());
      write_rows(p, rb, s.f.o.get(), s.f.m.get(), s.f.l.get());
      if (!p.probs.empty()) {
        write_probs(p, rb, kv, path, s);  // Qb is still this block's
        if (p.has_dropout()) mark_dropped_probs<float>(p, rb);
      }
    }
  });
}

}  // namespace attnscale::detail::bfdot
