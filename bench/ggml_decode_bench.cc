// One new token's decode beside llama.cpp's ggml: `ggml_flash_attn_ext` (CPU backend) over f32,
// f16 and q8_0 K/V against attnscale::decode over f32, bf16, int8 (q8: 32 values and a float32
// scale) and f16 caches of the same values, and over the bf16 cache with compute = bf16 (GQA's
// products on bf16 operands; docs/performance.md, "2026-12-05, 03:04" and "06:00").
//
// Per shape: K, V and q normal(0, 1) from a fixed seed; each round times one call of each of the
// eight variants on two threads, the first variant moving on by one each round; 2 untimed rounds,
// then ROUNDS (31). ggml runs on its own thread pool, resumed before and paused after each of its
// calls (untimed), so that its spinning workers do not take the cores from our calls; build ggml
// with -DGGML_OPENMP=OFF for that (with OpenMP the pause does nothing). Every buffer is 2 MiB
// aligned and advised into huge pages, as the library's own blocks are (GGML_HUGE=0: ggml's not).
// Prints each variant's median ms [quartiles], the medians of the per-round tokens/s ratios, and
// each output's largest error against a float64 reference on the values as that cache holds them.
//
// Built when a ggml install is on CMAKE_PREFIX_PATH (bench/CMakeLists.txt):
//   cmake -S ggml -B ggml/build -DGGML_NATIVE=ON -DGGML_OPENMP=OFF && cmake --build ggml/build
//   cmake --install ggml/build --prefix /opt/ggml
//   cmake -B build -DCMAKE_PREFIX_PATH=/opt/ggml && cmake --build build --target ggml_decode_bench
//   build/bin/ggml_decode_bench [shape indices, e.g. 0,4]
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attnscale/kv_cache.h"
#include "attnscale/tensor.h"
#include "ggml-cpu.h"
#include "ggml.h"

using namespace attnscale;
using clk = std::chrono::steady_clock;

// bytes rounded up to 2 MiB, aligned to 2 MiB, advised into huge pages (when advise), zeroed.
static void* huge_alloc(size_t bytes, bool advise) {
  const size_t align = size_t(2) << 20;
  const size_t size = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size);
  if (!p) { std::fprintf(stderr, "alloc %zu failed\n", size); std::exit(1); }
#ifdef MADV_HUGEPAGE
  if (advise) madvise(p, size, MADV_HUGEPAGE);
#endif
  std::memset(p, 0, size);  // fault the pages in
  return p;
}

struct Shape { int64_t Hq, Hkv, Nkv, d; };

// float64 reference: q [Hq, d], k/v [Hkv, Nkv, d] (already rounded values, as float)
static void ref64(const Shape& s, const float* q, const float* k, const float* v, double* out) {
  const int64_t g = s.Hq / s.Hkv;
  const double scale = 1.0 / std::sqrt(double(s.d));
  auto head = [&](int64_t h) {
    const int64_t hk = h / g;
    std::vector<double> sc(s.Nkv);
    double m = -INFINITY;
    for (int64_t j = 0; j < s.Nkv; ++j) {
      const float* kr = k + (hk * s.Nkv + j) * s.d;
      double a = 0;
      for (int64_t i = 0; i < s.d; ++i) a += double(q[h * s.d + i]) * double(kr[i]);
      sc[j] = a * scale;
      m = std::max(m, sc[j]);
    }
    double l = 0;
    std::vector<double> o(s.d, 0.0);
    for (int64_t j = 0; j < s.Nkv; ++j) {
      const double p = std::exp(sc[j] - m);
      l += p;
      const float* vr = v + (hk * s.Nkv + j) * s.d;
      for (int64_t i = 0; i < s.d; ++i) o[i] += p * double(vr[i]);
    }
    for (int64_t i = 0; i < s.d; ++i) out[h * s.d + i] = o[i] / l;
  };
  std::thread t([&] { for (int64_t h = 1; h < s.Hq; h += 2) head(h); });
  for (int64_t h = 0; h < s.Hq; h += 2) head(h);
  t.join();
}

// The largest |a[i] - b[i]| (float outputs against a float64 reference or another float output).
template <class A, class B>
static double max_abs_diff(const A* a, const B* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}
static double max_abs(const double* a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i]));
  return m;
}

static double quantile(std::vector<double> x, double p) {  // linear interpolation (type 7)
  std::sort(x.begin(), x.end());
  const double pos = p * (x.size() - 1);
  const size_t i = size_t(pos);
  const double f = pos - i;
  return i + 1 < x.size() ? x[i] * (1 - f) + x[i + 1] * f : x[i];
}

// One ggml flash_attn_ext graph over K/V of one type.
struct GgmlCase {
  ggml_context* ctx = nullptr;
  ggml_cgraph* gf = nullptr;
  ggml_tensor *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  ggml_cplan plan{};
  std::vector<uint8_t> work;
  void* buf = nullptr;

  void init(const Shape& s, ggml_type t, const float* qf, const float* kf, const float* vf, ggml_threadpool* tp,
            bool huge) {
    const size_t kv_bytes = ggml_row_size(t, s.d) * s.Nkv * s.Hkv;
    const size_t mem = 2 * kv_bytes + 2 * sizeof(float) * s.Hq * s.d + 8 * ggml_tensor_overhead() +
                       ggml_graph_overhead() + (size_t(4) << 20);
    buf = huge_alloc(mem, huge);
    ggml_init_params ip{mem, buf, false};
    ctx = ggml_init(ip);
    q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, s.d, 1, s.Hq, 1);
    k = ggml_new_tensor_4d(ctx, t, s.d, s.Nkv, s.Hkv, 1);
    v = ggml_new_tensor_4d(ctx, t, s.d, s.Nkv, s.Hkv, 1);
    std::memcpy(q->data, qf, sizeof(float) * s.Hq * s.d);
    const int64_t rows = s.Nkv * s.Hkv;
    if (t == GGML_TYPE_F32) {
      std::memcpy(k->data, kf, sizeof(float) * rows * s.d);
      std::memcpy(v->data, vf, sizeof(float) * rows * s.d);
    } else if (t == GGML_TYPE_F16) {
      ggml_fp32_to_fp16_row(kf, (ggml_fp16_t*)k->data, rows * s.d);
      ggml_fp32_to_fp16_row(vf, (ggml_fp16_t*)v->data, rows * s.d);
    } else {
      ggml_quantize_chunk(t, kf, k->data, 0, rows, s.d, nullptr);
      ggml_quantize_chunk(t, vf, v->data, 0, rows, s.d, nullptr);
    }
    out = ggml_flash_attn_ext(ctx, q, k, v, nullptr, float(1.0 / std::sqrt(double(s.d))), 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);  // CPU: same code for DEFAULT and F32
    gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    plan = ggml_graph_plan(gf, 2, tp);
    work.resize(plan.work_size + 64);
    plan.work_data = work.data();
  }
  void run() {
    if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) { std::fprintf(stderr, "ggml compute failed\n"); std::exit(1); }
  }
  // K/V values as ggml holds them, back to float
  std::vector<float> dequant(const ggml_tensor* x) const {
    const int64_t n = ggml_nelements(x);
    std::vector<float> r(n);
    if (x->type == GGML_TYPE_F32) std::memcpy(r.data(), x->data, n * 4);
    else ggml_get_type_traits(x->type)->to_float(x->data, r.data(), n);
    return r;
  }
  void free_() { ggml_free(ctx); std::free(buf); }
};

int main(int argc, char** argv) {
  const int rounds = std::getenv("ROUNDS") ? std::atoi(std::getenv("ROUNDS")) : 31;
  if (rounds < 1) {
    std::fprintf(stderr, "ggml_decode_bench: ROUNDS must be a positive integer\n");
    return 2;
  }
  const bool ggml_huge = !std::getenv("GGML_HUGE") || std::atoi(std::getenv("GGML_HUGE")) != 0;
  const int warm = 2;
  std::vector<Shape> shapes = {{8, 8, 65536, 128}, {8, 8, 4096, 128}, {8, 8, 65536, 64},
                               {8, 8, 4096, 64},   {32, 8, 65536, 128}, {32, 4, 65536, 128}};
  if (argc > 1) {  // optional: a list of shape indices, e.g. "0,4"
    std::vector<Shape> sel;
    for (const char* p = argv[1];;) {
      char* end = nullptr;
      const long i = std::strtol(p, &end, 10);
      if (end == p || i < 0 || i >= static_cast<long>(shapes.size()) || (*end != ',' && *end != '\0')) {
        std::fprintf(stderr, "ggml_decode_bench: shapes: '%s' is not a list of indices 0..%zu\n", argv[1],
                     shapes.size() - 1);
        return 2;
      }
      sel.push_back(shapes[i]);
      if (*end == '\0') break;
      p = end + 1;
    }
    shapes = sel;
  }
  std::printf("rounds %d, warm-up rounds %d, threads 2, ggml buffers MADV_HUGEPAGE: %d\n", rounds, warm, ggml_huge);

  ggml_cpu_init();
  ggml_threadpool_params tpp = ggml_threadpool_params_default(2);
  tpp.paused = true;
  ggml_threadpool* tp = ggml_threadpool_new(&tpp);

  enum { G_F32, G_F16, G_Q8, O_F32, O_BF16, O_I8, O_F16, O_BF16P, NC };
  const char* names[NC] = {"ggml-f32", "ggml-f16", "ggml-q8_0", "ours-f32", "ours-bf16", "ours-int8", "ours-f16",
                           "ours-bf16p"};

  for (const Shape& s : shapes) {
    std::printf("\n=== Hq %lld Hkv %lld Nkv %lld d %lld ===\n", (long long)s.Hq, (long long)s.Hkv, (long long)s.Nkv,
                (long long)s.d);
    std::fflush(stdout);
    const int64_t nkv_vals = s.Hkv * s.Nkv * s.d, nq = s.Hq * s.d;
    // source values: float32, normal(0,1), fixed seed
    std::vector<float> kf(nkv_vals), vf(nkv_vals), qf(nq);
    {
      std::mt19937_64 rng(12345 + s.Hq * 7 + s.Hkv * 11 + s.Nkv + s.d);
      std::normal_distribution<float> nd(0.f, 1.f);
      for (auto& x : kf) x = nd(rng);
      for (auto& x : vf) x = nd(rng);
      for (auto& x : qf) x = nd(rng);
    }
    GgmlCase g[3];
    g[0].init(s, GGML_TYPE_F32, qf.data(), kf.data(), vf.data(), tp, ggml_huge);
    g[1].init(s, GGML_TYPE_F16, qf.data(), kf.data(), vf.data(), tp, ggml_huge);
    g[2].init(s, GGML_TYPE_Q8_0, qf.data(), kf.data(), vf.data(), tp, ggml_huge);

    // ours: q [1, Hq, d], out [1, Hq, d]; caches [1, Hkv, Nkv, d]
    float* oq = (float*)huge_alloc(nq * 4, true);
    std::memcpy(oq, qf.data(), nq * 4);
    const TensorView q3 = TensorView::contiguous(oq, DType::f32, {1, s.Hq, s.d});
    float* kf32 = (float*)huge_alloc(2 * nkv_vals * 4, true);
    std::memcpy(kf32, kf.data(), nkv_vals * 4);
    std::memcpy(kf32 + nkv_vals, vf.data(), nkv_vals * 4);
    uint16_t* kbf = (uint16_t*)huge_alloc(2 * nkv_vals * 2, true);
    uint16_t* kh = (uint16_t*)huge_alloc(2 * nkv_vals * 2, true);
    for (int64_t i = 0; i < nkv_vals; ++i) {
      kbf[i] = to_bf16(kf[i]).bits; kbf[nkv_vals + i] = to_bf16(vf[i]).bits;
      kh[i] = to_f16(kf[i]).bits;   kh[nkv_vals + i] = to_f16(vf[i]).bits;
    }
    const int64_t nscales = nkv_vals / 32;
    char* ki8 = (char*)huge_alloc(2 * nkv_vals + 2 * nscales * 4, true);
    const TensorView k8 = TensorView::contiguous(ki8, DType::i8, {1, s.Hkv, s.Nkv, s.d});
    const TensorView v8 = TensorView::contiguous(ki8 + nkv_vals, DType::i8, {1, s.Hkv, s.Nkv, s.d});
    const TensorView ks = TensorView::contiguous(ki8 + 2 * nkv_vals, DType::f32, {1, s.Hkv, s.Nkv, s.d / 32});
    const TensorView vs =
        TensorView::contiguous(ki8 + 2 * nkv_vals + nscales * 4, DType::f32, {1, s.Hkv, s.Nkv, s.d / 32});
    quantize_q8(TensorView::contiguous(kf.data(), DType::f32, {1, s.Hkv, s.Nkv, s.d}), k8, ks);
    quantize_q8(TensorView::contiguous(vf.data(), DType::f32, {1, s.Hkv, s.Nkv, s.d}), v8, vs);

    auto view4 = [&](void* p, DType t) { return TensorView::contiguous(p, t, {1, s.Hkv, s.Nkv, s.d}); };
    const KVCache c_f32{view4(kf32, DType::f32), view4(kf32 + nkv_vals, DType::f32), {}, {}, {}, {}};
    const KVCache c_bf16{view4(kbf, DType::bf16), view4(kbf + nkv_vals, DType::bf16), {}, {}, {}, {}};
    const KVCache c_f16{view4(kh, DType::f16), view4(kh + nkv_vals, DType::f16), {}, {}, {}, {}};
    const KVCache c_i8{k8, v8, ks, vs, {}, {}};
    std::vector<std::vector<float>> outs(NC, std::vector<float>(nq));
    float* oo[NC - O_F32];
    for (float*& o : oo) o = (float*)huge_alloc(nq * 4, true);
    DecodeOptions opts;
    opts.threads = 2;
    opts.scale = Scale{};  // default 1/sqrt(dk)
    DecodeOptions bf16_products = opts;
    bf16_products.compute = Compute::bf16;

    auto call = [&](int c) -> double {
      if (c <= G_Q8) {
        ggml_threadpool_resume(tp);  // untimed: workers awake and polling when the call starts
        const auto t0 = clk::now();
        g[c].run();
        const auto t1 = clk::now();
        ggml_threadpool_pause(tp);  // park them so they do not spin through our calls
        return std::chrono::duration<double>(t1 - t0).count();
      }
      const KVCache* cc = c == O_F32 ? &c_f32 : c == O_BF16 || c == O_BF16P ? &c_bf16 : c == O_I8 ? &c_i8 : &c_f16;
      const TensorView o3 = TensorView::contiguous(oo[c - O_F32], DType::f32, {1, s.Hq, s.d});
      const auto t0 = clk::now();
      decode(q3, *cc, o3, {}, c == O_BF16P ? bf16_products : opts);
      const auto t1 = clk::now();
      return std::chrono::duration<double>(t1 - t0).count();
    };

    std::vector<std::vector<double>> t(NC);
    for (int r = 0; r < warm + rounds; ++r)
      for (int i = 0; i < NC; ++i) {
        const int c = (i + r) % NC;
        const double dt = call(c);
        if (r >= warm) t[c].push_back(dt);
      }

    // results
    for (int c = 0; c < NC; ++c) {
      std::printf("%-10s median %8.3f ms  q1 %8.3f  q3 %8.3f  min %8.3f\n", names[c], 1e3 * quantile(t[c], 0.5),
                  1e3 * quantile(t[c], 0.25), 1e3 * quantile(t[c], 0.75),
                  1e3 * *std::min_element(t[c].begin(), t[c].end()));
    }
    auto ratio = [&](int ours, int theirs, const char* label) {  // tokens/s ours / theirs, per round
      std::vector<double> r;
      for (int i = 0; i < rounds; ++i) r.push_back(t[theirs][i] / t[ours][i]);
      std::printf("ratio %-22s median %.3f  [q1 %.3f, q3 %.3f]\n", label, quantile(r, 0.5), quantile(r, 0.25),
                  quantile(r, 0.75));
    };
    ratio(O_BF16, G_F16, "ours-bf16/ggml-f16");
    ratio(O_BF16P, G_F16, "ours-bf16p/ggml-f16");
    ratio(O_I8, G_F16, "ours-int8/ggml-f16");
    ratio(O_I8, G_Q8, "ours-int8/ggml-q8_0");
    ratio(O_F32, G_F32, "ours-f32/ggml-f32");
    ratio(O_F16, G_F16, "ours-f16/ggml-f16");

    // correctness
    for (int c = 0; c < 3; ++c) std::memcpy(outs[c].data(), g[c].out->data, nq * 4);
    for (int c = O_F32; c < NC; ++c) std::memcpy(outs[c].data(), oo[c - O_F32], nq * 4);
    std::vector<double> ref(nq);
    auto check = [&](const std::vector<float>& kk, const std::vector<float>& vv, const char* what,
                     std::initializer_list<int> who) {
      ref64(s, qf.data(), kk.data(), vv.data(), ref.data());
      std::printf("ref(%s) max|ref| %.3e:", what, max_abs(ref.data(), nq));
      for (int c : who) std::printf("  %s %.3e", names[c], max_abs_diff(outs[c].data(), ref.data(), nq));
      std::printf("\n");
    };
    check(kf, vf, "f32 values", {G_F32, O_F32, G_F16, O_BF16});
    check(g[1].dequant(g[1].k), g[1].dequant(g[1].v), "f16-rounded", {G_F16, O_F16});
    {
      std::vector<float> kb(nkv_vals), vb(nkv_vals);
      for (int64_t i = 0; i < nkv_vals; ++i) { kb[i] = from_bf16(bf16{kbf[i]}); vb[i] = from_bf16(bf16{kbf[nkv_vals + i]}); }
      check(kb, vb, "bf16-rounded", {O_BF16, O_BF16P});
      const int8_t* q8 = (const int8_t*)ki8;
      const float* sc = (const float*)(ki8 + 2 * nkv_vals);
      for (int64_t i = 0; i < nkv_vals; ++i) { kb[i] = sc[i / 32] * q8[i]; vb[i] = sc[nscales + i / 32] * q8[nkv_vals + i]; }
      check(kb, vb, "ours-int8 dequant", {O_I8});
    }
    check(g[2].dequant(g[2].k), g[2].dequant(g[2].v), "ggml-q8_0 dequant", {G_Q8});
    std::printf("direct: ggml-f16 vs ours-bf16 %.3e; ggml-f16 vs ours-f16 %.3e; ggml-f32 vs ours-f32 %.3e\n",
                max_abs_diff(outs[G_F16].data(), outs[O_BF16].data(), nq),
                max_abs_diff(outs[G_F16].data(), outs[O_F16].data(), nq),
                max_abs_diff(outs[G_F32].data(), outs[O_F32].data(), nq));
    std::fflush(stdout);

    for (auto& x : g) x.free_();
    std::free(oq); std::free(kf32); std::free(kbf); std::free(kh); std::free(ki8);
    for (auto* p : oo) std::free(p);
  }
  ggml_threadpool_free(tp);
  return 0;
}
