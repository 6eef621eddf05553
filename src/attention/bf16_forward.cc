// The bf16 forward: the tiled online softmax of flash_forward.h with both products in bfloat16
// (float32 accumulation) through bf16_kernels.h. Used for bfloat16 inputs and for float32 inputs
// with Options::compute = Compute::bf16 (rounded to bfloat16 as they are packed).
//
// Per block: Qp = Q in VNNI pairs [dk/2][kBr][2]; per key tile: Kb = K rows [kBc][dk] bf16,
//   St = s·log2(e) · Kb·Qp  (float32),  softmax update in float32 (kernels.h),
//   Pb = P transposed to rows [query][key] bf16,  Vp = V in pairs [kBc/2][dv][2],
//   O  = alpha·O + Pb·Vp  (float32).
// The scale is applied to the float32 scores, not folded into Q, so Q is rounded only once.
#include <cstring>
#include <memory>
#include <vector>

#include "attention/bf16_kernels.h"
#include "attention/flash_forward.h"
#include "common/parallel.h"

namespace attnscale::detail::bfdot {
namespace {

// Round to nearest even (NaN kept quiet), as to_bf16 does, inline for the packing loops.
inline std::uint16_t round_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
// Element (a, b, c, d) of a float32 or bfloat16 view as bfloat16 bits.
inline std::uint16_t bits(const TensorView& t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  if (t.dtype == DType::bf16) return at<const std::uint16_t>(t, a, b, c, d)[0];
  if (t.dtype == DType::f32) return round_bf16(*at<const float>(t, a, b, c, d));
  return round_bf16(value<float>(t, a, b, c, d));
}

struct Scratch {
  std::int64_t dk32, ldv;
  Buffer<std::uint16_t> qp, kb, pb, vp;
  ForwardScratch<float> f;
  explicit Scratch(const Params& p)
      : dk32(round_up(p.dk, 32)), ldv(round_up(p.dv, 16)), qp(dk32 * kBr), kb(kBc * dk32), pb(kBr * kBc),
        vp(kBc * ldv), f(p) {
    qp.fill(0);
    kb.fill(0);
    pb.fill(0);
    vp.fill(0);
  }
};

void attend(const Params& p, const RowBlock& rb, Path path, Scratch& s) {
  ForwardScratch<float>& f = s.f;
  f.m.fill(-INFINITY);
  f.l.fill(0.0f);
  f.o.fill(0.0f);
  const std::int64_t ld = f.ld;
  std::fill(s.qp.get(), s.qp.get() + s.dk32 * ld, 0);
  for (std::int64_t r = 0; r < rb.n; ++r)
    for (std::int64_t c = 0; c < p.dk; ++c)
      s.qp[((c / 2) * ld + r) * 2 + c % 2] = bits(p.q, rb.b, rb.h[r], rb.i[r], c);
  const float scale = static_cast<float>(p.scale * kLog2e);
  const std::int64_t jb = rb.lo_min, je = rb.hi_max;
  for (std::int64_t j0 = jb; !rb.empty() && j0 < je; j0 += kBc) {
    const std::int64_t j1 = std::min(j0 + kBc, je), nk = j1 - j0, nk32 = round_up(nk, 32);
    const TileKind kind = classify(p, rb, j0, j1);
    if (kind == TileKind::skip) continue;
    for (std::int64_t j = 0; j < kBc; ++j)
      for (std::int64_t c = 0; c < p.dk; ++c)
        s.kb[j * s.dk32 + c] = j < nk ? bits(p.k, rb.b, rb.kh, j0 + j, c) : 0;
    gemm(path, nk, columns(rb), s.dk32, s.kb.get(), s.dk32, s.qp.get(), ld, f.st.get(), ld, 0, nullptr, scale);
    if (kind == TileKind::partial) apply_mask(p, rb, j0, j1, f.st.get(), ld);
    Ops<float>::softmax_update(f.st.get(), ld, nk, columns(rb), f.m.get(), f.l.get(), f.alpha.get());
    // A hidden key's non-finite value must not reach a row through P = 0 (0 · NaN = NaN): such
    // partial tiles take the float32 path that reads only the visible pairs, as flash_forward.h does.
    if (kind == TileKind::partial) {
      const Operand v = rows_operand<float>(p.v, rb.b, rb.kh, j0, nk, p.dv, f.vp.get());
      if (!all_finite(static_cast<const float*>(v.ptr), v.ld, nk, p.dv)) {
        accumulate_visible(p, rb, j0, nk, static_cast<const float*>(v.ptr), v.ld, f);
        continue;
      }
    }
    for (std::int64_t r = 0; r < rb.n; ++r)
      for (std::int64_t j = 0; j < nk32; ++j) s.pb[r * kBc + j] = j < nk ? round_bf16(f.st[j * ld + r]) : 0;
    for (std::int64_t j = 0; j < nk32; ++j)
      for (std::int64_t c = 0; c < p.dv; ++c)
        s.vp[((j / 2) * s.ldv + c) * 2 + j % 2] = j < nk ? bits(p.v, rb.b, rb.kh, j0 + j, c) : 0;
    gemm(path, rb.n, p.dv, nk32, s.pb.get(), kBc, s.vp.get(), s.ldv, f.o.get(), p.dv, 2, f.alpha.get(), 1.0f);
  }
}

}  // namespace

void forward(const Params& p) {
  const Path path = bfdot::path();
  const std::int64_t nqb = (p.Nq + kBr - 1) / kBr, items = p.B * p.Hq * nqb;
  const int threads = resolve_threads(p.threads, items);
  std::vector<std::unique_ptr<Scratch>> scratch(threads);
  parallel_for(items, 1, threads, [&](std::int64_t i0, std::int64_t i1, int t) {
    if (!scratch[t]) scratch[t] = std::make_unique<Scratch>(p);
    Scratch& s = *scratch[t];
    for (std::int64_t item = i0; item < i1; ++item) {
      const std::int64_t qb = nqb - 1 - item % nqb, bh = item / nqb, b = bh / p.Hq, h = bh % p.Hq;
      RowBlock rb;
      rb.b = b;
      rb.kh = p.kv_head(h);
      for (std::int64_t i = qb * kBr; i < std::min(p.Nq, (qb + 1) * kBr); ++i) rb.add(p, h, i);
      attend(p, rb, path, s);
      write_rows(p, rb, s.f.o.get(), s.f.m.get(), s.f.l.get());
      if (!p.probs.empty()) {  // float32 recomputation with the bf16 statistics, from Q·s·log2(e) in qt
        pack_transposed<float>(p.q, rb, p.dk, p.scale * kLog2e, s.f.qt.get(), s.f.ld);
        write_probs(p, rb, s.f);
      }
    }
  });
}

}  // namespace attnscale::detail::bfdot
