// The bf16 backward: the five tile products of backward.cc's one pass with bfloat16 operands and
// float32 accumulation (bfdot::gemm: AMX, AVX-512 BF16 vdpbf16ps, or pairs widened to float32), for
// bfloat16 inputs and for float32 inputs with Options::compute = bf16.
//
// Tiles are transposed, St[key][query] (one query per column, as in the forward's float32
// kernel), and every product is arranged so that its bf16 operands are a row-major A and a B in
// VNNI pairs (bf16_kernels.h) that are either packed once per backward or made by converting a
// float32 tile as it lies, never by transposing one:
//   St  = s·K·Qᵀ      A = K rows [key][c]         B = Qᵀ pairs over c       (per query block, once)
//   dPt = V·dOᵀ       A = V rows [key][c]         B = dOᵀ pairs over c      (per query block, once)
//   dV += Pt·dO       A = Pt [key][query]         B = dO pairs over queries (per query block, once)
//   dK += dSt·Q       A = dSt [key][query]        B = Q pairs over queries  (per query block, once)
//   dQᵀ += Kᵀ·dS      A = Kᵀ [c][key]             B = dSt pairs over keys   (per tile: two rows at a time)
// dV and dK take two consecutive query blocks of a head at once (their Pt and dSt side by side, their
// dO and Q pairs adjacent in the packs), so their float32 accumulators go through memory once per
// 2·kBr queries.
// P and dS in between are float32 (backward.cc's masks, score transforms and softmax gradient, in
// their transposed form). dQᵀ partials of each key group are summed in group order and transposed
// once at the end. Work items and their order depend on the shape only, so the result is bitwise
// the same for any thread count.
//
// Accuracy: products of bf16-rounded operands, |rounding| <= 2^-9 relative per operand, summed in
// float32: about 3e-3 relative per product element, well inside the 1e-2 this path promises
// against the float64 reference. The normaliser pass of the float32 backward (which removes an
// error of u·|lse|, u = 2^-24) buys nothing at this precision and is not run; P = e^(t − lse).
// Rows with non-finite q, k, v or dO, and an additive mask's gradient (dbias), go to the float32
// backward instead, which handles them pair by pair.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/backward_rows.h"
#include "attention/bf16_kernels.h"
#include "attention/params.h"
#include "attention/score_transforms.h"
#include "attention/tiles.h"
#include "common/parallel.h"

namespace attnscale::detail::bfdot {
namespace {

using u16 = std::uint16_t;

// Keys per tile: twice the float32 backward's kBc. Each query block's four packed operands and its
// dQᵀ partial (96 KiB) come from L3 once per key tile, so longer tiles halve that traffic per
// product, and dQᵀ += Kᵀ·dS sums over twice the keys per load and store of its partial. With the
// operands asked ahead (Ahead, below), N = 4096, d = 128, B·H = 8, two threads, calls alternated in
// one process: time 0.92 of 64-key tiles without (docs/performance.md).
constexpr std::int64_t kKeys = 128;
// Keys per panel of a whole tile (key_blocks): St and dPt of 32 keys x kBr queries (8 KiB each)
// stay in L1 from their products through e^x, the softmax's gradient and the roundings; AMX's
// blocks are 32 rows, so the panels compute the blocks one call over the tile would.
constexpr std::int64_t kPanelKeys = 32;

// Part `part` of `parts` of a range asked ahead, for a product split into that many calls.
Ahead share(const Ahead& a, std::int64_t part, std::int64_t parts) {
  const std::size_t each = (a.bytes / parts + 63) / 64 * 64, from = std::min(a.bytes, each * part);
  return Ahead{a.p ? static_cast<const char*>(a.p) + from : nullptr, std::min(each, a.bytes - from)};
}

// Per query block (b, h, qb), packed once: the four B operands above and the rows' lse, D and
// normaliser factor padded to kBr (padding: lse = +inf and mul = 0, so P = 0; D = 0).
struct QueryPacks {
  std::int64_t dkp, dvp, ldk, ldv;  // dk, dv rounded up to 32 (inner dims) and 16 (columns)
  std::int64_t per_block;
  Buffer<u16> data;
  // Q and dO pairs over queries, each block's after the one before: two consecutive query blocks
  // of a head are one B operand over 2·kBr queries (dV and dK below sum over a pair of blocks).
  Buffer<u16> qv_all, dov_all;
  Buffer<float> rows;  // lse, D, mul: 3·kBr floats per block
  u16* qt(std::int64_t blk) const { return data.get() + blk * per_block; }
  u16* dot(std::int64_t blk) const { return qt(blk) + dkp * kBr; }
  u16* qv(std::int64_t blk) const { return qv_all.get() + blk * kBr * ldk; }
  u16* dov(std::int64_t blk) const { return dov_all.get() + blk * kBr * ldv; }
  float* lse(std::int64_t blk) const { return rows.get() + blk * 3 * kBr; }
  float* D(std::int64_t blk) const { return lse(blk) + kBr; }
  float* mul(std::int64_t blk) const { return D(blk) + kBr; }
};

// Row (b, h, i) of a [B, H, N, d] view as d bfloat16 values: copied when it is contiguous
// bfloat16, rounded 16 at a time (to_bf16) when contiguous float32, else element by element.
void bf16_row(Path path, const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d, u16* out) {
  if (t.strides[3] == 1 && t.dtype == DType::bf16) {
    const u16* row = at<const u16>(t, b, h, i, 0);
    std::copy(row, row + d, out);
    return;
  }
  std::int64_t c = 0;
  if (t.strides[3] == 1 && t.dtype == DType::f32) {
    c = d / 16 * 16;
    to_bf16(path, at<const float>(t, b, h, i, 0), 0, 1, c, out, 0);
  }
  for (; c < d; ++c) out[c] = round_to_bf16(value<float>(t, b, h, i, c));
}

// Element (k, n) of a VNNI B operand with ldb columns (bf16_kernels.h).
inline std::int64_t pair_at(std::int64_t k, std::int64_t n, std::int64_t ldb) { return ((k / 2) * ldb + n) * 2 + k % 2; }

// Rows r and r + 1 of a query block (x0, x1: d values each, zero up to an even count) into both
// pair layouts: Xᵀ's (element (c, r) at pair_at(c, r, kBr)), where row r's columns c and c + 1
// are one 32-bit word, so the transpose moves words, and X's (element (r, c) at pair_at(r, c,
// ld)), where column c of the two rows is one word, written in column order.
void put_pairs(const u16* x0, const u16* x1, std::int64_t r, std::int64_t d, u16* xt, u16* x, std::int64_t ld) {
  for (std::int64_t c = 0; c < d; c += 2) {
    std::memcpy(xt + pair_at(c, r, kBr), x0 + c, 4);
    std::memcpy(xt + pair_at(c, r + 1, kBr), x1 + c, 4);
  }
  interleave_rows(x0, x1, d, x + pair_at(r, 0, ld));
}

QueryPacks pack_queries(const BackwardParams& p, const RowStats<float>& stats, std::int64_t nqb, int threads) {
  const Path path = bfdot::path();
  QueryPacks qp;
  qp.dkp = round_up(p.dk, 32);
  qp.dvp = round_up(p.dv, 32);
  qp.ldk = round_up(p.dk, 16);
  qp.ldv = round_up(p.dv, 16);
  qp.per_block = (qp.dkp + qp.dvp) * kBr;
  const std::int64_t blocks = p.B * p.Hq * nqb;
  qp.data = Buffer<u16>(blocks * qp.per_block);
  qp.qv_all = Buffer<u16>(blocks * kBr * qp.ldk);
  qp.dov_all = Buffer<u16>(blocks * kBr * qp.ldv);
  qp.rows = Buffer<float>(blocks * 3 * kBr);
  parallel_for(blocks, 1, threads, [&](std::int64_t t0, std::int64_t t1, int) {
    for (std::int64_t blk = t0; blk < t1; ++blk) {
      const std::int64_t qb = blk % nqb, bh = blk / nqb, b = bh / p.Hq, h = bh % p.Hq, i0 = qb * kBr;
      const std::int64_t n = std::min(kBr, p.Nq - i0);
      std::fill(qp.qt(blk), qp.qt(blk) + qp.per_block, u16(0));
      std::fill(qp.qv(blk), qp.qv(blk) + kBr * qp.ldk, u16(0));
      std::fill(qp.dov(blk), qp.dov(blk) + kBr * qp.ldv, u16(0));
      // Two rows at a time (the second zero past n), each zero past its d.
      std::vector<u16> q0(qp.dkp, 0), q1(qp.dkp, 0), o0(qp.dvp, 0), o1(qp.dvp, 0);
      for (std::int64_t r = 0; r < n; r += 2) {
        bf16_row(path, p.q, b, h, i0 + r, p.dk, q0.data());
        bf16_row(path, p.dO, b, h, i0 + r, p.dv, o0.data());
        if (r + 1 < n) {
          bf16_row(path, p.q, b, h, i0 + r + 1, p.dk, q1.data());
          bf16_row(path, p.dO, b, h, i0 + r + 1, p.dv, o1.data());
        } else {
          std::fill(q1.begin(), q1.end(), u16(0));
          std::fill(o1.begin(), o1.end(), u16(0));
        }
        put_pairs(q0.data(), q1.data(), r, p.dk, qp.qt(blk), qp.qv(blk), qp.ldk);
        put_pairs(o0.data(), o1.data(), r, p.dv, qp.dot(blk), qp.dov(blk), qp.ldv);
      }
      const std::int64_t row = stats.at(p, b, h, i0);
      for (std::int64_t r = 0; r < kBr; ++r) {
        qp.lse(blk)[r] = r < n ? stats.lse[row + r] : std::numeric_limits<float>::infinity();
        qp.D(blk)[r] = r < n ? stats.D[row + r] : 0.0f;
        qp.mul(blk)[r] = r < n ? stats.mul[row + r] : 0.0f;
      }
    }
  });
  return qp;
}

struct Scratch {
  // pb and dsb: Pt and dSt of a pair of query blocks side by side, [key][2·kBr].
  Buffer<float> st, dpt, dcap, dk_acc, dv_acc;
  Buffer<u16> kr, vr, ktr, pb, dsb, dsv;
  Scratch(const BackwardParams& p, const QueryPacks& qp)
      : st(kKeys * kBr), dpt(kKeys * kBr), dcap(kKeys * kBr), dk_acc(kKeys * p.dk), dv_acc(kKeys * p.dv),
        kr(kKeys * qp.dkp), vr(kKeys * qp.dvp), ktr(round_up(p.dk, 16) * kKeys), pb(kKeys * 2 * kBr), dsb(kKeys * 2 * kBr),
        dsv(kKeys * kBr) {}
};

// Rows [j0, j0 + nk) of a [B, H, N, d] view at (b, h) as bf16 rows of ld columns (zero past d and
// past nk, up to kKeys rows); with Xt, also transposed, Xt[c][j] (kKeys columns, round_up(d, 16)
// rows: an A operand of gemm, bf16_kernels.h).
void pack_key_rows(Path path, const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t nk,
                   std::int64_t d, u16* X, std::int64_t ld, u16* Xt) {
  std::fill(X, X + kKeys * ld, u16(0));
  for (std::int64_t j = 0; j < nk; ++j) bf16_row(path, t, b, h, j0 + j, d, X + j * ld);
  if (!Xt) return;
  // Xt by blocks of 16 keys (X's rows past nk are zero), in registers (transpose_halves16): value
  // by value, the column writes went to d lines kKeys·2 bytes apart for every key. Zero where no
  // block writes: the columns past the last block, the rows past d (an A operand's padding).
  const std::int64_t keys16 = round_up(nk, 16);
  for (std::int64_t c = 0; c < d; ++c) std::fill(Xt + c * kKeys + keys16, Xt + (c + 1) * kKeys, u16(0));
  std::fill(Xt + d * kKeys, Xt + round_up(d, 16) * kKeys, u16(0));
  const u16* rows[16];
  for (std::int64_t x0 = 0; x0 < keys16; x0 += 16) {
    for (std::int64_t x = 0; x < 16; ++x) rows[x] = X + (x0 + x) * ld;
    transpose_halves16(rows, static_cast<std::size_t>(d), Xt + x0, kKeys);
  }
}

// Key blocks [kb0, kb1) of (b, kh), in order, against every query block of the group's heads.
void key_blocks(const BackwardParams& p, const QueryPacks& qp, std::int64_t nqb, std::int64_t b, std::int64_t kh,
                std::int64_t kb0, std::int64_t kb1, float* dqt, Scratch& s) {
  const Path path = bfdot::path();
  const float scale = static_cast<float>(p.scale);
  // As the forward (bf16_forward.cc): the scale applied where e^(t − lse) reads the scores, the same
  // bits, so that the score product's tiles are stored in place.
  const bool fold = p.scale_when_exp_reads();
  // Where the path has vcvtneps2bf16 and the scores are read scaled, a panel's Pt and dSt are
  // rounded to bfloat16 by the passes that make them.
  const bool fused = fold && bfdot::vdpbf16ps_path(path);
  for (std::int64_t kb = kb0; kb < kb1; ++kb) {
    const std::int64_t j0 = kb * kKeys, j1 = std::min(p.Nkv, j0 + kKeys), nk = j1 - j0;
    pack_key_rows(path, p.k, b, kh, j0, nk, p.dk, s.kr.get(), qp.dkp, s.ktr.get());
    pack_key_rows(path, p.v, b, kh, j0, nk, p.dv, s.vr.get(), qp.dvp, nullptr);
    s.dk_acc.fill(0.0f);
    s.dv_acc.fill(0.0f);
    for (std::int64_t h = kh * p.group(); h < (kh + 1) * p.group(); ++h)
      for (std::int64_t qp0 = 0; qp0 < nqb; qp0 += 2) {
        // A pair of query blocks: each block's St, dPt, dS and dQᵀ in turn, its bf16 Pt and dSt in
        // its half of pb and dsb; then dV and dK once over the pair's queries (2·kBr, or kBr when
        // one block is the last of the head or sees none of the tile). Their float32 accumulators
        // are then loaded and stored once per 128 queries instead of once per 64.
        const std::int64_t qp1 = std::min(nqb, qp0 + 2);  // the pair: blocks [qp0, qp1)
        std::int64_t first = -1, used = 0;                 // the pair's first block with work, blocks with work
        for (std::int64_t qb = qp0; qb < qp1; ++qb) {
          const std::int64_t i0 = qb * kBr, i1 = std::min(p.Nq, i0 + kBr);
          const KeyRange lo_row = key_range(p, i0), hi_row = key_range(p, i1 - 1);
          if (hi_row.hi <= j0 || lo_row.lo >= j1) continue;
          RowBlock rb;
          rb.b = b;
          rb.kh = kh;
          for (std::int64_t i = i0; i < i1; ++i) rb.add(p, h, i);
          const TileKind kind = classify(p, rb, j0, j1);
          if (kind == TileKind::skip) continue;
          const std::int64_t blk = (b * p.Hq + h) * nqb + qb;
          if (used == 0) first = blk;
          u16* const pb = s.pb.get() + used * kBr;
          u16* const dsb = s.dsb.get() + used * kBr;
          ++used;
          // Each product asks for the operands of one after it (into L2, a few lines a tile): St this
          // block's dOᵀ pairs, dPt its dQᵀ partial, dQᵀ the next block's Qᵀ pairs or the pair's dO.
          const Ahead st_ahead{qp.dot(blk), std::size_t(qp.dvp * kBr * 2)};
          const Ahead dpt_ahead{dqt + blk * p.dk * kBr, std::size_t(p.dk * kBr * 4)};
          // The steps over keys [r0, r0 + n) of the tile, their St and dPt at the start of s.st and
          // s.dpt: St = s·K·Qᵀ; Pt = e^(St − lse)·mul; dPt = V·dOᵀ; Pt, dSt and dSt's pairs (the B of
          // dQᵀ += Kᵀ·dS, zero up to r0 + pad) rounded to bfloat16 into their operands' rows r0 on.
          const auto scores = [&](std::int64_t r0, std::int64_t n, Ahead ahead) {
            gemm(path, n, kBr, qp.dkp, s.kr.get() + r0 * qp.dkp, qp.dkp, qp.qt(blk), kBr, s.st.get(), kBr, 0, nullptr,
                 fold ? 1.0f : scale, ahead);
          };
          const auto probabilities = [&](std::int64_t n) {
            if (fold) simd::exp2_columns_bf16_scaled(s.st.get(), kBr, n, kBr, qp.lse(blk), qp.mul(blk), scale);
            else simd::exp2_columns(s.st.get(), kBr, n, kBr, qp.lse(blk), qp.mul(blk), simd::ExpFor::bf16);
          };
          const auto output_grads = [&](std::int64_t r0, std::int64_t n, Ahead ahead) {
            gemm(path, n, kBr, qp.dvp, s.vr.get() + r0 * qp.dvp, qp.dvp, qp.dot(blk), kBr, s.dpt.get(), kBr, 0, nullptr,
                 1.0f, ahead);
          };
          const auto round_rows = [&](std::int64_t r0, std::int64_t n, std::int64_t pad) {
            to_bf16(path, s.st.get(), kBr, n, kBr, pb + r0 * 2 * kBr, 2 * kBr);
            to_bf16(path, s.dpt.get(), kBr, n, kBr, dsb + r0 * 2 * kBr, 2 * kBr);
            to_bf16_pairs(path, s.dpt.get(), kBr, n, pad, kBr, s.dsv.get() + r0 * kBr, kBr);
          };
          if (nk == kKeys && kind == TileKind::full && !p.transforms_scores() && !p.has_dropout()) {
            // By panels of kPanelKeys keys, so that the products' stores and the passes over them
            // stay in L1 (the same bits).
            for (std::int64_t r0 = 0; r0 < kKeys; r0 += kPanelKeys) {
              const std::int64_t part = r0 / kPanelKeys, parts = kKeys / kPanelKeys;
              scores(r0, kPanelKeys, share(st_ahead, part, parts));
              if (fused) {
                simd::exp2_columns_bf16_scaled_to(s.st.get(), kBr, kPanelKeys, kBr, qp.lse(blk), qp.mul(blk), scale,
                                                  pb + r0 * 2 * kBr, 2 * kBr);
                output_grads(r0, kPanelKeys, share(dpt_ahead, part, parts));
                simd::softmax_grad_to_bf16(s.st.get(), s.dpt.get(), kBr, kPanelKeys, kBr, qp.D(blk), scale,
                                           dsb + r0 * 2 * kBr, 2 * kBr, s.dsv.get() + r0 * kBr, kBr);
                continue;
              }
              probabilities(kPanelKeys);
              output_grads(r0, kPanelKeys, share(dpt_ahead, part, parts));
              Ops<float>::softmax_grad(s.st.get(), s.dpt.get(), kBr, kPanelKeys, kBr, qp.D(blk), scale);
              round_rows(r0, kPanelKeys, kPanelKeys);
            }
          } else {
            scores(0, nk, st_ahead);  // then the score transforms and the mask
            if (p.transforms_scores()) transform_scores(p, rb, j0, nk, s.st.get(), 1, kBr, s.dcap.get());
            if (kind == TileKind::partial) apply_mask(p, rb, j0, j1, s.st.get(), kBr);
            probabilities(nk);
            // dPt (dropout: Z∘dPt/(1 − p)), dSt = s·Pt∘(dPt − D) (soft-cap: ∘ dcap).
            output_grads(0, nk, dpt_ahead);
            if (p.has_dropout()) apply_dropout(p, rb, j0, nk, s.dpt.get(), 1, kBr);
            Ops<float>::softmax_grad(s.st.get(), s.dpt.get(), kBr, nk, kBr, qp.D(blk), scale);
            if (p.softcap > 0) scale_by_cap(rb, nk, s.dpt.get(), s.dcap.get(), 1, kBr);
            if (p.has_dropout()) apply_dropout(p, rb, j0, nk, s.st.get(), 1, kBr);  // dV takes Z∘P/(1 − p)
            round_rows(0, nk, kKeys);
          }
          const bool next = qb + 1 < qp1;
          gemm(path, p.dk, kBr, kKeys, s.ktr.get(), kKeys, s.dsv.get(), kBr, dqt + blk * p.dk * kBr, kBr, 1, nullptr,
               1.0f,
               next ? Ahead{qp.qt(blk + 1), std::size_t(qp.dkp * kBr * 2)}
                    : Ahead{qp.dov(first), std::size_t(used * kBr * qp.ldv * 2)});
        }
        if (used == 0) continue;
        // dV += Pt·dO and dK += dSt·Q over the pair's queries: its blocks with work (one, or both,
        // adjacent) have their dO and Q pairs one after the other, one operand.
        const std::int64_t inner = used * kBr;
        const std::int64_t after = (b * p.Hq + h) * nqb + qp1;
        const bool more = after < p.B * p.Hq * nqb;
        gemm(path, nk, p.dv, inner, s.pb.get(), 2 * kBr, qp.dov(first), qp.ldv, s.dv_acc.get(), p.dv, 1, nullptr, 1.0f,
             Ahead{qp.qv(first), std::size_t(inner * qp.ldk * 2)});
        gemm(path, nk, p.dk, inner, s.dsb.get(), 2 * kBr, qp.qv(first), qp.ldk, s.dk_acc.get(), p.dk, 1, nullptr, 1.0f,
             more ? Ahead{qp.qt(after), std::size_t(qp.dkp * kBr * 2)} : Ahead{});
      }
    write_rows(p.dK, b, kh, j0, nk, p.dk, s.dk_acc.get());
    write_rows(p.dV, b, kh, j0, nk, p.dv, s.dv_acc.get());
  }
}

// Whether some float32 value of x[0, n) is not finite once rounded to bfloat16: NaN, ±inf, or a
// magnitude that rounds up to infinity (bits 0x7f7f8000 and above with the sign cleared: halfway
// past bfloat16's largest value, 0x7f7f, whose last bit is odd). A largest magnitude over the row,
// tested once (a loop that vectorises).
bool any_nonfinite_as_bf16(const FloatBits* x, std::int64_t n) {
  std::uint32_t largest = 0;
  for (std::int64_t c = 0; c < n; ++c) largest = std::max<std::uint32_t>(largest, x[c] & 0x7fffffffu);
  return largest >= 0x7f7f8000u;
}

// Whether every value of a [B, H, N, d] view is finite as the bf16 backward takes it (float32
// rounded to bfloat16: a finite float32 above bfloat16's range is not; 0 · inf would then reach
// pairs a mask hides), (b, h) slices in parallel. Contiguous float32 and bfloat16 rows are tested
// by their bits (any_nonfinite_as_bf16, any_nonfinite_bits), a slice's rows in one run where they
// follow each other; other layouts value by value, rounded.
bool all_finite_view(const TensorView& t, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t d, int threads) {
  std::atomic<bool> finite{true};
  const bool bits = t.strides[3] == 1 && (t.dtype == DType::f32 || t.dtype == DType::bf16);
  const bool run = bits && t.strides[2] == d;  // a slice's N rows as one run of N·d values
  parallel_for(B * H, 1, resolve_threads(threads, B * H), [&](std::int64_t s0, std::int64_t s1, int) {
    for (std::int64_t s = s0; s < s1 && finite.load(std::memory_order_relaxed); ++s)
      for (std::int64_t i = 0; i < (run ? 1 : N); ++i) {
        bool bad = false;
        const std::int64_t n = run ? N * d : d;
        if (bits && t.dtype == DType::f32) {
          bad = any_nonfinite_as_bf16(at<const FloatBits>(t, s / H, s % H, i, 0), n);
        } else if (bits) {
          bad = any_nonfinite_bits(at<const std::uint16_t>(t, s / H, s % H, i, 0), n);
        } else {
          for (std::int64_t c = 0; c < d; ++c)
            bad |= !std::isfinite(attnscale::from_bf16(attnscale::to_bf16(value<float>(t, s / H, s % H, i, c))));
        }
        if (bad) {
          finite = false;
          break;
        }
      }
  });
  return finite;
}

bool inputs_finite(const BackwardParams& p) {
  return all_finite_view(p.q, p.B, p.Hq, p.Nq, p.dk, p.threads) && all_finite_view(p.dO, p.B, p.Hq, p.Nq, p.dv, p.threads) &&
         all_finite_view(p.k, p.B, p.Hkv, p.Nkv, p.dk, p.threads) && all_finite_view(p.v, p.B, p.Hkv, p.Nkv, p.dv, p.threads);
}

inline constexpr std::int64_t kMinKeyTasks = 8;                  // as backward.cc
inline constexpr std::int64_t kMaxPartialBytes = std::int64_t{64} << 20;

}  // namespace

bool backward_handles(const BackwardParams& p) { return p.dBias.empty() && inputs_finite(p); }

void backward(const BackwardParams& p) {
  const std::int64_t nkb = (p.Nkv + kKeys - 1) / kKeys, nqb = (p.Nq + kBr - 1) / kBr, heads = p.B * p.Hkv;
  const std::int64_t dq_size = p.B * p.Hq * nqb * kBr * p.dk;
  std::int64_t groups = std::clamp<std::int64_t>((kMinKeyTasks + heads - 1) / heads, 1, std::max<std::int64_t>(nkb, 1));
  if (groups * dq_size * std::int64_t(sizeof(float)) > kMaxPartialBytes) groups = 1;
  const std::int64_t per = (nkb + groups - 1) / groups;
  const int threads = resolve_threads(p.threads, std::max(heads * groups, p.B * p.Hq * nqb));
  const RowStats<float> stats = row_stats<float>(p, threads, /*rows_finite=*/false);  // inputs_finite() held
  if (!p.dSinks.empty()) write_sink_grads(p, stats);
  const QueryPacks qp = pack_queries(p, stats, nqb, threads);
  Buffer<float> partials(groups * dq_size);  // dQᵀ per (group, b, h, query block): [dk][kBr]
  const std::int64_t blocks = groups * p.B * p.Hq * nqb, block_size = p.dk * kBr;  // in parallel even for G = 1
  parallel_for(blocks, 16, threads, [&](std::int64_t b0, std::int64_t b1, int) {
    std::fill(partials.get() + b0 * block_size, partials.get() + b1 * block_size, 0.0f);
  });
  PerThread<Scratch> scratch(threads);
  parallel_for(heads * groups, 1, threads, [&](std::int64_t t0, std::int64_t t1, int t) {
    const TileScope tiles(bfdot::path());  // AMX: the tiles configured once for the chunk
    for (std::int64_t item = t0; item < t1; ++item) {
      const std::int64_t g = item % groups, head = item / groups;  // under a causal mask, early keys cost most
      key_blocks(p, qp, nqb, head / p.Hkv, head % p.Hkv, g * per, std::min(nkb, (g + 1) * per),
                 partials.get() + g * dq_size, scratch.get(t, p, qp));
    }
  });
  // dQ = Σ_g partial_g in group order, transposed back to rows.
  parallel_for(p.B * p.Hq * nqb, 1, threads, [&](std::int64_t t0, std::int64_t t1, int) {
    std::vector<float> rows(kBr * p.dk);
    for (std::int64_t blk = t0; blk < t1; ++blk) {
      const std::int64_t qb = blk % nqb, bh = blk / nqb, i0 = qb * kBr, n = std::min(kBr, p.Nq - i0);
      const float* first = partials.get() + blk * p.dk * kBr;
      for (std::int64_t c = 0; c < p.dk; ++c)
        for (std::int64_t r = 0; r < n; ++r) {
          float x = first[c * kBr + r];
          for (std::int64_t g = 1; g < groups; ++g) x += first[g * dq_size + c * kBr + r];
          rows[r * p.dk + c] = x;
        }
      write_rows(p.dQ, bh / p.Hq, bh % p.Hq, i0, n, p.dk, rows.data());
    }
  });
}

}  // namespace attnscale::detail::bfdot
