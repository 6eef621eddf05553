// Fuzz target: forward() and backward() on fuzzed shapes, strides, masks, scales and values.
//
// Each input decodes into one attention problem: dims (including zero and mismatched ones),
// rank 2..4 views with permuted, padded, reversed and (for inputs) zero strides over buffers of
// exactly the bytes they span (so AddressSanitizer sees any stray access), a causal/window/
// explicit mask, and values mixing ordinary numbers, huge and denormal magnitudes, ±0, ±inf and
// NaN. Checked:
//   - the fast path throws attnscale::Error exactly when the float64 reference does, and then
//     leaves every output untouched;
//   - a row whose inputs are clean (finite q row; finite k, v rows and mask values for every
//     visible key) matches the reference within a bound derived from its logits' magnitude, has
//     probabilities summing to 1, and is never NaN — NaN and inf stay in the rows they touch;
//   - a row with no visible key has out = 0, lse = -inf, probs = 0;
//   - outputs are bitwise the same for 1 and 3 threads;
//   - backward throws exactly when its reference does, and on problems with finite inputs and
//     moderate logits its gradients match the reference.
#include <FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "attention/params.h"
#include "attention/score_transforms.h"
#include "attnscale/attention.h"
#include "attnscale/error.h"

namespace {
using namespace attnscale;

[[noreturn]] void fuzz_fail(const char* what, double a = 0, double b = 0) {
  std::fprintf(stderr, "attention_fuzz: %s (%.17g vs %.17g)\n", what, a, b);
  std::abort();
}

// A view over a buffer of exactly the bytes it spans.
struct Buffer {
  std::vector<unsigned char> bytes;
  TensorView view;

  double get(const std::int64_t* idx) const { return detail::load(view, element_ptr(idx)); }
  void set(const std::int64_t* idx, double x) { detail::store(view, element_ptr(idx), x); }
  void* element_ptr(const std::int64_t* idx) const {
    std::int64_t off = 0;
    for (int d = 0; d < view.rank; ++d) off += idx[d] * view.strides[d];
    return static_cast<char*>(view.data) + off * static_cast<std::int64_t>(dtype_size(view.dtype));
  }
};

// Calls fn(idx) for every index of a rank-r shape, C order.
template <class Fn>
void for_each_index(int rank, const std::int64_t* shape, Fn fn) {
  for (int d = 0; d < rank; ++d)
    if (shape[d] <= 0) return;
  std::int64_t idx[4] = {0, 0, 0, 0};
  while (true) {
    fn(idx);
    int d = rank - 1;
    for (; d >= 0 && ++idx[d] == shape[d]; --d) idx[d] = 0;
    if (d < 0) return;
  }
}

Buffer make_buffer(FuzzedDataProvider& in, DType dtype, int rank, const std::int64_t* shape, bool input) {
  Buffer b;
  b.view.dtype = dtype;
  b.view.rank = rank;
  int perm[4] = {0, 1, 2, 3};
  if (in.ConsumeBool()) {  // a permuted memory order, e.g. [B, N, H, d] viewed as [B, H, N, d]
    for (int d = rank - 1; d > 0; --d) std::swap(perm[d], perm[in.ConsumeIntegralInRange(0, d)]);
  }
  std::int64_t stride = 1;
  for (int m = rank - 1; m >= 0; --m) {
    const int d = perm[m];
    b.view.shape[d] = shape[d];
    b.view.strides[d] = stride;
    stride *= std::max<std::int64_t>(shape[d], 0) + in.ConsumeIntegralInRange(0, 2);  // padding
  }
  for (int d = 0; d < rank; ++d) {
    const int kind = in.ConsumeIntegralInRange(0, 7);
    if (kind == 1) b.view.strides[d] = -b.view.strides[d];  // reversed
    if (kind == 2 && input) b.view.strides[d] = 0;           // broadcast: every index aliases one
  }
  std::int64_t lo = 0, hi = 0;
  for (int d = 0; d < rank; ++d) {
    const std::int64_t ext = (std::max<std::int64_t>(shape[d], 1) - 1) * b.view.strides[d];
    lo += std::min<std::int64_t>(ext, 0);
    hi += std::max<std::int64_t>(ext, 0);
  }
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(dtype));
  b.bytes.assign(static_cast<std::size_t>((hi - lo + 1) * esize), 0);
  b.view.data = b.bytes.data() - lo * esize;
  return b;
}

double fuzz_value(FuzzedDataProvider& in, double magnitude) {
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 0: return std::numeric_limits<double>::quiet_NaN();
    case 1: return in.ConsumeBool() ? INFINITY : -INFINITY;
    case 2: return in.ConsumeBool() ? 0.0 : -0.0;
    case 3: return (in.ConsumeBool() ? 1 : -1) * std::numeric_limits<float>::denorm_min() * in.ConsumeIntegralInRange(1, 1000);
    default: return magnitude * (2.0 * in.ConsumeProbability<double>() - 1.0);
  }
}

void fill(FuzzedDataProvider& in, Buffer& b, double magnitude, bool specials) {
  for_each_index(b.view.rank, b.view.shape.data(), [&](const std::int64_t* idx) {
    b.set(idx, specials ? fuzz_value(in, magnitude) : magnitude * (2.0 * in.ConsumeProbability<double>() - 1.0));
  });
}

// Poisons an output so that elements a kernel forgets to write (or writes after an Error) show.
void poison(Buffer& b) {
  for_each_index(b.view.rank, b.view.shape.data(), [&](const std::int64_t* idx) { b.set(idx, -12345.0); });
}

bool untouched(const Buffer& b) {
  bool ok = true;
  for_each_index(b.view.rank, b.view.shape.data(), [&](const std::int64_t* idx) {
    if (b.get(idx) != (b.view.dtype == DType::bf16 ? from_bf16(to_bf16(-12345.0f)) : -12345.0)) ok = false;
  });
  return ok;
}

double eps_of(DType t) {
  return t == DType::f64 ? 0x1p-52 : t == DType::f32 ? 0x1p-23 : 0x1p-7;
}

// The smallest subnormal: below the normal range rounding errors are absolute, this big each.
double subnormal_of(DType t) {
  return t == DType::f64 ? 0x1p-1074 : t == DType::f32 ? 0x1p-149 : 0x1p-133;
}

// The problem's logical shape (rank-4, before any fuzzed corruption or rank reduction).
struct Dims {
  std::int64_t B, Hq, Hkv, Nq, Nkv, dk, dv;
};

bool throws(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error&) {
    return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const DType dtype = in.PickValueInArray({DType::f32, DType::f32, DType::f64, DType::bf16});
  Dims d;
  d.B = in.ConsumeIntegralInRange<std::int64_t>(1, 2);
  d.Hkv = in.ConsumeIntegralInRange<std::int64_t>(1, 2);
  d.Hq = d.Hkv * in.ConsumeIntegralInRange<std::int64_t>(1, 3);
  d.Nq = in.ConsumeIntegralInRange<std::int64_t>(1, 9);
  d.Nkv = in.ConsumeIntegralInRange<std::int64_t>(1, 11);
  d.dk = in.ConsumeIntegralInRange<std::int64_t>(1, 9);
  d.dv = in.ConsumeIntegralInRange<std::int64_t>(1, 5);
  // Rank 2 and 3 views drop leading dims, which must then be 1.
  const int rank = in.ConsumeIntegralInRange(2, 4);
  if (rank < 4) d.B = 1;
  if (rank < 3) d.Hq = d.Hkv = 1;
  std::int64_t qs[4] = {d.B, d.Hq, d.Nq, d.dk}, ks[4] = {d.B, d.Hkv, d.Nkv, d.dk}, vs[4] = {d.B, d.Hkv, d.Nkv, d.dv};
  // Sometimes an invalid problem: a zero or mismatched dimension somewhere.
  const bool corrupt = in.ConsumeIntegralInRange(0, 9) == 0;
  if (corrupt) {
    std::int64_t* all[3] = {qs, ks, vs};
    all[in.ConsumeIntegralInRange(0, 2)][in.ConsumeIntegralInRange(0, 3)] = in.ConsumeIntegralInRange<std::int64_t>(0, 4);
  }
  const auto tail = [&](std::int64_t* s) { return s + (4 - rank); };
  Buffer q = make_buffer(in, dtype, rank, tail(qs), true);
  Buffer k = make_buffer(in, dtype, rank, tail(ks), true);
  Buffer v = make_buffer(in, dtype, rank, tail(vs), true);

  // Magnitudes: logits of order |q||k|·dk·s range from tiny to ~1e4 and beyond.
  const double qk_mag = in.PickValueInArray({1e-3, 1.0, 3.0, 30.0, 100.0});
  const double v_mag = in.PickValueInArray({1.0, 1e-20, 1e3});
  const bool specials = in.ConsumeIntegralInRange(0, 3) == 0;
  fill(in, q, qk_mag, specials);
  fill(in, k, qk_mag, specials);
  fill(in, v, v_mag, specials);

  Options opt;
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0: opt.scale = Scale::rule(ScaleRule::none); break;
    case 1: opt.scale = Scale::rule(ScaleRule::linear); break;
    case 2: {
      const double s = in.PickValueInArray({0.0, -1.0, 1e-30, 2.0, 1e30, (double)INFINITY, std::nan("")});
      if (!std::isfinite(s)) {
        if (!throws([&] { Scale::value(s); })) fuzz_fail("Scale::value accepted a non-finite value", s);
      } else {
        opt.scale = Scale::value(s);
      }
      break;
    }
    default: break;  // sqrt
  }
  opt.mask.causal = in.ConsumeBool();
  opt.mask.align = in.ConsumeBool() ? Align::bottom_right : Align::top_left;
  if (in.ConsumeBool()) {
    opt.mask.window_left = in.ConsumeIntegralInRange<std::int64_t>(-2, 12);
    opt.mask.window_right = in.ConsumeIntegralInRange<std::int64_t>(-2, 12);
  }
  Buffer mask;
  if (in.ConsumeBool()) {
    const DType mt = in.PickValueInArray({DType::u8, DType::f32, DType::f64});
    const int mrank = in.ConsumeIntegralInRange(2, 4);
    std::int64_t ms[4] = {in.ConsumeBool() ? 1 : d.B, in.ConsumeBool() ? 1 : d.Hq, d.Nq, d.Nkv};
    if (in.ConsumeIntegralInRange(0, 15) == 0) ms[in.ConsumeIntegralInRange(0, 3)] += 1;  // mismatch
    mask = make_buffer(in, mt, mrank, ms + (4 - mrank), true);
    for_each_index(mask.view.rank, mask.view.shape.data(), [&](const std::int64_t* idx) {
      if (mt == DType::u8) {
        *static_cast<std::uint8_t*>(mask.element_ptr(idx)) = in.ConsumeIntegralInRange(0, 3) != 0;
      } else {
        const int kind = in.ConsumeIntegralInRange(0, 9);
        mask.set(idx, kind < 5 ? 0.0 : kind < 7 ? -INFINITY : kind == 7 ? -1e30 : specials ? fuzz_value(in, 10) : -3.0);
      }
    });
    opt.mask.explicit_mask = mask.view;
  }

  // Outputs (rank 4 with q's padding rule, any strides) for the fast path and the reference.
  const std::int64_t os[4] = {qs[0], qs[1], qs[2], vs[3]}, ls[4] = {qs[0], qs[1], qs[2], 1},
                     ps[4] = {qs[0], qs[1], qs[2], ks[2]};
  const bool want_lse = in.ConsumeBool(), want_probs = in.ConsumeBool();
  const DType aux = in.ConsumeBool() ? dtype == DType::bf16 ? DType::f32 : dtype : DType::f64;
  Buffer out = make_buffer(in, dtype, rank, tail(const_cast<std::int64_t*>(os)), false);
  Buffer lse = make_buffer(in, aux, rank - 1, tail(const_cast<std::int64_t*>(ls)), false);
  Buffer probs = make_buffer(in, aux, rank, tail(const_cast<std::int64_t*>(ps)), false);
  Buffer out3 = make_buffer(in, dtype, rank, tail(const_cast<std::int64_t*>(os)), false);
  Buffer ref_out = make_buffer(in, DType::f64, rank, tail(const_cast<std::int64_t*>(os)), false);
  Buffer ref_lse = make_buffer(in, DType::f64, rank - 1, tail(const_cast<std::int64_t*>(ls)), false);
  Buffer ref_probs = make_buffer(in, DType::f64, rank, tail(const_cast<std::int64_t*>(ps)), false);
  for (Buffer* b : {&out, &lse, &probs, &out3, &ref_out, &ref_lse, &ref_probs}) poison(*b);
  Outputs fast{out.view, want_lse ? lse.view : TensorView{}, want_probs ? probs.view : TensorView{}};
  Outputs ref{ref_out.view, ref_lse.view, ref_probs.view};

  // ATTENTION_FUZZ_DEBUG=1: describe the decoded problem (for triaging a crash input).
  if (std::getenv("ATTENTION_FUZZ_DEBUG")) {
    const auto dump = [](const char* name, const Buffer& b) {
      std::fprintf(stderr, "%s %s %s strides", name, std::string(dtype_name(b.view.dtype)).c_str(), b.view.shape_str().c_str());
      for (int d = 0; d < b.view.rank; ++d) std::fprintf(stderr, " %lld", static_cast<long long>(b.view.strides[d]));
      std::fprintf(stderr, "\n");
    };
    dump("q", q);
    dump("k", k);
    dump("v", v);
    if (!mask.view.empty()) dump("mask", mask);
    std::fprintf(stderr, "scale %s causal %d align %d window %lld,%lld specials %d lse %d probs %d\n",
                 opt.scale.describe().c_str(), opt.mask.causal, static_cast<int>(opt.mask.align),
                 static_cast<long long>(opt.mask.window_left), static_cast<long long>(opt.mask.window_right), specials,
                 want_lse, want_probs);
    for (const Buffer* b : {&q, &k, &v, &mask}) {
      if (b->view.empty()) continue;  // no mask: nothing to print (and no data to read)
      for_each_index(b->view.rank, b->view.shape.data(), [&](const std::int64_t* idx) {
        std::fprintf(stderr, " %g", b->view.dtype == DType::u8 ? *static_cast<const std::uint8_t*>(b->element_ptr(idx)) : b->get(idx));
      });
      std::fprintf(stderr, "\n");
    }
  }

  // Score transforms, sinks, dropout and packed sequences, decoded last (earlier inputs keep
  // their forward problem). Their sizes only shift the per-row bounds below.
  std::vector<double> slopes_buf, sinks_buf;
  double alibi_max = 0, sink_max = 0, keep = 1;
  bool varlen = false;
  if (in.ConsumeIntegralInRange(0, 2) == 0) {
    opt.softcap = in.PickValueInArray({0.0, 0.5, 5.0, 50.0, -1.0});
    if (in.ConsumeBool()) {
      const bool per_batch = in.ConsumeBool();
      slopes_buf.resize(static_cast<std::size_t>((per_batch ? d.B : 1) * d.Hq));
      for (double& x : slopes_buf) alibi_max = std::max(alibi_max, x = in.ConsumeProbability<double>() * (specials ? 1e3 : 1.0));
      opt.alibi_slopes = per_batch ? TensorView::contiguous(slopes_buf.data(), DType::f64, {d.B, d.Hq})
                                   : TensorView::contiguous(slopes_buf.data(), DType::f64, {d.Hq});
    }
    if (in.ConsumeBool()) {
      sinks_buf.resize(static_cast<std::size_t>(d.Hq));
      for (double& x : sinks_buf) sink_max = std::max(sink_max, std::fabs(x = specials ? fuzz_value(in, 30) : 6 * in.ConsumeProbability<double>() - 3));
      opt.sinks = TensorView::contiguous(sinks_buf.data(), DType::f64, {d.Hq});
    }
    if (in.ConsumeBool()) {
      opt.dropout = Dropout{in.PickValueInArray({0.1, 0.5, 0.9, 1.0}), in.ConsumeIntegral<std::uint64_t>(),
                            in.ConsumeIntegral<std::uint64_t>()};
      keep = 1 - opt.dropout.p;
    }
    // Packed sequences: q [Hq, Nq, dk] split into up to 3 sequences, the keys likewise.
    if (rank == 3 && in.ConsumeBool()) {
      varlen = true;
      const int S = in.ConsumeIntegralInRange(1, 3);
      opt.cu_seqlens_q = {0};
      opt.cu_seqlens_k = {0};
      for (int s = 1; s < S; ++s) {
        opt.cu_seqlens_q.push_back(in.ConsumeIntegralInRange<std::int64_t>(opt.cu_seqlens_q.back(), d.Nq));
        opt.cu_seqlens_k.push_back(in.ConsumeIntegralInRange<std::int64_t>(opt.cu_seqlens_k.back(), d.Nkv));
      }
      opt.cu_seqlens_q.push_back(in.ConsumeIntegralInRange(0, 15) == 0 ? d.Nq + 1 : d.Nq);  // sometimes wrong
      opt.cu_seqlens_k.push_back(d.Nkv);
    }
  }

  opt.threads = 1;
  const bool ref_threw = throws([&] { reference::forward(q.view, k.view, v.view, ref, opt); });
  const bool fast_threw = throws([&] { forward(q.view, k.view, v.view, fast, opt); });
  if (ref_threw || fast_threw) {
    if (ref_threw != fast_threw && dtype != DType::bf16) fuzz_fail("forward and reference disagree on throwing");
    if (!untouched(out) || !untouched(lse) || !untouched(probs)) fuzz_fail("an output was written before an Error");
    return 0;
  }

  // Bitwise the same for any thread count.
  Options opt3 = opt;
  opt3.threads = 3;
  forward(q.view, k.view, v.view, Outputs{out3.view}, opt3);
  bool same = true;
  for_each_index(rank, out.view.shape.data(), [&](const std::int64_t* idx) {
    const double a = out.get(idx), b = out3.get(idx);
    if (!(a == b || (std::isnan(a) && std::isnan(b))) || std::signbit(a) != std::signbit(b)) same = false;
  });
  if (!same) fuzz_fail("forward differs between 1 and 3 threads");
  // Packed sequences: the row bounds below assume one sequence; the library's tests compare
  // them with a loop over sequences. Here: finite, moderate inputs give the reference's numbers.
  if (varlen) {
    bool finite = true;
    double mag = 0;
    for (const Buffer* b : {&q, &k, &v})
      for_each_index(b->view.rank, b->view.shape.data(), [&](const std::int64_t* idx) {
        finite &= std::isfinite(b->get(idx));
        mag = std::max(mag, std::fabs(b->get(idx)));
      });
    if (!finite || mag > 10 || alibi_max > 1 || sink_max > 3) return 0;
    for_each_index(rank, out.view.shape.data(), [&](const std::int64_t* idx) {
      const double a = out.get(idx), r = ref_out.get(idx);
      if (!(std::fabs(a - r) <= (dtype == DType::f64 ? 1e-9 : 2e-2) * mag / keep)) fuzz_fail("packed sequences: out differs", a, r);
    });
    return 0;
  }

  // Per-row checks, on the normalised rank-4 Params of the problem.
  const detail::Params p = detail::make_forward_params(q.view, k.view, v.view, ref, opt, detail::Kernel::reference);
  const detail::Params pf = detail::make_forward_params(q.view, k.view, v.view, fast, opt, detail::Kernel::fast);
  const double eps = eps_of(dtype);
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.Hq; ++h)
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        const std::int64_t kh = p.kv_head(h);
        bool clean = true, any_visible = false;
        double M = 0, vmax = 0;  // max over visible keys of |s|·Σ|q k| + |bias|, and of |v|
        for (std::int64_t c = 0; c < p.dk; ++c)
          clean &= std::isfinite(detail::load(p.q, detail::element(p.q, b, h, i, c)));
        const auto range = detail::key_range(p, i);
        for (std::int64_t j = range.lo; j < range.hi; ++j) {
          const double bias = detail::mask_bias(p, b, h, i, j);
          if (bias == -INFINITY) continue;
          any_visible = true;
          clean &= std::isfinite(bias);
          double qk = 0;
          for (std::int64_t c = 0; c < p.dk; ++c) {
            const double kv = detail::load(p.k, detail::element(p.k, b, kh, j, c));
            clean &= std::isfinite(kv);
            qk += std::fabs(detail::load(p.q, detail::element(p.q, b, h, i, c)) * kv);
          }
          for (std::int64_t c = 0; c < p.dv; ++c) {
            const double vv = detail::load(p.v, detail::element(p.v, b, kh, j, c));
            clean &= std::isfinite(vv);
            vmax = std::max(vmax, std::fabs(vv));
          }
          M = std::max(M, std::fabs(p.scale) * qk + std::fabs(bias) + alibi_max * static_cast<double>(p.Nq + p.Nkv));
        }
        M = std::max(M + opt.softcap, sink_max);
        if (!any_visible) {
          for (std::int64_t c = 0; c < p.dv; ++c)
            if (detail::load(pf.out, detail::element(pf.out, b, h, i, c)) != 0.0)
              fuzz_fail("masked row: out != 0", detail::load(pf.out, detail::element(pf.out, b, h, i, c)));
          const double lse_none = p.sinks.empty() ? -INFINITY : detail::sink_logit(p, h);
          if (want_lse && !(std::fabs(detail::load(pf.lse, detail::element(pf.lse, b, h, i, 0)) - lse_none) <=
                            1e-6 * std::fabs(lse_none) || detail::load(pf.lse, detail::element(pf.lse, b, h, i, 0)) == lse_none))
            fuzz_fail("masked row: lse is not -inf (or the sink)");
          if (want_probs)
            for (std::int64_t j = 0; j < p.Nkv; ++j)
              if (detail::load(pf.probs, detail::element(pf.probs, b, h, i, j)) != 0.0) fuzz_fail("masked row: probs != 0");
          continue;
        }
        // Logits in float32 overflow past ~3e38: only rows whose logits fit are held to account.
        if (!clean || M > 1e30) continue;
        // Absolute logit error: the dot product's rounding ((dk + 2) eps relative to Σ|q k| s)
        // plus the bias addition; exp turns it into a relative probability error, and the
        // normalisation over Nkv terms adds (Nkv + 2) eps.
        const double ds = (p.dk + 3) * eps * (M + 1e-300) + (p.Nkv + 4) * eps;
        // Outputs in the subnormal range add one absolute rounding per term of P·V (the fuzzer
        // found f32 outputs near 8e-43 a fraction of a subnormal step apart).
        const double tol = vmax / keep * std::min(2.0, 4.0 * std::expm1(2.0 * ds)) + (p.Nkv + 4) * subnormal_of(dtype) + 1e-300;
        for (std::int64_t c = 0; c < p.dv; ++c) {
          const double a = detail::load(pf.out, detail::element(pf.out, b, h, i, c));
          const double r = detail::load(p.out, detail::element(p.out, b, h, i, c));
          if (!std::isfinite(a)) fuzz_fail("clean row has a non-finite output", a, r);
          // bf16 outputs round the result itself: half an ulp of 2^-8 relative.
          if (std::fabs(a - r) > tol + (dtype == DType::bf16 ? 0x1p-8 * std::fabs(r) : 0.0) + (keep < 1 ? 4 * eps * vmax / keep : 0.0))
            fuzz_fail("out differs from the reference", a, r);
        }
        if (want_lse) {
          const double a = detail::load(pf.lse, detail::element(pf.lse, b, h, i, 0));
          const double r = detail::load(p.lse, detail::element(p.lse, b, h, i, 0));
          const double aux_eps = eps_of(aux);
          if (!(std::fabs(a - r) <= 2 * ds + 2 * aux_eps * std::fabs(r) + 1e-300)) fuzz_fail("lse differs from the reference", a, r);
        }
        if (want_probs) {
          double sum = 0;
          for (std::int64_t j = 0; j < p.Nkv; ++j) {
            // Under dropout a dropped pair's probability is written negated (FlashAttention's
            // S_dmask): its sign must be the reference's, its magnitude is the probability.
            const double sa = detail::load(pf.probs, detail::element(pf.probs, b, h, i, j));
            const double sr = detail::load(p.probs, detail::element(p.probs, b, h, i, j));
            if (keep < 1 && sr != 0 && std::signbit(sa) != std::signbit(sr))
              fuzz_fail("probs mark another dropout mask than the reference's", sa, sr);
            const double a = keep < 1 ? std::fabs(sa) : sa, r = keep < 1 ? std::fabs(sr) : sr;
            if (!(a >= 0 && a <= 1)) fuzz_fail("probability outside [0, 1]", a);
            if (std::fabs(a - r) > 4 * std::expm1(2 * ds) + 2 * eps_of(aux)) fuzz_fail("probs differ from the reference", a, r);
            sum += a;
          }
          // Each probability carries the relative error exp(2·ds) − 1 of its logit (bounded above).
          double sink_p = 0;
          if (!p.sinks.empty()) sink_p = std::exp(detail::sink_logit(p, h) - detail::load(p.lse, detail::element(p.lse, b, h, i, 0)));
          if (std::fabs(sum - (1 - sink_p)) > (p.Nkv + 4) * std::max(eps, eps_of(aux)) * 4 + 4 * std::expm1(2 * ds))
            fuzz_fail("probabilities do not sum to 1", sum);
        }
      }

  // Backward on the same problem, from the fast forward's out and lse.
  if (dtype == DType::bf16) return 0;
  Buffer dout = make_buffer(in, dtype, rank, tail(const_cast<std::int64_t*>(os)), true);
  fill(in, dout, 1.0, false);
  Buffer lse_t = make_buffer(in, dtype, rank - 1, tail(const_cast<std::int64_t*>(ls)), false);
  forward(q.view, k.view, v.view, Outputs{out.view, lse_t.view}, opt);
  Buffer dq = make_buffer(in, dtype, rank, tail(qs), false), dk = make_buffer(in, dtype, rank, tail(ks), false),
         dv = make_buffer(in, dtype, rank, tail(vs), false);
  Buffer rq = make_buffer(in, DType::f64, rank, tail(qs), false), rk = make_buffer(in, DType::f64, rank, tail(ks), false),
         rv = make_buffer(in, DType::f64, rank, tail(vs), false);
  for (Buffer* b : {&dq, &dk, &dv, &rq, &rk, &rv}) poison(*b);
  const bool bref_threw = throws([&] {
    reference::backward(q.view, k.view, v.view, dout.view, Gradients{rq.view, rk.view, rv.view}, opt);
  });
  const bool bfast_threw = throws([&] {
    backward(q.view, k.view, v.view, out.view, lse_t.view, dout.view, Gradients{dq.view, dk.view, dv.view}, opt);
  });
  if (bref_threw != bfast_threw) fuzz_fail("backward and its reference disagree on throwing");
  if (bfast_threw) {
    if (!untouched(dq) || !untouched(dk) || !untouched(dv)) fuzz_fail("a gradient was written before an Error");
    return 0;
  }
  // Compared when every input is finite and every logit is at most 30 in size, where gradients
  // are well conditioned: relative Frobenius error against the float64 reference.
  bool finite = true;
  double logit_max = 0;
  for (const Buffer* b : {&q, &k, &v})
    for_each_index(b->view.rank, b->view.shape.data(), [&](const std::int64_t* idx) { finite &= std::isfinite(b->get(idx)); });
  if (!mask.view.empty())
    for_each_index(mask.view.rank, mask.view.shape.data(), [&](const std::int64_t* idx) {
      const double x = mask.get(idx);
      finite &= std::isfinite(x) || x == -INFINITY;
      if (std::isfinite(x)) logit_max = std::max(logit_max, std::fabs(x));
    });
  if (!finite) return 0;
  double qmax = 0, kmax = 0;
  for_each_index(q.view.rank, q.view.shape.data(), [&](const std::int64_t* idx) { qmax = std::max(qmax, std::fabs(q.get(idx))); });
  for_each_index(k.view.rank, k.view.shape.data(), [&](const std::int64_t* idx) { kmax = std::max(kmax, std::fabs(k.get(idx))); });
  logit_max += std::fabs(p.scale) * p.dk * qmax * kmax + alibi_max * static_cast<double>(p.Nq + p.Nkv);
  if (logit_max > 30 || sink_max > 30) return 0;
  const double tol = (dtype == DType::f64 ? 1e-9 : 2e-3);
  // A gradient whose exact value is 0 (dS cancels) is computed as rounding noise: its floor is
  // the size of all three gradients together.
  const std::pair<const Buffer*, const Buffer*> pairs[3] = {{&dq, &rq}, {&dk, &rk}, {&dv, &rv}};
  double num[3] = {0, 0, 0}, den[3] = {0, 0, 0};
  const auto a_numel = [&](int g) {
    double n = 1;
    for (int d = 0; d < pairs[g].first->view.rank; ++d) n *= static_cast<double>(pairs[g].first->view.shape[d]);
    return n;
  };
  for (int g = 0; g < 3; ++g) {
    const Buffer *a = pairs[g].first, *r = pairs[g].second;
    for_each_index(a->view.rank, a->view.shape.data(), [&](const std::int64_t* idx) {
      const double x = a->get(idx), y = r->get(idx);
      if (!std::isfinite(x)) fuzz_fail("gradient not finite on finite inputs", x, y);
      num[g] += (x - y) * (x - y);
      den[g] += y * y;
    });
  }
  const double all = std::sqrt(den[0] + den[1] + den[2]);
  // dS = P∘(dP − rowsum(P∘dP)) cancels when every visible v_j is alike; its rounding error is
  // of the size of dP = dO·v, so dq and dk get an absolute floor of that size (times |s|·|k|
  // or |s|·|q|, summed over the keys or queries involved).
  double vmax_all = 0, dmax = 0;
  for_each_index(v.view.rank, v.view.shape.data(), [&](const std::int64_t* idx) { vmax_all = std::max(vmax_all, std::fabs(v.get(idx))); });
  for_each_index(dout.view.rank, dout.view.shape.data(), [&](const std::int64_t* idx) { dmax = std::max(dmax, std::fabs(dout.get(idx))); });
  const double cancel = 8.0 * (p.dv + p.Nkv + 2) * eps * std::fabs(p.scale) * vmax_all * dmax * p.dv *
                        std::max(qmax, kmax) * (p.Nkv + p.Nq * p.group());
  for (int g = 0; g < 3; ++g)
    if (std::sqrt(num[g]) > tol * (std::sqrt(den[g]) + all) + (g < 2 ? cancel * std::sqrt(a_numel(g)) : 0.0) + 1e-300)
      fuzz_fail("gradient differs from the reference", std::sqrt(num[g]), std::sqrt(den[g]));
  return 0;
}
