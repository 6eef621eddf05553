// attnscale explain: softmax(Q K^T * s) V on a small input, one step at a time.
//
// The default input is random, N = 4 tokens of d_k = 8 (N(0, 1) entries, seed 0): large enough that
// the scale visibly changes the softmax, which the last step shows by comparing it with s = 1.
// --notes-example gives the Study notes' example instead: Q = K = V, a 3×1 column (v = 1, 2, 3),
// where d_k = 1 and the scale is 1 whatever the rule.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "input_files.h"
#include "lab/rng.h"
#include "library_names.h"
#include "mask_options.h"
#include "nonfinite_inputs.h"
#include "subcommands.h"

namespace attnscale::cli {
namespace {

constexpr std::int64_t kMaxSide = 16;  // explain prints every matrix, so keep them small
constexpr std::int64_t kDefaultN = 4, kDefaultD = 8;

struct ExplainFlags {
  std::string q, k, v;
  std::int64_t n = 0, d = 0;
  std::uint64_t seed = 0;
  bool seed_given = false;  // --seed on the command line (0 included)
  bool notes_example = false;
  MaskFlags mask;
};

// A row-major float64 matrix with a name, for printing.
struct Matrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> a;
  double& operator()(std::int64_t i, std::int64_t j) { return a[i * cols + j]; }
  double operator()(std::int64_t i, std::int64_t j) const { return a[i * cols + j]; }
};

Matrix load_matrix(const std::string& flag, const std::string& path) {
  const Tensor t = read_input(flag, path, InputDtypes::floats);
  if (t.rank() != 2)
    throw Error(fmt::format("{}: explain takes a 2-D float array [N, d], got {} {}", flag, t.view().shape_str(),
                            dtype_name(t.dtype())));
  if (t.dim(0) > kMaxSide || t.dim(1) > kMaxSide)
    throw Error(fmt::format("{}: explain prints every matrix; use at most {} rows and columns, got {}", flag,
                            kMaxSide, t.view().shape_str()));
  require_finite(flag, path, t, /*minus_inf_ok=*/false, /*can_allow=*/false);
  Matrix m{t.dim(0), t.dim(1), std::vector<double>(t.numel())};
  for (std::int64_t i = 0; i < t.numel(); ++i)
    m.a[i] = t.dtype() == DType::f32 ? t.as<float>()[i] : t.as<double>()[i];
  return m;
}

Matrix random_matrix(std::int64_t n, std::int64_t d, std::uint64_t seed, std::uint32_t stream) {
  const lab::Stream rng(seed, stream, 0);
  Matrix m{n, d, std::vector<double>(n * d)};
  for (std::int64_t i = 0; i < n * d; ++i) m.a[i] = rng.normal(i);
  return m;
}

// x with four decimals while it fits a 10-wide column (|x| < 1e5), else in exponent form, where
// %.4f would print every digit of, say, an unscaled score of 1e300.
std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, std::fabs(x) < 1e5 || !std::isfinite(x) ? "%.4f" : "%.3e", x);
  return text;
}

void print(const char* title, const Matrix& m) {
  std::printf("%s  [%lld x %lld]\n", title, static_cast<long long>(m.rows), static_cast<long long>(m.cols));
  for (std::int64_t i = 0; i < m.rows; ++i) {
    std::printf("   ");
    for (std::int64_t j = 0; j < m.cols; ++j) {
      const double x = m(i, j);
      std::printf(" %10s", std::isinf(x) ? (x < 0 ? "-inf" : "inf") : number(x).c_str());
    }
    std::printf("\n");
  }
  std::printf("\n");
}

TensorView view_of(Matrix& m) { return TensorView::contiguous(m.a.data(), DType::f64, {m.rows, m.cols}); }

// "s = 1/√d_k = 1/√8 = 0.3536" for the default rule; the other rules and values likewise.
std::string scale_text(const Scale& scale, std::int64_t dk, double s) {
  const std::string rule = scale.describe();
  if (rule.rfind("sqrt", 0) == 0) return fmt::format("s = 1/√d_k = 1/√{} = {:.4g}", dk, s);
  if (rule.rfind("linear", 0) == 0) return fmt::format("s = 1/d_k = 1/{} = {:.4g}", dk, s);
  if (rule.rfind("none", 0) == 0) return "s = 1 (no scale)";
  return fmt::format("s = {:.6g} (given; 1/√d_k would be {:.4g})", s, 1 / std::sqrt(static_cast<double>(dk)));
}

// What a mask does to each score of an [nq, nkv] problem (batch and head 1, as explain's inputs
// are): hidden (-inf) or a value added, row-major.
struct MaskTerms {
  std::vector<char> hidden;
  std::vector<double> added;
  bool hides_any = false, adds_any = false;
};

MaskTerms mask_terms(const Mask& mask, std::int64_t nq, std::int64_t nkv) {
  MaskTerms t{std::vector<char>(nq * nkv, 0), std::vector<double>(nq * nkv, 0.0)};
  const TensorView& m = mask.explicit_mask;  // validated by forward(): nq * nkv elements in C order
  for (std::int64_t i = 0; i < nq; ++i) {
    const std::int64_t diag = i + (mask.align == Align::bottom_right ? nkv - nq : 0);
    for (std::int64_t j = 0; j < nkv; ++j) {
      const std::int64_t e = i * nkv + j;
      bool hide = (mask.causal && j > diag) || (mask.window_left >= 0 && j < diag - mask.window_left) ||
                  (mask.window_right >= 0 && j > diag + mask.window_right);
      if (m.dtype == DType::u8 && !m.empty()) hide = hide || static_cast<const std::uint8_t*>(m.data)[e] == 0;
      if ((m.dtype == DType::f32 || m.dtype == DType::f64) && !m.empty()) {
        const double a = m.dtype == DType::f32 ? static_cast<const float*>(m.data)[e] : static_cast<const double*>(m.data)[e];
        hide = hide || a == -INFINITY;
        t.added[e] = hide ? 0.0 : a;
        t.adds_any = t.adds_any || t.added[e] != 0.0;
      }
      t.hidden[e] = hide;
      t.hides_any = t.hides_any || hide;
    }
  }
  return t;
}

void run(ExplainFlags& f) {
  Tensor mask_storage;
  const Options options = f.mask.options(mask_storage);
  if (!mask_storage.empty()) require_finite("--mask", f.mask.mask_path, mask_storage, true, false);
  Matrix Q, K, V;
  std::string origin;
  if (!f.q.empty() || !f.k.empty() || !f.v.empty()) {
    if (f.q.empty() || f.k.empty() || f.v.empty()) throw Error("--q, --k, --v: give all three files or none");
    // The files are the input: a flag for another input would be ignored, so it is refused.
    if (f.notes_example) throw Error("--notes-example: an input of its own; drop it or --q, --k, --v");
    if (f.n > 0 || f.d > 0 || f.seed_given)
      throw Error("--n, --d, --seed: describe the random input; --q, --k, --v give the input and its size");
    Q = load_matrix("--q", f.q);
    K = load_matrix("--k", f.k);
    V = load_matrix("--v", f.v);
    origin = fmt::format("from {}, {}, {}", f.q, f.k, f.v);
  } else if (f.notes_example) {
    if (f.n > 0 || f.d > 0 || f.seed_given)
      throw Error("--notes-example: the example has its own size and values; drop --n, --d and --seed");
    Q = Matrix{3, 1, {1.0, 2.0, 3.0}};
    K = Q;
    V = Q;
    origin = "the Study notes' example: Q = K = V = (v1, v2, v3) = (1, 2, 3), a 3 x 1 column";
  } else {
    const std::int64_t n = f.n > 0 ? f.n : kDefaultN, d = f.d > 0 ? f.d : kDefaultD;  // given: 1..kMaxSide
    Q = random_matrix(n, d, f.seed, 0);
    K = random_matrix(n, d, f.seed, 1);
    V = random_matrix(n, d, f.seed, 2);
    origin = fmt::format("random N(0, 1) entries, N = {}, d_k = {}, seed {}", n, d, f.seed);
  }
  if (K.cols != Q.cols) throw Error(fmt::format("--k: dk = {} differs from --q's {}", K.cols, Q.cols));
  if (V.rows != K.rows) throw Error(fmt::format("--v: {} rows differ from --k's {}", V.rows, K.rows));

  // The library computes P, O and lse; the steps below recompute each stage in plain loops.
  Matrix O{Q.rows, V.cols, std::vector<double>(Q.rows * V.cols)};
  Matrix P{Q.rows, K.rows, std::vector<double>(Q.rows * K.rows)};
  std::vector<double> lse(Q.rows);
  Outputs outs{view_of(O), TensorView::contiguous(lse.data(), DType::f64, {Q.rows}), view_of(P)};
  naming_flags([&] { reference::forward(view_of(Q), view_of(K), view_of(V), outs, options); });

  const std::int64_t dk = Q.cols;
  const double s = options.scale.resolve(dk);
  std::printf("Scaled dot-product attention, step by step: softmax(Q K^T * s + mask) V\n");
  std::printf("Input: %s\n\n", origin.c_str());
  print("Q (one query per row)", Q);
  print("K (one key per row)", K);
  print("V (one value per row)", V);

  Matrix S{Q.rows, K.rows, std::vector<double>(Q.rows * K.rows)};
  for (std::int64_t i = 0; i < Q.rows; ++i)
    for (std::int64_t j = 0; j < K.rows; ++j)
      for (std::int64_t c = 0; c < dk; ++c) S(i, j) += Q(i, c) * K(j, c);
  std::printf("Step 1. Scores Q K^T: entry (i, j) is the dot product of query i with key j.\n");
  print("Q K^T", S);

  std::printf("Step 2. Scale by %s.\n", scale_text(options.scale, dk, s).c_str());
  std::printf("   Why: with independent unit-variance components, Var(q·k) = d_k, so s = 1/√d_k\n"
              "   keeps the scores at unit variance whatever d_k is.\n");
  for (double& x : S.a) x *= s;
  // The mask's term of each score, from Mask's definitions (attention.h): causal hides j > diag(i),
  // the window j < diag(i) - left and j > diag(i) + right, a boolean mask its zeros; an additive
  // mask adds its values. Computed from the flags rather than recovered as lse + log P, which is
  // -inf for a visible key whose weight underflows (a score 745 below its row's largest).
  const MaskTerms terms = mask_terms(options.mask, Q.rows, K.rows);
  for (std::size_t e = 0; e < S.a.size(); ++e) S.a[e] = terms.hidden[e] ? -INFINITY : S.a[e] + terms.added[e];
  if (terms.hides_any)
    std::printf("   The mask hides some keys: their scores become -inf%s.\n",
                terms.adds_any ? " (the additive mask's values are added to the others)" : "");
  else if (terms.adds_any)
    std::printf("   The additive mask's values are added to the scores.\n");
  else if (options.mask.causal || options.mask.has_window() || !options.mask.explicit_mask.empty())
    std::printf("   The mask hides no key here.\n");
  print("S = Q K^T * s", S);

  std::printf("Step 3. Softmax of each row, over the keys: P_ij = exp(S_ij - m_i) / l_i, with the row\n"
              "   maximum m_i subtracted first (so no exponent overflows) and l_i = sum_j exp(S_ij - m_i).\n");
  for (std::int64_t i = 0; i < S.rows; ++i) {
    if (std::isinf(lse[i]) && lse[i] < 0) {
      std::printf("   row %lld: every key is masked -> P row = 0, output row = 0, lse = -inf\n",
                  static_cast<long long>(i));
      continue;
    }
    double m = -INFINITY, l = 0;
    for (std::int64_t j = 0; j < S.cols; ++j) m = std::max(m, S(i, j));
    for (std::int64_t j = 0; j < S.cols; ++j) l += std::exp(S(i, j) - m);
    std::printf("   row %lld: m = %s, l = %s, log-sum-exp = m + log l = %s\n", static_cast<long long>(i),
                number(m).c_str(), number(l).c_str(), number(lse[i]).c_str());
  }
  std::printf("\n");
  const bool row_fully_masked = std::any_of(lse.begin(), lse.end(), [](double x) { return x == -INFINITY; });
  print(row_fully_masked ? "P = softmax(S) (each row sums to 1, a fully masked row to 0)"
                         : "P = softmax(S) (each row sums to 1)",
        P);

  std::printf("Step 4. Output O = P V: each output row is a weighted average of the value rows.\n");
  print("O", O);
  Matrix check{O.rows, O.cols, std::vector<double>(O.rows * O.cols)};
  double diff = 0;
  for (std::int64_t i = 0; i < O.rows; ++i)
    for (std::int64_t c = 0; c < O.cols; ++c) {
      for (std::int64_t j = 0; j < P.cols; ++j) check(i, c) += P(i, j) * V(j, c);
      diff = std::max(diff, std::abs(check(i, c) - O(i, c)));
    }
  std::printf("Check: P V recomputed here differs from the library's O by at most %.3g.\n", diff);

  if (s != 1) {
    // The same rows with s = 1: what the scale changed.
    Options unscaled = options;
    unscaled.scale = Scale::rule(ScaleRule::none);
    Matrix O1{Q.rows, V.cols, std::vector<double>(Q.rows * V.cols)}, P1{Q.rows, K.rows, std::vector<double>(Q.rows * K.rows)};
    Outputs outs1{view_of(O1), TensorView(), view_of(P1)};
    reference::forward(view_of(Q), view_of(K), view_of(V), outs1, unscaled);
    std::printf("\nWhat the scale does here: the same softmax with s = 1 instead of %.4g.\n", s);
    print("P with s = 1", P1);
    std::printf("   largest weight of each row, with s = %.4g and with s = 1:\n", s);
    int sharper = 0, flatter = 0;  // rows whose largest weight (as printed) rises / falls at s = 1
    for (std::int64_t i = 0; i < P.rows; ++i) {
      double a = 0, b = 0;
      for (std::int64_t j = 0; j < P.cols; ++j) a = std::max(a, P(i, j)), b = std::max(b, P1(i, j));
      std::printf("   row %lld: %.4f  vs  %.4f\n", static_cast<long long>(i), a, b);
      sharper += b - a >= 5e-5;
      flatter += a - b >= 5e-5;
    }
    // What the rows above show, not what the usual s < 1 would: s > 1 sharpens the rows itself, a
    // negative s reverses the order of the scores, and a row that sees one key keeps it whatever s.
    // "each row's weight" only when every row changed; otherwise how many did.
    const auto rows_whose = [&](int changed) {
      return changed == P.rows ? std::string("each row's weight")
                               : fmt::format("the weight of {} of the {} rows", changed, P.rows);
    };
    const std::int64_t kept = P.rows - sharper - flatter;
    const std::string others_keep = kept == 0   ? ""
                                    : kept == 1 ? " (the other row keeps its own, to the digits printed)"
                                                : " (the other rows keep theirs, to the digits printed)";
    if (sharper > 0 && flatter == 0)
      std::printf("   Without the scale the scores' spread grows like √d_k, and %s crowds onto\n"
                  "   fewer keys%s.\n",
                  rows_whose(sharper).c_str(), others_keep.c_str());
    else if (flatter > 0 && sharper == 0)
      std::printf("   This s enlarges the scores: without it %s spreads over more keys%s.\n",
                  rows_whose(flatter).c_str(), others_keep.c_str());
    else if (sharper > 0)
      std::printf("   Without the scale the largest weight rises in %d rows and falls in %d: s = %.4g does not\n"
                  "   just shrink the scores.\n",
                  sharper, flatter, s);
    else
      std::printf("   No row's largest weight changes here, to the digits printed: a row that sees a single key,\n"
                  "   or whose visible scores are all equal, has the same weights whatever the scale, and a row\n"
                  "   already on one key stays there.\n");
  }
}

}  // namespace

void add_explain(CLI::App& app) {
  auto flags = std::make_shared<ExplainFlags>();
  CLI::App* sub = app.add_subcommand(
      "explain",
      "Print, step by step, what softmax(Q K^T * s) V does to a small input: Q K^T, the scaled\n"
      "scores, the softmax rows and the output, then the same rows without the scale. Default input:\n"
      "random, N = 4, d_k = 8. Examples: attnscale explain --notes-example (Q = K = V = (1, 2, 3)^T);\n"
      "attnscale explain --n 4 --d 2 --seed 7 --scale none");
  sub->add_option("--q", flags->q, "Queries .npy [N, d] (with --k and --v)")->type_name("FILE");
  sub->add_option("--k", flags->k, "Keys .npy [N, d]")->type_name("FILE");
  sub->add_option("--v", flags->v, "Values .npy [N, d]")->type_name("FILE");
  sub->add_option("--n", flags->n, "Random input: tokens (1..16, default 4)")->check(integer_in<std::int64_t>(1, kMaxSide));
  sub->add_option("--d", flags->d, "Random input: dimension d_k (1..16, default 8)")
      ->check(integer_in<std::int64_t>(1, kMaxSide));
  sub->add_flag("--notes-example", flags->notes_example,
                "the Study notes' 3 x 1 example, Q = K = V = (1, 2, 3)^T, instead of random input");
  CLI::Option* seed = sub->add_option("--seed", flags->seed, "Random input: seed, 0 to 2^64-1")->capture_default_str()->check(seed_range());
  flags->mask.add_to(*sub);
  sub->callback([flags, seed] {
    flags->seed_given = seed->count() > 0;
    run(*flags);
  });
}

}  // namespace attnscale::cli
