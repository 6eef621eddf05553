// merge_partials(): the LSE merge of attention over disjoint key chunks (see decode.h).
//
// The merge itself is lse_merge.h's, in base e with each (out_c, lse_c) as the chunk
// (lse_c, 1, out_c): lse = M + log Σ_c exp(lse_c − M), out = Σ_c exp(lse_c − M) · out_c / Σ_c exp(lse_c − M).
// Accumulated in float64; chunks are visited in order, so the result is deterministic.
#include <cmath>
#include <string>
#include <vector>

#include "attention/lse_merge.h"
#include "attention/params.h"
#include "attnscale/decode.h"
#include "attnscale/error.h"

namespace attnscale {
namespace {

void check(const TensorView& t, const TensorView& like, const std::string& name, const std::string& like_name) {
  if (t.data == nullptr) throw Error(name + ": missing (null data pointer)");
  if (t.dtype != DType::f32 && t.dtype != DType::f64)
    throw Error(name + ": dtype must be float32 or float64, got " + std::string(dtype_name(t.dtype)));
  bool same = t.rank == like.rank;
  for (int d = 0; same && d < t.rank; ++d) same = t.shape[d] == like.shape[d];
  if (!same) throw Error(name + ": shape " + t.shape_str() + " must equal " + like_name + "'s " + like.shape_str());
}

// Offset in elements of flat index n (C order) of view t.
std::int64_t offset(const TensorView& t, std::int64_t n) {
  std::int64_t off = 0;
  for (int d = t.rank - 1; d >= 0; --d) {
    off += (n % t.shape[d]) * t.strides[d];
    n /= t.shape[d];
  }
  return off;
}
double get(const TensorView& t, std::int64_t off) {
  return t.dtype == DType::f32 ? static_cast<const float*>(t.data)[off] : static_cast<const double*>(t.data)[off];
}
void put(const TensorView& t, std::int64_t off, double x) {
  if (t.dtype == DType::f32) static_cast<float*>(t.data)[off] = static_cast<float>(x);
  else static_cast<double*>(t.data)[off] = x;
}

}  // namespace

void merge_partials(const std::vector<TensorView>& outs, const std::vector<TensorView>& lses,
                    const TensorView& out, const TensorView& lse) {
  if (outs.empty()) throw Error("outs: at least one partial result is needed");
  if (lses.size() != outs.size())
    throw Error("lses: " + std::to_string(lses.size()) + " partial LSEs for " + std::to_string(outs.size()) +
                " partial outputs");
  check(out, out, "out", "out");
  if (out.rank < 1) throw Error("out: expected rank 1..4, got rank 0");
  check(lse, lse, "lse", "lse");
  bool lse_ok = lse.rank == out.rank - 1;
  for (int d = 0; lse_ok && d < lse.rank; ++d) lse_ok = lse.shape[d] == out.shape[d];
  if (!lse_ok) throw Error("lse: shape " + lse.shape_str() + " must be out's " + out.shape_str() + " without its last dimension");
  for (std::size_t c = 0; c < outs.size(); ++c) {
    check(outs[c], out, "outs[" + std::to_string(c) + "]", "out");
    check(lses[c], lse, "lses[" + std::to_string(c) + "]", "lse");
  }
  const std::int64_t dv = out.shape[out.rank - 1], rows = out.numel() / dv;
  const std::int64_t C = static_cast<std::int64_t>(outs.size());
  // Per row: each chunk's lse and where its output row starts (its elements are one last stride
  // apart). A normalised pair is the chunk (lse_k, 1, out_k) of the merge in base e; a chunk with
  // lse_k = -inf showed the row no key.
  std::vector<double> lse_k(C), o(dv);
  std::vector<std::int64_t> base(C);
  for (std::int64_t r = 0; r < rows; ++r) {
    bool nan = false;
    for (std::int64_t k = 0; k < C; ++k) {
      lse_k[k] = get(lses[k], offset(lses[k], r));
      base[k] = offset(outs[k], r * dv);
      nan |= std::isnan(lse_k[k]);
    }
    double M, l;
    detail::merge_row<double>(
        C, dv, [](double x) { return std::exp(x); }, [&](std::int64_t k) { return lse_k[k]; },
        [&](std::int64_t k) { return lse_k[k] == -INFINITY ? 0.0 : 1.0; },
        [&](std::int64_t k, std::int64_t c) { return get(outs[k], base[k] + c * outs[k].strides[outs[k].rank - 1]); },
        M, l, o.data());
    put(lse, offset(lse, r), nan ? NAN : M == -INFINITY ? -INFINITY : M + std::log(l));
    const std::int64_t out_base = offset(out, r * dv), out_step = out.strides[out.rank - 1];
    for (std::int64_t c = 0; c < dv; ++c) put(out, out_base + c * out_step, M == -INFINITY ? 0.0 : nan ? NAN : o[c] / l);
  }
}

}  // namespace attnscale
