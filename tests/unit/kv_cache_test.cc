// decode() over KV caches (attnscale/kv_cache.h): float32, bfloat16, float16 and int8 K/V,
// contiguous and paged, against a float64 reference on the values the cache holds (bf16, float16
// and int8 widened or dequantised),
// under the accuracy rule of the forward ("error vs float64 <= 2x the error of a naive float32
// computation on the same inputs"), on every compiled SIMD target; awkward lengths (0, 1, odd,
// prime, across chunk and block edges), GQA groups 1..8, sliding windows, left padding; paged == contiguous
// == contiguous with the heads' rows interleaved ([B, Nkv, Hkv, d], FlashAttention's layout, seen
// through strides) bit for bit; any thread count gives the same bits; bad arguments throw.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention/kernels.h"
#include "attention/kv_bf16_dot.h"
#include "attention/kv_kernels.h"
#include "attnscale/error.h"
#include "attnscale/kv_cache.h"
#include "bf16_paths.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using testing::random_tensor;

template <class Fn>
void for_each_target(Fn fn) {
  for (const std::string& t : detail::simd::available_targets()) {
    detail::simd::force_target(t);
    SCOPED_TRACE("target " + t);
    fn();
  }
  detail::simd::force_target("");
}

// How a check runs its decode calls: once on every compiled target (each_target), once on every
// bf16 product path this CPU runs (each_bf16_path). The inputs and the references (float64 and the
// naive float32, target-independent test code) are made once before the runs and shared by them:
// under the sanitizers making them took most of these tests' time, and it was made again for every
// target.
using Runs = void (*)(const std::function<void()>& run);
void each_target(const std::function<void()>& run) { for_each_target(run); }
void each_bf16_path(const std::function<void()>& run) { testing::for_each_bf16_path(run); }

enum class Kind { f32, bf16, f16, i8 };

// A cache in both layouts holding the same values, and those values as double for the reference.
struct Caches {
  std::int64_t B, Hkv, Nmax, dk, dv, block;
  Tensor k, v, ks, vs;                  // contiguous [B, Hkv, Nmax, d] (+ int8 scales)
  Tensor pk, pv, pks, pvs;              // paged pool [blocks, block, Hkv, d]
  Tensor ik, iv, iks, ivs;              // interleaved [B, Nmax, Hkv, d]
  Tensor table, lens;
  Tensor starts;                        // seq_starts [B], or empty
  std::vector<double> kd, vd;           // dequantised contiguous values
  KVCache contiguous() const {
    KVCache c{k.view(), v.view(), ks.numel() ? ks.view() : TensorView{}, vs.numel() ? vs.view() : TensorView{}, {},
              lens.view(), starts_view()};
    return c;
  }
  // The interleaved tensors seen as [B, Hkv, Nmax, d] (dimensions 1 and 2 swapped).
  static TensorView heads_outer(const Tensor& t) {
    if (!t.numel()) return {};
    TensorView v = t.view();
    std::swap(v.shape[1], v.shape[2]);
    std::swap(v.strides[1], v.strides[2]);
    return v;
  }
  KVCache interleaved() const {
    return KVCache{heads_outer(ik), heads_outer(iv), heads_outer(iks), heads_outer(ivs), {}, lens.view(), starts_view()};
  }
  TensorView starts_view() const { return starts.numel() ? starts.view() : TensorView{}; }
  std::int64_t start(std::int64_t b) const { return starts.numel() ? static_cast<const std::int32_t*>(starts.view().data)[b] : 0; }
  KVCache paged() const {
    return KVCache{pk.view(), pv.view(), pks.numel() ? pks.view() : TensorView{}, pvs.numel() ? pvs.view() : TensorView{},
                   table.view(), lens.view(), starts_view()};
  }
};

double as_double(const Tensor& t, const Tensor& scales, std::int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.as<float>()[i];
    case DType::bf16: return from_bf16(t.as<bf16>()[i]);
    case DType::f16: return from_f16(t.as<f16>()[i]);
    default: return double(static_cast<const std::int8_t*>(t.view().data)[i]) * double(scales.as<float>()[i / 32]);
  }
}

Tensor convert(const Tensor& f, Kind kind, Tensor& scales) {
  const TensorView v = f.view();
  if (kind != Kind::i8) {
    Tensor t(kind == Kind::f32 ? DType::f32 : kind == Kind::bf16 ? DType::bf16 : DType::f16, v.shape.data(), v.rank);
    const std::int64_t n = f.numel();
    const float* x = f.as<float>();
    if (kind == Kind::f32) std::copy_n(x, n, t.as<float>());
    else if (kind == Kind::bf16) std::transform(x, x + n, t.as<bf16>(), [](float e) { return to_bf16(e); });
    else std::transform(x, x + n, t.as<f16>(), [](float e) { return to_f16(e); });
    return t;
  }
  Tensor t(DType::i8, v.shape.data(), v.rank);
  std::array<std::int64_t, 4> s = v.shape;
  s[3] /= 32;
  scales = Tensor(DType::f32, s.data(), 4);
  quantize_q8(f.view(), t.view(), scales.view());
  return t;
}

// edit (optional) changes the contiguous cache's values (k, v, and int8's scales ks, vs) before the
// other layouts and the reference's values are made from them.
using CacheEdit = std::function<void(Tensor& k, Tensor& v, Tensor& ks, Tensor& vs)>;
Caches make_caches(Kind kind, std::int64_t B, std::int64_t Hkv, const std::vector<std::int32_t>& lens, std::int64_t dk,
                   std::int64_t dv, std::int64_t block, std::uint64_t seed, const CacheEdit& edit = {}) {
  Caches c{B, Hkv, 0, dk, dv, block, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  c.Nmax = std::max<std::int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  const Tensor kf = random_tensor(DType::f32, {B, Hkv, c.Nmax, dk}, seed, 1, 1.0, testing::Draw::bulk);
  const Tensor vf = random_tensor(DType::f32, {B, Hkv, c.Nmax, dv}, seed, 2, 1.0, testing::Draw::bulk);
  c.k = convert(kf, kind, c.ks);
  c.v = convert(vf, kind, c.vs);
  if (edit) edit(c.k, c.v, c.ks, c.vs);
  const std::int64_t nk = kf.numel(), nv = vf.numel();
  c.kd.resize(nk);
  c.vd.resize(nv);
  for (std::int64_t i = 0; i < nk; ++i) c.kd[i] = as_double(c.k, c.ks, i);
  for (std::int64_t i = 0; i < nv; ++i) c.vd[i] = as_double(c.v, c.vs, i);
  c.lens = Tensor(DType::i32, {B});
  std::copy(lens.begin(), lens.end(), static_cast<std::int32_t*>(c.lens.view().data));
  // The pool: every sequence's blocks in a shuffled order, plus two unused blocks.
  const std::int64_t per = (c.Nmax + block - 1) / block, blocks = B * per + 2;
  std::vector<std::int32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(static_cast<unsigned>(seed)));
  c.table = Tensor(DType::i32, {B, per});
  auto* table = static_cast<std::int32_t*>(c.table.view().data);
  for (std::int64_t i = 0; i < B * per; ++i) table[i] = ids[i];
  auto pool = [&](const Tensor& src, std::int64_t d) {
    Tensor p(src.dtype(), {blocks, block, Hkv, d});
    const std::size_t es = dtype_size(src.dtype());
    std::fill_n(static_cast<char*>(p.view().data), p.numel() * es, char(0x7f));  // garbage where no key lives
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < Hkv; ++h)
        for (std::int64_t j = 0; j < c.Nmax; ++j) {
          const std::int64_t blk = table[b * per + j / block];
          std::copy_n(static_cast<const char*>(src.view().data) + (((b * Hkv + h) * c.Nmax + j) * d) * es, d * es,
                      static_cast<char*>(p.view().data) + (((blk * block + j % block) * Hkv + h) * d) * es);
        }
    return p;
  };
  c.pk = pool(c.k, dk);
  c.pv = pool(c.v, dv);
  // [B, Hkv, Nmax, d] -> [B, Nmax, Hkv, d]
  auto swapped = [&](const Tensor& src, std::int64_t d) {
    Tensor t(src.dtype(), {B, c.Nmax, Hkv, d});
    const std::size_t es = dtype_size(src.dtype());
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < Hkv; ++h)
        for (std::int64_t j = 0; j < c.Nmax; ++j)
          std::copy_n(static_cast<const char*>(src.view().data) + (((b * Hkv + h) * c.Nmax + j) * d) * es, d * es,
                      static_cast<char*>(t.view().data) + (((b * c.Nmax + j) * Hkv + h) * d) * es);
    return t;
  };
  c.ik = swapped(c.k, dk);
  c.iv = swapped(c.v, dv);
  if (kind == Kind::i8) {
    c.pks = pool(c.ks, dk / 32);
    c.pvs = pool(c.vs, dv / 32);
    c.iks = swapped(c.ks, dk / 32);
    c.ivs = swapped(c.vs, dv / 32);
  }
  return c;
}

// Score transforms of a case: soft-capping (0: off) and ALiBi slopes per (b, h) (empty: off).
struct Transforms {
  double softcap = 0;
  std::vector<double> slopes;  // B·Hq
};

// New tokens a sequence: Nq query rows a head, row i at key len − Nq + i, seeing keys up to its
// own (causal), up to `right` past it (not causal, right ≥ 0) or all of them.
struct Queries {
  std::int64_t Nq = 1;
  bool causal = true;
  std::int64_t right = -1;
};

// Float64 reference (and, with T = float, the naive float32 computation the rule compares
// against): out[b, h, i] = softmax(t_j over the keys j row i sees) · V, t_j = s·q·K_jᵀ, or with
// transforms c·tanh(s·q·K_jᵀ / c) − slope_bh·|p_i − j|, p_i = len_b − Nq + i; keys from the
// sequence's start.
template <class T>
std::vector<double> attend(const Caches& c, const Tensor& q, std::int64_t Hq, std::int64_t window, double scale,
                           std::vector<double>* lse = nullptr, const Transforms& tf = {}, const Queries& qs = {}) {
  const std::int64_t g = Hq / c.Hkv, Nq = qs.Nq;
  std::vector<double> out(c.B * Hq * Nq * c.dv);
  const auto* lens = static_cast<const std::int32_t*>(c.lens.view().data);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < Nq; ++i) {
        const std::int64_t kh = h / g, len = lens[b], pos = len - Nq + i, row = (b * Hq + h) * Nq + i,
                           lo = std::max<std::int64_t>(c.start(b), window >= 0 ? pos - window : 0),
                           hi = qs.causal ? pos + 1 : qs.right >= 0 ? std::min(len, pos + 1 + qs.right) : len;
        std::vector<T> s(c.Nmax);
        T m = -INFINITY;
        for (std::int64_t j = lo; j < hi; ++j) {
          T dot = 0;
          for (std::int64_t e = 0; e < c.dk; ++e)
            dot += T(q.as<float>()[row * c.dk + e]) * T(c.kd[((b * c.Hkv + kh) * c.Nmax + j) * c.dk + e]);
          s[j] = dot * T(scale);
          if (tf.softcap > 0) s[j] = T(tf.softcap) * std::tanh(s[j] / T(tf.softcap));
          if (!tf.slopes.empty()) s[j] -= T(tf.slopes[b * Hq + h]) * T(std::abs(pos - j));
          m = std::max(m, s[j]);
        }
        T l = 0;
        for (std::int64_t j = lo; j < hi; ++j) l += s[j] = std::exp(s[j] - m);
        for (std::int64_t e = 0; e < c.dv; ++e) {
          T acc = 0;
          for (std::int64_t j = lo; j < hi; ++j) acc += s[j] * T(c.vd[((b * c.Hkv + kh) * c.Nmax + j) * c.dv + e]);
          out[row * c.dv + e] = l > 0 ? double(acc / l) : 0.0;
        }
        if (lse) lse->push_back(l > 0 ? double(m) + std::log(double(l)) : -INFINITY);
      }
  return out;
}

double rel(const std::vector<double>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return NAN;
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> v(t.numel());
  for (std::int64_t i = 0; i < t.numel(); ++i) v[i] = t.as<float>()[i];
  return v;
}

struct Case {
  std::int64_t Hq, Hkv, dk, dv, block, window;
  std::vector<std::int32_t> lens;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {1, 1, 32, 32, 16, -1, {1}},
      {8, 1, 64, 32, 16, -1, {0, 5, 2053}},            // MQA group 8; an empty sequence; past two chunks
      {6, 2, 96, 64, 7, -1, {31, 1024, 1025, 97}},     // group 3, ragged block size, chunk edges
      {4, 4, 32, 96, 32, 100, {3000, 1, 101, 102}},    // sliding window across a chunk edge
      {16, 2, 128, 128, 16, -1, {1537}},               // group 8, d = 128
      {12, 1, 64, 32, 16, -1, {70, 3}},                // group 12: a block of 8 rows and one of 4
      {3, 3, 128, 64, 16, -1, {2051, 6, 1}},           // one row per KV head, output row in registers
      {2, 2, 64, 128, 5, 1030, {1031, 4099}},          // one row, window: tiles start off a chunk edge
      {2, 2, 64, 256, 16, -1, {300, 1029}},            // one row, dv = 256: the output row in 16 registers
      {16, 16, 32, 32, 16, -1, {1100, 5, 1300, 77}},   // one row, 64 (sequence, KV head) pairs: longer chunks
      {32, 16, 32, 32, 16, -1, {1500, 1, 2, 1200}},    // the same with groups of 2
      {4, 4, 128, 128, 16, -1, {2053, 17, 1}},         // one row, dk = dv: key by key, short last tiles
      {2, 2, 64, 64, 7, 1030, {1031, 4099}},           // the same at d = 64 with a window off a chunk edge
      {2, 2, 256, 256, 16, -1, {300, 33}},             // the same at d = 256 (16 vectors)
      {2, 2, 192, 128, 16, -1, {1031, 2}},             // one row, dk != dv (dk 12 vectors): key by key, int8 by tiles
      {8, 2, 32, 96, 16, -1, {130, 3}},                // group 4, dv = 96: P·V by blocks of 3 vectors (AVX2)
      {12, 2, 128, 64, 16, -1, {200, 67}},             // group 6: three keys against 6 of 8 packed rows (AVX2)
      {34, 2, 64, 32, 16, -1, {77, 5}},                // group 17: K rows widened 12 keys at a time for three
                                                       // blocks (8 + 8 + 1), V in panels for five (AVX2)
  };
  return c;
}
const std::vector<Case>& odd_dims() {  // float32 / bf16 / float16 only (int8 needs multiples of 32)
  static const std::vector<Case> c = {{3, 1, 37, 5, 5, -1, {1, 1030}}, {2, 2, 1, 17, 3, 7, {13, 2}},
                                      {4, 1, 37, 5, 5, -1, {39, 6}}, {8, 1, 19, 3, 4, 9, {41}},
                                      {2, 2, 37, 64, 5, -1, {1030, 3}},   // one row key by key, dk with a tail
                                      {4, 2, 13, 7, 5, -1, {70, 3}},      // group 2, dk under 16: columns one at a time
                                      {8, 2, 37, 61, 5, -1, {130, 3}},    // group 4, dv = 61: 3 + 2 + 2 vectors and a tail (AVX2)
                                      {2, 2, 100, 100, 5, -1, {1043, 18}},  // one row, the output row in memory, a tail
                                      {7, 1, 37, 29, 5, -1, {131, 2}},      // group 7, dk with a tail: three keys at a time
                                      {13, 1, 37, 29, 5, -1, {131, 2}},     // group 13: 8 + 5 rows on 12 widened keys
                                      {17, 1, 37, 29, 5, -1, {70, 3}}};     // group 17: V in panels, dv with a tail (AVX2)
  return c;
}

// Whether a call takes the bf16 products (kv_decode.cc's Chunk::dot_) on the dispatched target.
bool takes_bf16_products(Kind kind, const Case& cs, const Queries& qs) {
  return kind == Kind::bf16 && cs.Hq / cs.Hkv * qs.Nq >= 2 && cs.dk % 8 == 0 && cs.dv % 32 == 0 &&
         detail::kv::quads_available() && detail::kv::rows_in_place() && detail::kv::bf16dot::available();
}

// compute = bf16: the bf16 products' rule, error vs float64 <= 1e-2 (the bf16 forward's), lse
// within 2e-2·(1 + |lse|); and the output differs from native's where the products take bf16
// operands (the path ran), else it has native's bits. The decode calls and checks run on every
// target (runs = each_target) or every bf16 product path (each_bf16_path), on the same inputs.
void check_case(Kind kind, const Case& cs, std::uint64_t seed, const Transforms& tf = {},
                const std::vector<std::int32_t>& starts = {}, const Queries& qs = {},
                Compute compute = Compute::native, Runs runs = each_target) {
  const std::int64_t B = static_cast<std::int64_t>(cs.lens.size());
  Caches c = make_caches(kind, B, cs.Hkv, cs.lens, cs.dk, cs.dv, cs.block, seed);
  if (!starts.empty()) {
    c.starts = Tensor(DType::i32, {B});
    std::copy(starts.begin(), starts.end(), static_cast<std::int32_t*>(c.starts.view().data));
  }
  // One row a head as [B, Hq, d]; several as [B, Hq, Nq, d].
  const auto rows = [&](std::int64_t d) {
    return qs.Nq == 1 ? Tensor(DType::f32, {B, cs.Hq, d}) : Tensor(DType::f32, {B, cs.Hq, qs.Nq, d});
  };
  const Tensor q = qs.Nq == 1 ? random_tensor(DType::f32, {B, cs.Hq, cs.dk}, seed, 3)
                              : random_tensor(DType::f32, {B, cs.Hq, qs.Nq, cs.dk}, seed, 3);
  Tensor slopes(DType::f64, {B, cs.Hq});
  if (!tf.slopes.empty()) std::copy(tf.slopes.begin(), tf.slopes.end(), slopes.as<double>());
  const std::string what = "kind " + std::to_string(int(kind)) + " Hq " + std::to_string(cs.Hq) + " Hkv " +
                           std::to_string(cs.Hkv) + " dk " + std::to_string(cs.dk) + " dv " + std::to_string(cs.dv) +
                           " Nq " + std::to_string(qs.Nq) + (qs.causal ? " causal" : "") +
                           " right " + std::to_string(qs.right);
  const double scale = 1.0 / std::sqrt(double(cs.dk));
  std::vector<double> ref_lse;
  const auto ref = attend<double>(c, q, cs.Hq, cs.window, scale, &ref_lse, tf, qs);
  const double theirs = rel(attend<float>(c, q, cs.Hq, cs.window, scale, nullptr, tf, qs), ref);
  const bool bf16 = compute == Compute::bf16;
  runs([&] {
    DecodeOptions o;
    o.window_left = cs.window;
    o.causal = qs.causal;
    o.window_right = qs.right;
    o.threads = 2;
    o.softcap = tf.softcap;
    o.compute = compute;
    if (!tf.slopes.empty()) o.alibi_slopes = slopes.view();
    Tensor out = rows(cs.dv), paged = rows(cs.dv), one = rows(cs.dv), inter = rows(cs.dv), any = rows(cs.dv);
    Tensor lse = qs.Nq == 1 ? Tensor(DType::f64, {B, cs.Hq}) : Tensor(DType::f64, {B, cs.Hq, qs.Nq});
    decode(q.view(), c.contiguous(), out.view(), lse.view(), o);
    decode(q.view(), c.paged(), paged.view(), {}, o);
    decode(q.view(), c.interleaved(), inter.view(), {}, o);
    o.threads = 1;
    decode(q.view(), c.contiguous(), one.view(), {}, o);
    o.threads = 0;  // the library's choice (one thread under 256 KiB of K and V)
    decode(q.view(), c.contiguous(), any.view(), {}, o);
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      ASSERT_EQ(std::memcmp(&out.as<float>()[i], &paged.as<float>()[i], 4), 0) << what << " paged != contiguous at " << i;
      ASSERT_EQ(std::memcmp(&out.as<float>()[i], &inter.as<float>()[i], 4), 0) << what << " interleaved != contiguous at " << i;
      ASSERT_EQ(std::memcmp(&out.as<float>()[i], &one.as<float>()[i], 4), 0) << what << " 1 thread != 2 at " << i;
      ASSERT_EQ(std::memcmp(&out.as<float>()[i], &any.as<float>()[i], 4), 0) << what << " threads 0 != 2 at " << i;
    }
    const double ours = rel(values(out), ref);
    EXPECT_LE(ours, bf16 ? 1e-2 : std::max(2 * theirs, 4e-7)) << what;
    for (std::int64_t i = 0; i < lse.numel(); ++i) {
      if (std::isinf(ref_lse[i])) EXPECT_EQ(lse.as<double>()[i], ref_lse[i]) << what;
      else EXPECT_NEAR(lse.as<double>()[i], ref_lse[i], (bf16 ? 2e-2 : 1e-5) * (1 + std::fabs(ref_lse[i]))) << what;
    }
    if (bf16) {
      o.compute = Compute::native;
      o.threads = 2;
      Tensor native = rows(cs.dv);
      decode(q.view(), c.contiguous(), native.view(), {}, o);
      const bool same = std::memcmp(out.data(), native.data(), out.nbytes()) == 0;
      EXPECT_EQ(same, !takes_bf16_products(kind, cs, qs)) << what << (same ? ": native's bits" : ": not native's bits");
    }
  });
}

// A contiguous cache whose base lies `offset` bytes past a 64-byte line (numpy and malloc place
// large blocks 16 bytes past one): the same values at that address, in a buffer of its own.
struct OffLine {
  Tensor buffer;
  TensorView view;
  OffLine(const Tensor& t, std::int64_t offset) {
    if (!t.numel()) return;
    buffer = Tensor(DType::i8, {static_cast<std::int64_t>(t.nbytes()) + 64});
    view = t.view();
    view.data = static_cast<char*>(buffer.data()) + offset;  // Tensor's data is line-aligned
    std::memcpy(view.data, t.data(), t.nbytes());
  }
};

// Every offset of K's and V's base within a line gives the bits of the aligned cache, contiguous
// (one query row a KV head, dk = dv: the rows then go in line by line on AVX-512) or paged, and the
// float64 reference's accuracy, on every target.
TEST(KVCache, CachesOffALineGiveTheBitsOfAlignedOnes) {
  const std::vector<Case> off_cases = {
      {4, 4, 128, 128, 16, -1, {2053, 17, 1}},  // d = 128: 8 vectors a row
      {2, 2, 64, 64, 7, 1030, {1031, 4099}},    // d = 64, a window off a chunk edge
      {2, 2, 256, 256, 16, -1, {300, 33}},      // d = 256: 16 vectors
      {16, 2, 128, 128, 16, -1, {1537}},        // GQA (tiles, not key by key)
      {2, 2, 37, 37, 5, -1, {1030, 3}},         // rows of no whole line
  };
  std::uint64_t seed = 1300;
  for (const Kind kind : {Kind::f32, Kind::bf16, Kind::f16, Kind::i8})
    for (const Case& cs : off_cases) {
      if (kind == Kind::i8 && cs.dk % 32) continue;
      const std::int64_t B = static_cast<std::int64_t>(cs.lens.size());
      const Caches c = make_caches(kind, B, cs.Hkv, cs.lens, cs.dk, cs.dv, cs.block, ++seed);
      const Tensor q = random_tensor(DType::f32, {B, cs.Hq, cs.dk}, seed, 3);
      const std::string what = "kind " + std::to_string(int(kind)) + " Hq " + std::to_string(cs.Hq) + " dk " +
                               std::to_string(cs.dk);
      const double scale = 1.0 / std::sqrt(double(cs.dk));
      const auto ref = attend<double>(c, q, cs.Hq, cs.window, scale);
      const double theirs = rel(attend<float>(c, q, cs.Hq, cs.window, scale), ref);
      for_each_target([&] {
        DecodeOptions o;
        o.window_left = cs.window;
        o.threads = 2;
        Tensor aligned(DType::f32, {B, cs.Hq, cs.dv});
        decode(q.view(), c.contiguous(), aligned.view(), {}, o);
        for (const auto& [koff, voff] : std::vector<std::pair<int, int>>{{16, 16}, {4, 60}, {0, 48}, {28, 0}, {32, 8}}) {
          const OffLine k(c.k, koff), v(c.v, voff), ks(c.ks, koff), vs(c.vs, voff);
          const OffLine pk(c.pk, koff), pv(c.pv, voff), pks(c.pks, koff), pvs(c.pvs, voff);
          KVCache off = c.contiguous(), paged = c.paged();
          off.k = k.view, off.v = v.view, paged.k = pk.view, paged.v = pv.view;
          if (kind == Kind::i8) {
            off.k_scales = ks.view, off.v_scales = vs.view;
            paged.k_scales = pks.view, paged.v_scales = pvs.view;
          }
          Tensor out(DType::f32, {B, cs.Hq, cs.dv}), out_paged(DType::f32, {B, cs.Hq, cs.dv});
          decode(q.view(), off, out.view(), {}, o);
          decode(q.view(), paged, out_paged.view(), {}, o);
          const std::string at = what + " K " + std::to_string(koff) + " V " + std::to_string(voff) + " bytes off";
          ASSERT_EQ(std::memcmp(out.data(), aligned.data(), aligned.nbytes()), 0) << at;
          ASSERT_EQ(std::memcmp(out_paged.data(), aligned.data(), aligned.nbytes()), 0) << at << ", paged";
          EXPECT_LE(rel(values(out), ref), std::max(2 * theirs, 4e-7)) << at;
        }
      });
    }
}

// Every case of one element type in every layout, on every target (a test per type, so that
// they run side by side).
void check_kind(Kind kind, std::uint64_t seed) {
  for (const Case& cs : cases()) check_case(kind, cs, ++seed);
  if (kind != Kind::i8)
    for (const Case& cs : odd_dims()) check_case(kind, cs, ++seed);
}
TEST(KVCache, Float32MatchesReferenceInEveryLayoutOnEveryTarget) { check_kind(Kind::f32, 900); }
TEST(KVCache, Bfloat16MatchesReferenceInEveryLayoutOnEveryTarget) { check_kind(Kind::bf16, 1000); }
TEST(KVCache, Float16MatchesReferenceInEveryLayoutOnEveryTarget) { check_kind(Kind::f16, 1100); }
TEST(KVCache, Int8MatchesReferenceInEveryLayoutOnEveryTarget) { check_kind(Kind::i8, 1200); }
// Float32 groups of up to 4 rows take the oct layout where the call's K and V lie in cache (up to
// 16 MiB, every case above) and the quads beyond (kv_decode.cc, Chunk's near_f32_): these calls
// read more, so the quads are checked too (group 4 at d = 128; group 3 with ragged dk and dv).
TEST(KVCache, Float32GroupsOverLargeCachesMatchReferenceInEveryLayoutOnEveryTarget) {
  check_case(Kind::f32, {8, 2, 128, 128, 16, -1, {16500}}, 1250);
  check_case(Kind::f32, {6, 2, 37, 29, 5, -1, {32000, 7}}, 1251);
}

// Soft-capping at 1.5 (scores of these inputs are of order 1: the cap bends them) and ALiBi slopes
// in [0, 0.05) per (sequence, head), drawn from seed.
Transforms capped_alibi(const Case& cs, std::uint64_t seed) {
  Transforms both;
  both.softcap = 1.5;
  std::mt19937 rng(static_cast<unsigned>(seed));
  both.slopes.resize(cs.lens.size() * static_cast<std::size_t>(cs.Hq));
  for (double& x : both.slopes) x = std::uniform_real_distribution<double>(0.0, 0.05)(rng);
  return both;
}
// Left padding: each sequence's first third (seq_starts).
std::vector<std::int32_t> third_padded(const Case& cs) {
  std::vector<std::int32_t> starts(cs.lens.size());
  for (std::size_t b = 0; b < starts.size(); ++b) starts[b] = cs.lens[b] / 3;
  return starts;
}

// Soft-capping and ALiBi (slopes per sequence and head) on every type and layout, one row per KV
// head and GQA groups, windows, on every target: against the reference with the same transforms,
// paged == contiguous == interleaved and 1 thread == 2 bit for bit (check_case).
TEST(KVCache, SoftcapAndAlibiMatchReferenceInEveryLayoutOnEveryTarget) {
  std::uint64_t seed = 1300;
  // MQA group 8; one row per KV head with a window across a chunk edge; one row, paged blocks of 5;
  // one row with dk = dv (key by key), with and without a window.
  for (const std::size_t i : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{11}, std::size_t{12}}) {
    const Case& cs = cases()[i];
    const Transforms both = capped_alibi(cs, seed);
    // The transforms act on float32 scores whatever the element type: both on float32 and int8
    // (their own score kernels), one each on the 16-bit types.
    Transforms cap_only = both, alibi_only = both;
    cap_only.slopes.clear();
    alibi_only.softcap = 0;
    check_case(Kind::f32, cs, ++seed, both);
    check_case(Kind::i8, cs, ++seed, both);
    check_case(Kind::f16, cs, ++seed, cap_only);
    check_case(Kind::bf16, cs, ++seed, alibi_only);
  }
}

// Left padding (seq_starts, FlashAttention's cache_leftpad): each sequence's keys from its start,
// with windows and GQA, every type and layout on every target; starts 0, 1, inside a chunk, at a
// chunk edge, at the sequence's end (no key: out 0, lse -inf).
TEST(KVCache, LeftPaddingMatchesReferenceInEveryLayoutOnEveryTarget) {
  const std::vector<std::pair<std::size_t, std::vector<std::int32_t>>> padded = {
      {1, {0, 5, 1030}},          // MQA group 8: none, all (empty), past a chunk edge
      {2, {30, 1, 1024, 13}},     // group 3, ragged blocks: one key left; start at a chunk edge
      {3, {2000, 0, 50, 101}},    // sliding window: start before it, inside it; one key left
      {6, {1, 5, 0}},             // one row per KV head, output row in registers
      {7, {1000, 17}},            // one row, window, blocks of 5
      {11, {5, 0, 1}},            // one row, dk = dv: the first tile short, the whole sequence, none
  };
  // Two element types a case, turning: each type in several cases.
  const Kind kinds[] = {Kind::f32, Kind::bf16, Kind::f16, Kind::i8};
  std::uint64_t seed = 1400;
  for (std::size_t c = 0; c < padded.size(); ++c)
    for (std::size_t t = 0; t < 2; ++t) check_case(kinds[(2 * c + t) % 4], cases()[padded[c].first], ++seed, {}, padded[c].second);
}

// Several new tokens a sequence (q [B, Hq, Nq, dk]): causal and not, with GQA, windows (a right
// one too), left
// padding, softcap and ALiBi (each row its own diagonal), a sequence shorter than Nq (rows without
// a key), every type and layout on every target.
TEST(KVCache, SeveralNewTokensMatchReferenceInEveryLayoutOnEveryTarget) {
  std::uint64_t seed = 1500;
  for (const std::size_t i : {std::size_t{1}, std::size_t{3}, std::size_t{6}, std::size_t{7}}) {
    const Case& cs = cases()[i];
    const Transforms both = capped_alibi(cs, seed);
    const std::vector<std::int32_t> starts = third_padded(cs);
    // Three (Nq, causal, right window) a case, the element type, transforms and padding turning
    // with them; a right window of 2 over 5 rows: the first three rows stop short of the end.
    const Kind kinds[] = {Kind::f32, Kind::bf16, Kind::f16, Kind::i8};
    std::size_t turn = i;
    for (const Queries qs : {Queries{2, true}, Queries{5, true}, Queries{5, false, i % 2 ? 2 : -1}}) {
      ++turn;
      check_case(kinds[turn % 4], cs, ++seed, turn % 2 ? both : Transforms{},
                 turn % 3 ? starts : std::vector<std::int32_t>{}, qs);
    }
  }
}

// compute = bf16 (GQA's products on bf16 operands over a bf16 cache, where the CPU has AVX-512
// BF16): every case, odd sizes, transforms, left padding and several new tokens, in every layout
// (paged == contiguous == interleaved and any thread count bit for bit) on every target, within
// the bf16 rule; and native's bits for the other caches and where the path does not apply
// (check_case).
TEST(KVCache, Bfloat16ProductsMatchReferenceInEveryLayoutOnEveryTarget) {
  std::uint64_t seed = 1600;
  for (const Case& cs : cases()) check_case(Kind::bf16, cs, ++seed, {}, {}, {}, Compute::bf16);
  for (const Case& cs : odd_dims()) check_case(Kind::bf16, cs, ++seed, {}, {}, {}, Compute::bf16);
  for (const std::size_t i : {std::size_t{1}, std::size_t{2}, std::size_t{4}, std::size_t{5}}) {
    const Case& cs = cases()[i];
    const Transforms both = capped_alibi(cs, seed);
    const std::vector<std::int32_t> starts = third_padded(cs);
    check_case(Kind::bf16, cs, ++seed, both, starts, {}, Compute::bf16);
    check_case(Kind::bf16, cs, ++seed, {}, {}, Queries{3, true}, Compute::bf16);
    check_case(Kind::bf16, cs, ++seed, both, starts, Queries{5, false, 2}, Compute::bf16);
  }
  // Other caches ignore it: native's bits.
  check_case(Kind::f32, cases()[4], ++seed, {}, {}, {}, Compute::bf16);
  check_case(Kind::f16, cases()[4], ++seed, {}, {}, {}, Compute::bf16);
  check_case(Kind::i8, cases()[4], ++seed, {}, {}, {}, Compute::bf16);
}

// compute = bf16 on each bf16 product path this CPU runs, forced in turn (AMX tiles, vdpbf16ps;
// portable and widened take native's bits), on awkward sizes: tiles of 1, 17, 63 and 65 keys and
// a thousand and more, groups of 2 to 8 and 16 rows, dk and dv 32 to 256 (dk 40 and 96 not
// multiples of 32: the AMX scores pad them), blocks of 16 and of 5 and 7 keys, left padding,
// several new tokens; in every layout and thread count bit for bit, within the bf16 rule.
TEST(KVCache, Bfloat16ProductsMatchReferenceOnEveryProductPath) {
  static const std::vector<Case> shapes = {
      {2, 1, 32, 32, 16, -1, {1, 17, 63, 65}},       // group 2: one tile of each length
      {3, 1, 64, 64, 7, -1, {1031, 2, 64}},          // group 3, blocks of 7
      {4, 1, 128, 128, 16, -1, {1000, 1, 129}},      // group 4, d = 128
      {5, 1, 256, 256, 5, -1, {65, 300}},            // group 5, d = 256, blocks of 5
      {12, 2, 96, 64, 7, 100, {1030, 63}},           // group 6, dk = 96, a window
      {7, 1, 40, 32, 16, -1, {17, 1025}},            // group 7, dk = 40
      {16, 2, 128, 256, 16, -1, {1031, 17}},         // group 8, dv = 256
      {16, 1, 64, 128, 16, -1, {1001, 65}},          // group 16
      {32, 2, 256, 32, 7, -1, {300, 1}},             // group 16, dk = 256, dv = 32
  };
  std::uint64_t seed = 1650;
  for (const Case& cs : shapes) {
    check_case(Kind::bf16, cs, ++seed, {}, {}, {}, Compute::bf16, each_bf16_path);
    check_case(Kind::bf16, cs, ++seed, {}, third_padded(cs), Queries{3, true}, Compute::bf16, each_bf16_path);
    ++seed;
    check_case(Kind::bf16, cs, seed, capped_alibi(cs, seed), {}, Queries{2, false, 1}, Compute::bf16, each_bf16_path);
  }
}

// Calls whose shapes differ but whose scratch sizes match in part (16 query rows a KV head of
// dk = dv = 64 and 8 rows of 128 fill the same q, o and packed Q) alternate, on two threads: each
// gives the bits of its first call and the reference's accuracy. The scratch kept between calls
// was once taken by such a call and written past its 8 rows' running maxima.
TEST(KVCache, CallsOfOtherShapesDoNotShareScratch) {
  const Case a{16, 2, 128, 128, 16, -1, {1537, 70}}, b{8, 2, 64, 64, 16, -1, {3, 1200}};
  const Queries qb{4, false};
  const Caches ca = make_caches(Kind::f32, 2, a.Hkv, a.lens, a.dk, a.dv, a.block, 1700);
  const Caches cb = make_caches(Kind::f32, 2, b.Hkv, b.lens, b.dk, b.dv, b.block, 1701);
  const Tensor q_a = random_tensor(DType::f32, {2, a.Hq, a.dk}, 1702, 3);
  const Tensor q_b = random_tensor(DType::f32, {2, b.Hq, qb.Nq, b.dk}, 1703, 3);
  DecodeOptions oa, ob;
  oa.threads = ob.threads = 2;
  ob.causal = false;
  Tensor first_a(DType::f32, {2, a.Hq, a.dv}), first_b(DType::f32, {2, b.Hq, qb.Nq, b.dv});
  decode(q_a.view(), ca.contiguous(), first_a.view(), {}, oa);
  decode(q_b.view(), cb.contiguous(), first_b.view(), {}, ob);
  const double scale_a = 1 / std::sqrt(double(a.dk)), scale_b = 1 / std::sqrt(double(b.dk));
  EXPECT_LE(rel(values(first_a), attend<double>(ca, q_a, a.Hq, -1, scale_a)), 1e-6);
  EXPECT_LE(rel(values(first_b), attend<double>(cb, q_b, b.Hq, -1, scale_b, nullptr, {}, qb)), 1e-6);
  for (int round = 0; round < 20; ++round) {
    Tensor out_a(DType::f32, {2, a.Hq, a.dv}), out_b(DType::f32, {2, b.Hq, qb.Nq, b.dv});
    decode(q_a.view(), ca.contiguous(), out_a.view(), {}, oa);
    decode(q_b.view(), cb.contiguous(), out_b.view(), {}, ob);
    ASSERT_EQ(std::memcmp(out_a.data(), first_a.data(), first_a.nbytes()), 0) << "round " << round;
    ASSERT_EQ(std::memcmp(out_b.data(), first_b.data(), first_b.nbytes()), 0) << "round " << round;
  }
}

// A sequence with no keys gives out = 0 and lse = -inf whatever an earlier call of the same shape
// left in the chunks' partials (kept between calls): here NaN, from a call whose V rows were all
// NaN. A short cache (one chunk a KV head) writes its heads from their partial in place, so the
// empty one must not read its never-written o.
TEST(KVCache, AnEmptySequenceGivesZerosWhateverAnEarlierCallLeft) {
  for_each_target([] {
    const std::int64_t B = 2, Hq = 8, Hkv = 2, d = 64;
    const std::vector<std::int32_t> lens = {40, 40}, none = {0, 40};
    const CacheEdit nan_values = [&](Tensor&, Tensor& v, Tensor&, Tensor&) {
      std::fill(v.as<float>(), v.as<float>() + v.numel(), NAN);
    };
    const Caches bad = make_caches(Kind::f32, B, Hkv, lens, d, d, 16, 1900, nan_values);
    const Caches empty_first = make_caches(Kind::f32, B, Hkv, none, d, d, 16, 1901);
    const Tensor q = random_tensor(DType::f32, {B, Hq, d}, 1902, 3);
    for (const int threads : {1, 2}) {
      DecodeOptions o;
      o.threads = threads;
      Tensor out(DType::f32, {B, Hq, d}), lse(DType::f32, {B, Hq});
      decode(q.view(), bad.contiguous(), out.view(), lse.view(), o);
      ASSERT_TRUE(std::isnan(out.as<float>()[0]));
      decode(q.view(), empty_first.contiguous(), out.view(), lse.view(), o);
      for (std::int64_t i = 0; i < Hq * d; ++i) ASSERT_EQ(out.as<float>()[i], 0.0f) << "element " << i;
      for (std::int64_t h = 0; h < Hq; ++h) ASSERT_EQ(lse.as<float>()[h], -INFINITY) << "head " << h;
      for (std::int64_t i = Hq * d; i < B * Hq * d; ++i) ASSERT_TRUE(std::isfinite(out.as<float>()[i]));
    }
  });
}

// Several new tokens a sequence: a key that some rows of a call see and others do not (the last
// tokens' own keys under a causal mask, a window's first keys, a right window's last) holds NaN
// in K and Inf in V (int8: an infinite scale). The rows that do not see it give what the same
// cache gives with finite values there (native: the same bits; compute = bf16 within 1e-3), the
// rows that see it are not finite; every type, layout and target.
void check_hidden_values(const std::vector<Compute>& computes, Runs runs) {
  static const std::vector<Case> shapes = {
      {8, 2, 64, 64, 16, -1, {1030, 70}},  // causal, 3 tokens: key len-1 row 2 alone, len-2 rows 1-2
      {6, 2, 96, 64, 7, 10, {1025, 40}},   // window of 10, 4 tokens: key len-14 row 0 alone
      {8, 2, 32, 32, 16, -1, {300, 9}},    // right window of 1, 3 tokens: key len-1 rows 1-2
      {2, 2, 64, 96, 16, -1, {700, 5}},    // one head a KV head, 2 tokens: key len-1 row 1
  };
  struct Poisoned {
    std::size_t shape;
    Queries qs;
    std::int64_t back[2];  // poisoned keys, counted back from each sequence's end (1: the last; 0: none)
  };
  const Poisoned cases[] = {{0, {3, true}, {1, 2}}, {1, {4, true}, {14, 0}}, {2, {3, false, 1}, {1, 0}},
                            {3, {2, true}, {1, 0}}};
  {
    std::uint64_t seed = 1800;
    for (const Poisoned& pc : cases)
      for (const Kind kind : {Kind::f32, Kind::bf16, Kind::f16, Kind::i8})
        for (const Compute compute : computes) {
          const Case& cs = shapes[pc.shape];
          if (kind == Kind::i8 && (cs.dk % 32 || cs.dv % 32)) continue;
          const std::int64_t B = static_cast<std::int64_t>(cs.lens.size()), Nq = pc.qs.Nq;
          const std::string what = "kind " + std::to_string(int(kind)) + " Hq " + std::to_string(cs.Hq) + " Nq " +
                                   std::to_string(Nq) + (compute == Compute::bf16 ? " bf16" : " native");
          ++seed;
          const Caches clean = make_caches(kind, B, cs.Hkv, cs.lens, cs.dk, cs.dv, cs.block, seed);
          const CacheEdit poison = [&](Tensor& k, Tensor& v, Tensor& ks, Tensor& vs) {
            const std::int64_t N = k.view().shape[2];
            for (std::int64_t b = 0; b < B; ++b)
              for (std::int64_t h = 0; h < cs.Hkv; ++h)
                for (const std::int64_t back : pc.back) {
                  if (!back) continue;
                  const std::int64_t j = cs.lens[b] - back, row = (b * cs.Hkv + h) * N + j;
                  for (std::int64_t e = 0; e < cs.dk; ++e) {
                    if (kind == Kind::f32) k.as<float>()[row * cs.dk + e] = NAN;
                    else if (kind == Kind::bf16) k.as<bf16>()[row * cs.dk + e] = to_bf16(NAN);
                    else if (kind == Kind::f16) k.as<f16>()[row * cs.dk + e] = to_f16(NAN);
                    else if (e % 32 == 0) ks.as<float>()[(row * cs.dk + e) / 32] = NAN;
                  }
                  for (std::int64_t e = 0; e < cs.dv; ++e) {
                    if (kind == Kind::f32) v.as<float>()[row * cs.dv + e] = INFINITY;
                    else if (kind == Kind::bf16) v.as<bf16>()[row * cs.dv + e] = to_bf16(INFINITY);
                    else if (kind == Kind::f16) v.as<f16>()[row * cs.dv + e] = to_f16(INFINITY);
                    else if (e % 32 == 0) vs.as<float>()[(row * cs.dv + e) / 32] = INFINITY;
                  }
                }
          };
          const Caches bad = make_caches(kind, B, cs.Hkv, cs.lens, cs.dk, cs.dv, cs.block, seed, poison);
          const Tensor q = random_tensor(DType::f32, {B, cs.Hq, Nq, cs.dk}, seed, 3);
          runs([&] {
            DecodeOptions o;
            o.window_left = cs.window;
            o.causal = pc.qs.causal;
            o.window_right = pc.qs.right;
            o.compute = compute;
            o.threads = 2;
            Tensor want(DType::f32, {B, cs.Hq, Nq, cs.dv});
            decode(q.view(), clean.contiguous(), want.view(), {}, o);
            const KVCache layouts[] = {bad.contiguous(), bad.paged(), bad.interleaved()};
            for (int layout = 0; layout < 3; ++layout) {
              const KVCache& cache = layouts[layout];
              Tensor out(DType::f32, {B, cs.Hq, Nq, cs.dv});
              decode(q.view(), cache, out.view(), {}, o);
              for (std::int64_t b = 0; b < B; ++b)
                for (std::int64_t h = 0; h < cs.Hq; ++h)
                  for (std::int64_t i = 0; i < Nq; ++i) {
                    // Layout's visible range of token i: [lo, hi).
                    const std::int64_t len = cs.lens[b], pos = len - Nq + i;
                    const std::int64_t lo = std::max<std::int64_t>(0, cs.window >= 0 ? pos - cs.window : 0);
                    const std::int64_t hi = pc.qs.causal ? pos + 1 : pc.qs.right >= 0 ? std::min(len, pos + 1 + pc.qs.right) : len;
                    bool sees = false;
                    for (const std::int64_t back : pc.back) sees |= back && len - back >= lo && len - back < hi;
                    const float* got = out.as<float>() + ((b * cs.Hq + h) * Nq + i) * cs.dv;
                    const float* ref = want.as<float>() + ((b * cs.Hq + h) * Nq + i) * cs.dv;
                    const std::string at = what + (layout == 0 ? " contiguous" : layout == 1 ? " paged" : " interleaved") +
                                           " b " + std::to_string(b) + " h " + std::to_string(h) + " token " +
                                           std::to_string(i);
                    if (sees) {
                      ASSERT_FALSE(std::all_of(got, got + cs.dv, [](float x) { return std::isfinite(x); })) << at;
                    } else if (compute == Compute::native || kind != Kind::bf16) {
                      ASSERT_EQ(std::memcmp(got, ref, cs.dv * sizeof(float)), 0) << at;
                    } else {
                      for (std::int64_t e = 0; e < cs.dv; ++e) ASSERT_NEAR(got[e], ref[e], 1e-3) << at;
                    }
                  }
            }
          });
        }
  }
}

TEST(KVCache, ValuesHiddenFromSomeRowsNeverReachThem) {
  check_hidden_values({Compute::native, Compute::bf16}, each_target);
}
// The same with compute = bf16 on each bf16 product path (AMX tiles, vdpbf16ps).
TEST(KVCache, ValuesHiddenFromSomeRowsNeverReachThemOnEveryProductPath) {
  check_hidden_values({Compute::bf16}, each_bf16_path);
}

TEST(KVCache, QuantizeQ8RoundTripsWithinHalfAScale) {
  const Tensor x = random_tensor(DType::f32, {3, 64}, 5, 1, 10.0);
  Tensor q(DType::i8, {3, 64}), s(DType::f32, {3, 2});
  quantize_q8(x.view(), q.view(), s.view());
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const float scale = s.as<float>()[i / 32];
    const double back = double(static_cast<const std::int8_t*>(q.view().data)[i]) * scale;
    EXPECT_LE(std::fabs(back - x.as<float>()[i]), 0.5 * scale * (1 + 1e-6));
  }
  Tensor z(DType::f32, {1, 32}), zq(DType::i8, {1, 32}), zs(DType::f32, {1, 1});
  std::fill_n(z.as<float>(), 32, 0.0f);
  quantize_q8(z.view(), zq.view(), zs.view());
  EXPECT_EQ(zs.as<float>()[0], 0.0f);
}

// src's rows may lie a stride apart (here every other float of a wider tensor): the same bits as
// their contiguous copy.
TEST(KVCache, QuantizeQ8ReadsRowsAtAStride) {
  const Tensor x = random_tensor(DType::f32, {3, 64}, 6, 1, 10.0);
  Tensor wide = random_tensor(DType::f32, {3, 128}, 7, 1);
  for (std::int64_t i = 0; i < x.numel(); ++i) wide.as<float>()[2 * i] = x.as<float>()[i];
  const TensorView strided = TensorView::strided(wide.view().data, DType::f32, {3, 64}, {128, 2});
  Tensor q(DType::i8, {3, 64}), s(DType::f32, {3, 2}), q2(DType::i8, {3, 64}), s2(DType::f32, {3, 2});
  quantize_q8(x.view(), q.view(), s.view());
  quantize_q8(strided, q2.view(), s2.view());
  EXPECT_TRUE(std::equal(q.as<std::int8_t>(), q.as<std::int8_t>() + q.numel(), q2.as<std::int8_t>()));
  EXPECT_TRUE(std::equal(s.as<float>(), s.as<float>() + s.numel(), s2.as<float>()));
}

// Any non-finite value is refused, a NaN too (std::max, which finds the block's scale, passes
// over a NaN), before anything is written; an empty tensor quantises to nothing.
TEST(KVCache, QuantizeQ8RefusesNaNAndInfinityAndTakesEmpty) {
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY})
    for (const int at : {0, 17, 63}) {
      Tensor x = random_tensor(DType::f32, {2, 64}, 9, 1);
      x.as<float>()[64 + at] = bad;
      Tensor q(DType::i8, {2, 64}), s(DType::f32, {2, 2});
      std::fill_n(q.as<std::int8_t>(), q.numel(), std::int8_t{5});
      std::fill_n(s.as<float>(), s.numel(), 7.0f);
      EXPECT_THROW(quantize_q8(x.view(), q.view(), s.view()), Error) << bad << " at " << at;
      // Nothing is written, row 0 (all finite) included.
      EXPECT_TRUE(std::all_of(q.as<std::int8_t>(), q.as<std::int8_t>() + q.numel(), [](std::int8_t v) { return v == 5; }));
      EXPECT_TRUE(std::all_of(s.as<float>(), s.as<float>() + s.numel(), [](float v) { return v == 7.0f; }));
    }
  Tensor e(DType::f32, {0, 64}), eq(DType::i8, {0, 64}), es(DType::f32, {0, 2});
  EXPECT_NO_THROW(quantize_q8(e.view(), eq.view(), es.view()));
}

TEST(KVCache, BadArgumentsThrowNamingThem) {
  const Caches c = make_caches(Kind::i8, 2, 2, {5, 9}, 32, 32, 4, 7);
  const Tensor q = random_tensor(DType::f32, {2, 4, 32}, 7, 3);
  Tensor out(DType::f32, {2, 4, 32});
  auto message = [&](const KVCache& cache, const TensorView& qq, const TensorView& o) {
    try {
      decode(qq, cache, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  KVCache bad = c.contiguous();
  bad.k_scales = {};
  EXPECT_NE(message(bad, q.view(), out.view()).find("k_scales"), std::string::npos);
  const Tensor q3 = random_tensor(DType::f32, {2, 3, 32}, 7, 3);
  EXPECT_NE(message(c.contiguous(), q3.view(), out.view()).find("multiple"), std::string::npos);
  Tensor table(DType::i32, {2, 3});
  std::fill_n(static_cast<std::int32_t*>(table.view().data), 6, 99);
  bad = c.paged();
  bad.block_table = table.view();
  EXPECT_NE(message(bad, q.view(), out.view()).find("block_table"), std::string::npos);
  Tensor wrong(DType::f32, {2, 4, 31});
  EXPECT_NE(message(c.contiguous(), q.view(), wrong.view()).find("out"), std::string::npos);
  bad = c.paged();
  bad.seq_lens = {};
  EXPECT_NE(message(bad, q.view(), out.view()).find("seq_lens"), std::string::npos);
  Tensor starts(DType::i32, {2});
  for (const auto& [s0, s1] : {std::pair{-1, 0}, std::pair{0, 10}, std::pair{6, 0}}) {
    static_cast<std::int32_t*>(starts.view().data)[0] = s0;
    static_cast<std::int32_t*>(starts.view().data)[1] = s1;
    bad = c.paged();
    bad.seq_starts = starts.view();
    EXPECT_NE(message(bad, q.view(), out.view()).find("seq_starts"), std::string::npos) << s0 << " " << s1;
  }
  // Several new tokens: out and lse must carry Nq too.
  const Tensor q4 = random_tensor(DType::f32, {2, 4, 3, 32}, 7, 3);
  EXPECT_NE(message(c.contiguous(), q4.view(), out.view()).find("out: expected float32 [2, 4, 3, 32]"), std::string::npos);
  Tensor out4(DType::f32, {2, 4, 3, 32}), lse2(DType::f32, {2, 4});
  try {
    decode(q4.view(), c.contiguous(), out4.view(), lse2.view());
    ADD_FAILURE() << "lse of the wrong rank accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lse: expected float32 or float64 [2, 4, 3]"), std::string::npos) << e.what();
  }
  const Tensor q0 = random_tensor(DType::f32, {2, 4, 0, 32}, 7, 3);
  EXPECT_NE(message(c.contiguous(), q0.view(), out4.view()).find("Nq = 0"), std::string::npos);
  Tensor starts64(DType::f32, {2});
  bad = c.contiguous();
  bad.seq_starts = starts64.view();
  EXPECT_NE(message(bad, q.view(), out.view()).find("seq_starts"), std::string::npos);
  // A required view without data (q, k, v, out): named, not read.
  for (const char* name : {"q", "k", "v", "out"}) {
    KVCache cache = c.paged();
    TensorView qq = q.view(), o = out.view();
    const std::string n = name;
    (n == "q" ? qq : n == "k" ? cache.k : n == "v" ? cache.v : o).data = nullptr;
    EXPECT_NE(message(cache, qq, o).find(n + ": missing (null data pointer)"), std::string::npos) << name;
  }
  // A right window past the token's key contradicts causal; below -1 means nothing.
  for (const auto& [causal, right] : {std::pair{true, 1}, std::pair{false, -2}}) {
    DecodeOptions o;
    o.causal = causal;
    o.window_right = right;
    try {
      decode(q4.view(), c.contiguous(), out4.view(), {}, o);
      ADD_FAILURE() << "window_right " << right << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("window_right"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace attnscale

namespace attnscale {
namespace {

// forward() with a few new tokens at the bottom right of a causal mask takes the cache decode: a
// key only the last token sees (its own) holding Inf in V and NaN in K leaves the earlier tokens'
// rows as they are with finite values there, bit for bit, and makes the last token's not finite,
// on every target.
TEST(KVCache, ForwardDecodeRouteKeepsHiddenValuesFromEarlierTokens) {
  for_each_target([&] {
    for (const std::int64_t Nkv : {std::int64_t{2100}, std::int64_t{300}}) {
      const std::int64_t B = 1, Hq = 8, Hkv = 2, Nq = 3, d = 64;
      const Tensor q = random_tensor(DType::f32, {B, Hq, Nq, d}, 41, 1);
      const Tensor k = random_tensor(DType::f32, {B, Hkv, Nkv, d}, 41, 2), v = random_tensor(DType::f32, {B, Hkv, Nkv, d}, 41, 3);
      Tensor kb = random_tensor(DType::f32, {B, Hkv, Nkv, d}, 41, 2), vb = random_tensor(DType::f32, {B, Hkv, Nkv, d}, 41, 3);
      for (std::int64_t h = 0; h < Hkv; ++h)
        for (std::int64_t e = 0; e < d; ++e) {
          kb.as<float>()[(h * Nkv + Nkv - 1) * d + e] = NAN;
          vb.as<float>()[(h * Nkv + Nkv - 1) * d + e] = INFINITY;
        }
      Options o;
      o.mask.causal = true;
      o.mask.align = Align::bottom_right;
      Tensor clean(DType::f32, {B, Hq, Nq, d}), out(DType::f32, {B, Hq, Nq, d});
      forward(q.view(), k.view(), v.view(), {clean.view()}, o);
      forward(q.view(), kb.view(), vb.view(), {out.view()}, o);
      for (std::int64_t h = 0; h < Hq; ++h)
        for (std::int64_t i = 0; i < Nq; ++i) {
          const float* got = out.as<float>() + (h * Nq + i) * d;
          const float* want = clean.as<float>() + (h * Nq + i) * d;
          const std::string at = "Nkv " + std::to_string(Nkv) + " head " + std::to_string(h) + " token " + std::to_string(i);
          if (i == Nq - 1) ASSERT_FALSE(std::all_of(got, got + d, [](float x) { return std::isfinite(x); })) << at;
          else ASSERT_EQ(std::memcmp(got, want, d * sizeof(float)), 0) << at;
        }
    }
  });
}

// forward() with a few query rows and no explicit mask runs the cache decode (decode.cc): every
// causal / window combination that leaves a range of keys, including none, against float64, with
// one row a head and several (those the cache decode cannot express take the split-key kernels).
TEST(KVCache, ForwardDecodeRouteMatchesReferenceUnderMasks) {
  struct M {
    bool causal;
    Align align;
    std::int64_t left, right;
  };
  const std::vector<M> masks = {{false, Align::top_left, -1, -1},     {true, Align::top_left, -1, -1},
                                {true, Align::bottom_right, 300, -1}, {false, Align::top_left, 7, 1500},
                                {false, Align::bottom_right, 2, 0},   {true, Align::bottom_right, 0, -1},
                                {false, Align::bottom_right, 300, -1}, {false, Align::bottom_right, -1, 2}};
  // Each mask without transforms, with a softcap, with ALiBi slopes [Hq] and with both (ALiBi takes
  // the cache route only where the diagonal is the last visible key).
  const Tensor slopes = random_tensor(DType::f64, {8}, 31, 4, 0.05);
  // One query row (8 heads over one KV head) and several (4 and 9 rows of 8 heads over 2 KV heads:
  // each row a new token of the cache when its diagonal allows; 9 rows past the split-key decode's
  // 16 a KV head).
  // Over 2100 keys, over 37 and over 5 (short keys take the route for up to 4 rows a head, down
  // to one key for heads of 64 and more). The inputs and the float64 reference of each call are
  // made once, the call run on every target.
  for (const std::int64_t Nkv : {2100, 37, 5})
    for (const std::int64_t Nq : {1, 4, 9})
    for (const M& m : masks)
      for (int tf = 0; tf < 4; ++tf) {
      if ((Nq == 4 && (tf == 1 || tf == 2)) || (Nq == 9 && tf != 3)) continue;  // fewer transforms there
      if (Nkv < 100 && (Nq == 9 || tf == 1 || tf == 2)) continue;  // the tiles' call; fewer transforms
      if (Nq == 1 && m.align == Align::bottom_right && m.right > 0) continue;  // nothing after the last key
      // d = 72 over 5 keys: calls under 16 keys take the route only for heads of 64 and more.
      const std::int64_t B = 2, Hq = 8, Hkv = Nq == 1 ? 1 : 2, d = Nkv < 16 ? 72 : 40;
      const Tensor q = random_tensor(DType::f32, {B, Hq, Nq, d}, 31, 1), k = random_tensor(DType::f32, {B, Hkv, Nkv, d}, 31, 2),
                   v = random_tensor(DType::f32, {B, Hkv, Nkv, d}, 31, 3);
      Options o;
      o.mask.causal = m.causal;
      o.mask.align = m.align;
      o.mask.window_left = m.left;
      o.mask.window_right = m.right;
      if (tf & 1) o.softcap = 2.0;
      if (tf & 2) o.alibi_slopes = slopes.view();
      Tensor ref(DType::f64, {B, Hq, Nq, d}), rlse(DType::f64, {B, Hq, Nq});
      reference::forward(q.view(), k.view(), v.view(), {ref.view(), rlse.view()}, o);
      // With ALiBi the scores reach |slope|·Nkv ≈ 100-250, where float32's spacing is 1e-5: the
      // tolerance follows.
      const double tol = tf & 2 ? 2e-5 : 2e-6;
      const std::string what = "Nkv " + std::to_string(Nkv) + " Nq " + std::to_string(Nq) + " causal " + std::to_string(m.causal) + " align " +
                               std::to_string(int(m.align)) + " window " + std::to_string(m.left) + " " +
                               std::to_string(m.right) + " transforms " + std::to_string(tf);
      for_each_target([&] {
        Tensor out(DType::f32, {B, Hq, Nq, d}), lse(DType::f32, {B, Hq, Nq});
        forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, o);
        EXPECT_LE(testing::rel_error(out.view(), ref.view()), tol) << what;
        EXPECT_LE(testing::rel_error(lse.view(), rlse.view()), tol / 2) << what;
      });
      }
}

// bfloat16 q, k, v with few rows take the same route (over short keys too: up to 128 rows a KV
// head), the cache read as bf16 and q, out and a bfloat16 lse through float32 copies: against
// float64 on the bf16 values, within the bf16 forward's rule (1e-2 relative), every output element
// written (poisoned first). 17 keys under 29 causal rows: the first 12 see none; likewise one key
// under 4 rows and 7 under 16.
TEST(KVCache, ForwardDecodeRouteTakesBfloat16) {
  struct Case {
    std::int64_t Nq, Nkv;
  };
  // The inputs and the float64 reference of each call made once, the call run on every target.
  for (const Case c : {Case{1, 2300}, Case{3, 2300}, Case{1, 37}, Case{29, 17}, Case{4, 1}, Case{16, 7}})
    for (const bool causal : {false, true})
      for (const DType lse_type : {DType::f32, DType::bf16}) {
        const std::int64_t B = 2, Hq = 8, Hkv = 2, Nq = c.Nq, Nkv = c.Nkv, d = 64;
        const Tensor q = random_tensor(DType::bf16, {B, Hq, Nq, d}, 41, 1),
                     k = random_tensor(DType::bf16, {B, Hkv, Nkv, d}, 41, 2),
                     v = random_tensor(DType::bf16, {B, Hkv, Nkv, d}, 41, 3);
        Options o;
        o.mask.causal = causal;
        o.mask.align = Align::bottom_right;
        o.softcap = causal ? 0.0 : 3.0;
        Tensor ref(DType::f64, {B, Hq, Nq, d}), rlse(DType::f64, {B, Hq, Nq});
        reference::forward(q.view(), k.view(), v.view(), {ref.view(), rlse.view()}, o);
        const std::string what = "Nq " + std::to_string(Nq) + " Nkv " + std::to_string(Nkv) + " causal " + std::to_string(causal) + " lse " +
                                 std::string(dtype_name(lse_type));
        for_each_target([&] {
          Tensor out(DType::bf16, {B, Hq, Nq, d}), lse(lse_type, {B, Hq, Nq});
          testing::poison(out);
          testing::poison(lse);
          forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, o);
          EXPECT_LE(testing::rel_error(out.view(), ref.view()), 1e-2) << what;
          EXPECT_LE(testing::rel_error(lse.view(), rlse.view()), 1e-2) << what;
        });
      }
}

}  // namespace
}  // namespace attnscale
