// saturation: the Simulation note's experiment. Q, K [N, d] with i.i.d. N(0, 1) entries; P = softmax(Q Kᵀ s)
// by attnscale::forward (probs output); per row top_p_95, entropy, max_weight, participation,
// averaged over the N rows of a trial; mean and 95% CI over trials.
//
// Scalings (s): none 1; sqrt 1/√d; linear 1/d; qk-norm: LayerNorm on q and k rows, then 1/√d;
// log-n: √(ln N)/√d. All scalings of one (N, d, trial) see the same Q and K, as in the Simulation note.
// Theory: the Random Energy Model (theory.h, attention_rows.h), averaged over |q|².
//
// Speed: trials go in chunks of kChunk; a chunk's Q and K are drawn by the vectorised Philox
// (normals.h) straight into [kChunk, 1, N, d] tensors, one forward call per scaling computes every
// probability matrix of the chunk, and row_metrics_batch takes the chunk's rows. --dtype f32 (the
// default) runs all of it in float32; f64 draws the same normals unrounded and runs the float64
// engine and the scalar metrics (the test LabSaturation.Float32MatchesFloat64 compares the two).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "attnscale/attention.h"
#include "common/parallel.h"
#include "lab/attention_rows.h"
#include "lab/normals.h"
#include "lab/registry.h"
#include "lab/rng.h"
#include "lab/row_metrics_batch.h"
#include "lab/sweep_memory.h"

namespace attnscale::lab {
namespace {

const std::vector<std::string> kScalings = {"none", "sqrt", "linear", "qk-norm", "log-n"};
constexpr std::int64_t kChunk = 16;          // trials per forward call
constexpr std::uint64_t kGammaBase = 1ull << 40;  // Wishart's χ² draws: block indices past the normals'

inline std::int64_t column_ld(std::int64_t n) { return (n + 15) / 16 * 16; }

// --sampler wishart draws a point with d < N directly (K Kᵀ is singular there, and the Bartlett
// factor does not exist). A sweep with such points and others records what it used as this, which
// reads back as wishart, so that its metadata names the samplers and still reproduces the run.
constexpr const char* kWishartWithDirect = "wishart (direct where d < N)";

// The sampler a flag value names: auto, direct or wishart.
std::string sampler_named(const std::string& flag) { return flag == kWishartWithDirect ? "wishart" : flag; }

// The sampler as the run used it, for the metadata: --sampler wishart where every point has d < N
// drew them all directly ("direct"), where some have, kWishartWithDirect.
Args samplers_used(const Args& a) {
  Args used = a;
  if (sampler_named(a.get("sampler")) != "wishart") return used;
  std::size_t direct = 0, all = 0;
  for (const std::int64_t n : a.ints("n"))
    for (const std::int64_t d : a.ints("d")) ++all, direct += d < n;
  used.values["sampler"] = direct == 0 ? "wishart" : direct == all ? "direct" : kWishartWithDirect;
  return used;
}

template <class T>
constexpr DType dtype_of() {
  return sizeof(T) == 4 ? DType::f32 : DType::f64;
}

// One thread's buffers, reused from chunk to chunk.
template <class T>
struct ChunkScratch {
  std::vector<T> q, k, qn, kn, zq, ak, v, out, probs, columns;
  std::vector<double> metrics, scratch;
};

// LayerNorm without affine parameters (ε = 1e-5) over each of the c·n rows of d elements, in
// float64. Row i of problem t starts at x[t·n·d + i·rs] and its elements are cs apart:
// (rs, cs) = (d, 1) for K (row-major), (1, n) for Q (column-major, see forward_probs).
template <class T>
void layer_norm(T* x, std::int64_t c, std::int64_t n, std::int64_t d, std::int64_t rs, std::int64_t cs) {
  for (std::int64_t t = 0; t < c; ++t)
    for (std::int64_t i = 0; i < n; ++i) {
      T* r = x + t * n * d + i * rs;
      double m = 0, v = 0;
      for (std::int64_t k = 0; k < d; ++k) m += r[k * cs];
      m /= d;
      for (std::int64_t k = 0; k < d; ++k) v += (r[k * cs] - m) * (r[k * cs] - m);
      v /= d;
      const double inv = 1 / std::sqrt(v + 1e-5);
      for (std::int64_t k = 0; k < d; ++k) r[k * cs] = static_cast<T>((r[k * cs] - m) * inv);
    }
}

// Wishart sampler (attention_rows.h, sample_qk_wishart): zq = Z [n, n] Gaussian, ak = the Bartlett
// factor A [n, n] (A_ii = √χ²_{d−i}, normals below the diagonal, zeros above).
template <class T>
void wishart_qk(const Stream& s, std::int64_t n, std::int64_t d, T* zq, T* ak) {
  fill_normals(s, 0, n * n, zq);
  // The n(n−1)/2 normals below the diagonal, row after row, drawn in one block and spread out.
  fill_normals(s, normal_offset_after(n * n), n * (n - 1) / 2, ak + n * n - n * (n - 1) / 2);
  const T* below = ak + n * n - n * (n - 1) / 2;
  // The diagonal: χ²_ν = 2 Gamma(ν/2), ν = d − i, by Marsaglia–Tsang (rng.cc) with the first attempt
  // batched: x_i from one vectorised block of normals, u_i = uniform(kGammaBase + i), and the
  // squeeze u < 1 − 0.0331 x⁴ (a lower bound of the acceptance test) before the logarithms. A
  // rejected first attempt — or a shape below 1 — takes a whole fresh draw, s.gamma at index
  // kGammaBase + n + i: rejection sampling restarted on independent numbers, so still exact.
  T x[64];
  for (std::int64_t i0 = 0; i0 < n; i0 += 64) {
    const std::int64_t m = std::min<std::int64_t>(64, n - i0);
    fill_normals(s, normal_offset_after(n * n) + normal_offset_after(n * (n - 1) / 2) + static_cast<std::uint64_t>(i0),
                 m, x);
    for (std::int64_t i = i0; i < i0 + m; ++i) {
      std::copy(below + i * (i - 1) / 2, below + i * (i - 1) / 2 + i, ak + i * n);  // row i: i normals
      std::fill(ak + i * n + i + 1, ak + (i + 1) * n, T(0));
      const double shape = (d - i) / 2.0;
      double g = -1;
      if (shape >= 1) {
        const double c = shape - 1.0 / 3, xi = x[i - i0], v1 = 1 + xi / std::sqrt(9 * c);
        if (v1 > 0) {
          const double v = v1 * v1 * v1, u = s.uniform(kGammaBase + i), x2 = xi * xi;
          if (u < 1 - 0.0331 * x2 * x2 || std::log(u) < 0.5 * x2 + c - c * v + c * std::log(v)) g = c * v;
        }
      }
      if (g < 0) g = s.gamma(kGammaBase + n + i, shape);
      ak[i * n + i] = static_cast<T>(std::sqrt(2 * g));
    }
  }
}

// probs = softmax(q kᵀ · scale) for c stacked [n, dq] problems, one engine call, row-major
// [c, n, n]. float32 rows are then transposed into `columns`, key-major over the whole chunk:
// element (t, i, j) at columns[j·ld + t·n + i] (ld = c·n rounded up to 16), the layout
// row_metrics_columns reads, rows of all trials packed into full SIMD blocks. The transposition is
// the lab's; the engine writes probabilities in the caller's row layout only.
template <class T>
void forward_probs(const T* q, const T* k, std::int64_t c, std::int64_t n, std::int64_t dq, double scale,
                   ChunkScratch<T>& s) {
  s.v.resize(c * n, T(0));  // V = 0 (only the probabilities are wanted); never written
  s.out.resize(c * n);
  Options opt;
  opt.scale = Scale::value(scale);
  opt.threads = 1;  // the lab parallelises over chunks
  Outputs o;
  o.out = TensorView::contiguous(s.out.data(), dtype_of<T>(), {c, 1, n, 1});
  s.probs.resize(c * n * n);
  o.probs = TensorView::contiguous(s.probs.data(), dtype_of<T>(), {c, 1, n, n});
  // Q column-major per problem (element (i, k) at q[t·n·dq + k·n + i]): the engine packs it with
  // contiguous copies. Its entries are i.i.d. N(0, 1) either way.
  forward(TensorView::strided(const_cast<T*>(q), dtype_of<T>(), {c, 1, n, dq}, {n * dq, n * dq, 1, n}),
          TensorView::contiguous(const_cast<T*>(k), dtype_of<T>(), {c, 1, n, dq}),
          TensorView::contiguous(s.v.data(), dtype_of<T>(), {c, 1, n, 1}), o, opt);
  if constexpr (sizeof(T) == 4) {
    // Row r = t·n + i of the chunk becomes lane r of every key's column; padding lanes (r ≥ c·n)
    // stay as they are: finite, never read back.
    const std::int64_t rows = c * n, ld = column_ld(rows);
    s.columns.resize(n * ld);
    T* const cols = s.columns.data();
    const T* const p = s.probs.data();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < n; ++j) cols[j * ld + r] = p[r * n + j];
  }
}

// Trials [t0, t1): out[(t − t0)·width + scaling·kRowMetrics + metric] = the trial's row means.
template <class T>
void run_chunk(const Args& a, std::uint32_t stream_experiment, std::int64_t n, std::int64_t d, bool wishart,
               bool need_direct, const std::vector<std::string>& scalings, const std::vector<double>& scales,
               std::int64_t t0, std::int64_t t1, double* out, ChunkScratch<T>& s) {
  const std::int64_t c = t1 - t0, width = static_cast<std::int64_t>(scalings.size()) * kRowMetrics;
  if (need_direct) {
    s.q.resize(c * n * d);
    s.k.resize(c * n * d);
  }
  if (wishart) {
    s.zq.resize(c * n * n);
    s.ak.resize(c * n * n);
  }
  for (std::int64_t t = t0; t < t1; ++t) {
    const auto trial = static_cast<std::uint32_t>(t);
    if (need_direct) {
      const Stream st(a.seed, stream_id(stream_experiment, {n, d}), trial);
      fill_normals(st, 0, n * d, s.q.data() + (t - t0) * n * d);
      fill_normals(st, normal_offset_after(n * d), n * d, s.k.data() + (t - t0) * n * d);
    }
    if (wishart)
      wishart_qk(Stream(a.seed, stream_id(stream_experiment, {n, d, 1}), trial), n, d,
                 s.zq.data() + (t - t0) * n * n, s.ak.data() + (t - t0) * n * n);
  }
  s.metrics.resize(c * n * kRowMetrics);
  for (std::size_t sc = 0; sc < scalings.size(); ++sc) {
    if (scalings[sc] == "qk-norm") {
      if (s.qn.size() != s.q.size()) {
        s.qn = s.q;
        s.kn = s.k;
        layer_norm(s.qn.data(), c, n, d, 1, n);
        layer_norm(s.kn.data(), c, n, d, d, 1);
      }
      forward_probs(s.qn.data(), s.kn.data(), c, n, d, scales[sc], s);
    } else if (wishart) {
      forward_probs(s.zq.data(), s.ak.data(), c, n, n, scales[sc], s);
    } else {
      forward_probs(s.q.data(), s.k.data(), c, n, d, scales[sc], s);
    }
    if constexpr (sizeof(T) == 4) {
      row_metrics_columns(s.columns.data(), column_ld(c * n), c * n, n, s.metrics.data());
    } else {
      for (std::int64_t r = 0; r < c * n; ++r)
        row_metrics(s.probs.data() + r * n, n, s.metrics.data() + r * kRowMetrics, s.scratch);
    }
    for (std::int64_t t = 0; t < c; ++t)
      for (int j = 0; j < kRowMetrics; ++j) {
        double sum = 0;
        for (std::int64_t i = 0; i < n; ++i) sum += s.metrics[(t * n + i) * kRowMetrics + j];
        out[t * width + sc * kRowMetrics + j] = sum / n;
      }
  }
  s.qn.clear();
}

template <class T>
std::vector<double> run_trials(const Args& a, std::uint32_t stream_experiment, std::int64_t n, std::int64_t d,
                               bool wishart, bool need_direct, const std::vector<std::string>& scalings,
                               const std::vector<double>& scales) {
  const std::size_t width = scalings.size() * kRowMetrics;
  std::vector<double> flat(static_cast<std::size_t>(a.trials) * width);
  const int threads = resolve_threads(a.threads, (a.trials + kChunk - 1) / kChunk);
  std::vector<std::unique_ptr<ChunkScratch<T>>> scratch(threads);
  parallel_for(a.trials, kChunk, threads, [&](std::int64_t b, std::int64_t e, int th) {
    if (!scratch[th]) scratch[th] = std::make_unique<ChunkScratch<T>>();
    for (std::int64_t t0 = b; t0 < e; t0 += kChunk)
      run_chunk<T>(a, stream_experiment, n, d, wishart, need_direct, scalings, scales, t0, std::min(e, t0 + kChunk),
                   flat.data() + t0 * width, *scratch[th]);
  });
  return flat;
}

// Rows for one (n, d) and the given scalings: every scaling on the same Q, K per trial.
// `stream_experiment` separates saturation's and length's random numbers.
std::vector<Row> run_rows(const Args& a, std::uint32_t stream_experiment, std::int64_t n, std::int64_t d,
                          const std::vector<std::string>& scalings, const std::vector<double>& scales,
                          const std::vector<std::string>& prefix_params) {
  const std::string sampler = sampler_named(a.get("sampler"));
  // auto: the cheaper exact sampler, O(N²d) direct or O(N³) Wishart.
  const bool wishart = (sampler == "wishart" && d >= n) || (sampler == "auto" && d > n);
  bool need_direct = !wishart;
  for (const auto& r : scalings) need_direct |= r == "qk-norm";
  const std::size_t ns = scalings.size(), width = ns * kRowMetrics;
  const auto flat = a.get("dtype") == "f64"
                        ? run_trials<double>(a, stream_experiment, n, d, wishart, need_direct, scalings, scales)
                        : run_trials<float>(a, stream_experiment, n, d, wishart, need_direct, scalings, scales);
  std::vector<std::vector<double>> cols(width, std::vector<double>(a.trials));
  for (std::int64_t t = 0; t < a.trials; ++t)
    for (std::size_t c = 0; c < width; ++c) cols[c][t] = flat[t * width + c];
  std::vector<Row> rows;
  for (std::size_t c = 0; c < ns; ++c) {
    double th[kRowMetrics];
    // qk-norm: |q̂|² = d, q̂·k̂/√d has variance d/(d−1) (cosine of two random directions in the
    // (d−1)-dimensional space orthogonal to 1); d = 1 gives all-zero logits (σ = 0).
    const double fixed = scalings[c] == "qk-norm" ? (d > 1 ? std::sqrt(d / (d - 1.0)) : 0.0) : -1.0;
    rem_row_theory(n, d, scales[c], fixed, th);
    // qk-norm logits are Gaussian only for large d (a coordinate of a uniform direction in d − 1
    // dimensions has kurtosis 3 − 6/(d + 1)); at d = 4 the bounded logits leave the entropy 0.19
    // nats above the Gaussian REM's. From d = 16 the difference is < 0.07 nats.
    if (scalings[c] == "qk-norm" && d < 16) std::fill(th, th + kRowMetrics, std::numeric_limits<double>::quiet_NaN());
    for (int j = 0; j < kRowMetrics; ++j) {
      auto params = prefix_params;
      params.push_back(scalings[c]);
      std::optional<double> theory;
      if (!std::isnan(th[j])) theory = th[j];
      const Bounds b = row_metric_bounds(j, n);
      rows.push_back(make_row(std::move(params), kRowMetricNames[j], bounded_mean_ci(cols[c * kRowMetrics + j], b.lo, b.hi), theory));
    }
  }
  return rows;
}

void check_common(const Args& a) {
  check_ints_in(a, "n", 2, 8192);
  const std::string s = sampler_named(a.get("sampler"));
  if (s != "auto" && s != "direct" && s != "wishart")
    throw Error("--sampler: expected auto, direct or wishart, got '" + s + "'");
  const auto& t = a.get("dtype");
  if (t != "f32" && t != "f64") throw Error("--dtype: expected f32 or f64, got '" + t + "'");
}

}  // namespace

// Shared with length.cc.
std::vector<Row> attention_rows_point(const Args& a, std::uint32_t stream_experiment, std::int64_t n,
                                      std::int64_t d, const std::vector<std::string>& names,
                                      const std::vector<double>& scales, const std::vector<std::string>& prefix) {
  return run_rows(a, stream_experiment, n, d, names, scales, prefix);
}

Experiment make_saturation() {
  Experiment e;
  e.name = "saturation";
  e.summary = "the Simulation note: top_p_95, entropy, max weight, participation of softmax rows vs d and scaling";
  e.flags = {{"n", "50", "sequence lengths N (keys = queries = N), each 2 to 8192"},
             {"d", "1,2,4,8,16,32,64,128,256,512", "head dimensions, each 1 to 2^20"},
             {"scaling", "none,sqrt,linear,qk-norm,log-n", "scalings: none, sqrt, linear, qk-norm, log-n"},
             {"sampler", "auto",
              "auto (wishart where d > N, else direct: the cheaper exact one), direct (Q, K [N,d] as the Simulation note) "
              "or wishart (exact law of Q K^T for d >= N, O(N^3); points with d < N, where K K^T is singular, drawn "
              "directly, and the result's metadata says so)"},
             {"dtype", "f32", "precision of Q, K and the engine's forward: f32, or f64 (float64 throughout)"}};
  e.default_trials = 100;
  e.param_names = {"n", "d", "scaling"};
  e.points = [](const Args& a) {
    check_common(a);
    check_ints_in(a, "d", 1, 1 << 20);
    check_scalings(a.words("scaling"), kScalings, "scaling");
    // Each point: 4 metrics a scaling and trial; each thread: a chunk of kChunk trials' Q and K
    // [N, d] where they are drawn directly (and their normalised copies for qk-norm), and a few
    // [N, N] arrays, in the --dtype's precision.
    auto pts = n_d_points(a);
    const auto names = a.words("scaling");
    const bool qk_norm = std::find(names.begin(), names.end(), "qk-norm") != names.end();
    const std::string sampler = sampler_named(a.get("sampler"));
    const double bytes = a.get("dtype") == "f64" ? 8 : 4;
    double chunk = 0;
    for (const auto n : a.ints("n"))
      for (const auto d : a.ints("d")) {
        const bool wishart = (sampler == "wishart" && d >= n) || (sampler == "auto" && d > n);
        const double drawn = !wishart || qk_norm ? (qk_norm ? 4.0 : 2.0) * double(n) * double(d) : 0.0;
        chunk = std::max(chunk, kChunk * bytes * (drawn + 4.0 * double(n) * double(n)));
      }
    const std::size_t width = kRowMetrics * names.size();
    check_sweep_memory(a, {"trials", "n", "d", "scaling"},
                       trial_sweep_bytes(a, {.points = pts.size(), .width = width, .thread_bytes = chunk}));
    return pts;
  };
  e.resolve = samplers_used;
  e.run_point = [](const Args& a, const std::vector<std::string>& p) {
    const std::int64_t n = std::stoll(p[0]), d = std::stoll(p[1]);
    const auto names = a.words("scaling");
    std::vector<double> scales;
    for (const auto& r : names) scales.push_back(scaling_factor(r, d, n));
    return run_rows(a, k_saturation, n, d, names, scales, {p[0], p[1]});
  };
  return e;
}

}  // namespace attnscale::lab
