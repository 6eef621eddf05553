// heatmap: the Simulation note's N × N attention matrices for one draw of Q, K [N, d] (trial --trials − 1 ...
// every trial index below --trials gives one matrix; the default is a single one), scaled and
// unscaled, in long form (i, j, p). axis = row is softmax over keys (each row sums to 1, what
// attention computes); axis = column is softmax over queries (each column sums to 1), what Chuang (2023)'s
// wording "apply Softmax on each column of QKᵀ/√d_k" would compute. Both come from attnscale::forward:
// the column form is forward(K, Q) transposed. Per-row top_p_95 rows (j = "all") go with each matrix.
#include <cmath>

#include "lab/attention_rows.h"
#include "lab/registry.h"
#include "lab/rng.h"
#include "lab/sweep_memory.h"

namespace attnscale::lab {

Experiment make_heatmap() {
  Experiment e;
  e.name = "heatmap";
  e.summary = "the Simulation note's N x N probability matrices (i, j, p), scaled vs unscaled, row- or column-normalised";
  e.flags = {{"n", "50", "sequence length N, each 1 to 1024 (N^2 rows a matrix)"},
             {"d", "64", "head dimensions, each 1 to 65536"},
             {"scaling", "none,sqrt", "scalings: none, sqrt, linear, qk-norm, log-n"},
             {"axis", "row,column", "normalise over keys (row) or over queries (column)"}};
  e.default_trials = 1;
  e.param_names = {"n", "d", "trial", "scaling", "axis", "i", "j"};
  e.points = [](const Args& a) {
    check_ints_in(a, "n", 1, 1024);
    check_ints_in(a, "d", 1, 65536);
    check_scalings(a.words("scaling"), {"none", "sqrt", "linear", "qk-norm", "log-n"}, "scaling");
    for (const auto& w : a.words("axis"))
      if (w != "row" && w != "column") throw Error("--axis: expected row or column, got '" + w + "'");
    // A trial is a point (three strings) whose rows are every entry of its N x N matrices, one a
    // scaling and axis, and a top_p_95 row for each of their query rows; a thread holds its Q and K,
    // their normalised copies and the probabilities, in float64.
    const double scalings = static_cast<double>(a.words("scaling").size()), axes = static_cast<double>(a.words("axis").size());
    double rows = 0;
    for (auto n : a.ints("n")) rows += scalings * (axes * double(n) * double(n) + double(n));
    const double points = double(a.trials) * double(a.ints("n").size()) * double(a.ints("d").size());
    const double n_max = largest(a, "n"), d_max = largest(a, "d");
    check_sweep_memory(a, {"trials", "n", "d", "scaling", "axis"},
                       rows * double(a.trials) * double(a.ints("d").size()) * kRowBytes + points * 128 +
                           a.threads * 8 * (4 * n_max * d_max + n_max * n_max));
    std::vector<std::vector<std::string>> pts;
    for (auto n : a.ints("n"))
      for (auto d : a.ints("d"))
        for (std::int64_t t = 0; t < a.trials; ++t) pts.push_back({std::to_string(n), std::to_string(d), std::to_string(t)});
    return pts;
  };
  e.run_point = [](const Args& a, const std::vector<std::string>& p) {
    const std::int64_t n = std::stoll(p[0]), d = std::stoll(p[1]);
    const Stream s(a.seed, stream_id(k_heatmap, {n, d}), static_cast<std::uint32_t>(std::stoll(p[2])));
    std::vector<double> q, k, probs, scratch, m(kRowMetrics);
    sample_qk_direct(s, n, d, q, k);
    std::vector<Row> rows;
    for (const auto& rule : a.words("scaling")) {
      std::vector<double> qs = q, ks = k;
      if (rule == "qk-norm") {
        layer_norm_rows(qs, n, d);
        layer_norm_rows(ks, n, d);
      }
      const double scale = scaling_factor(rule, d, n);
      for (const auto& axis : a.words("axis")) {
        // Column form: softmax over queries for each key = forward with the roles of Q and K swapped.
        if (axis == "row") attention_probs(qs, ks, n, d, scale, probs);
        else attention_probs(ks, qs, n, d, scale, probs);
        for (std::int64_t i = 0; i < n; ++i) {
          for (std::int64_t j = 0; j < n; ++j) {
            const double v = axis == "row" ? probs[i * n + j] : probs[j * n + i];
            rows.push_back(Row{{p[0], p[1], p[2], rule, axis, std::to_string(i), std::to_string(j)}, "p", v, v, v, {}});
          }
          if (axis == "row") {
            row_metrics(probs.data() + i * n, n, m.data(), scratch);
            rows.push_back(Row{{p[0], p[1], p[2], rule, axis, std::to_string(i), "all"}, "top_p_95", m[0], m[0], m[0], {}});
          }
        }
      }
    }
    return rows;
  };
  return e;
}

}  // namespace attnscale::lab
