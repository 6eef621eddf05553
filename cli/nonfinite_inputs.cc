#include "nonfinite_inputs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <utility>
#include <vector>

#include "attnscale/error.h"

namespace attnscale::cli {
namespace {

std::string index_str(const Tensor& t, std::int64_t n) {
  std::vector<std::int64_t> index(static_cast<std::size_t>(t.rank()));
  for (int d = t.rank() - 1; d >= 0; --d) {
    index[static_cast<std::size_t>(d)] = n % t.dim(d);
    n /= t.dim(d);
  }
  return fmt::format("[{}]", fmt::join(index, ", "));
}

// The first element of t that is not finite (-inf allowed with minus_inf_ok), or -1.
template <class T>
std::int64_t first_nonfinite(const Tensor& t, bool minus_inf_ok) {
  const T* p = t.as<T>();
  for (std::int64_t n = 0; n < t.numel(); ++n)
    if (!std::isfinite(p[n]) && !(minus_inf_ok && p[n] == -INFINITY)) return n;
  return -1;
}

// (index of the first non-finite element or -1, its name: "nan", "inf" or "-inf").
std::pair<std::int64_t, const char*> find_nonfinite(const Tensor& t, bool minus_inf_ok) {
  std::int64_t n = -1;
  double x = 0;
  if (t.dtype() == DType::f32 && (n = first_nonfinite<float>(t, minus_inf_ok)) >= 0) x = t.as<float>()[n];
  if (t.dtype() == DType::f64 && (n = first_nonfinite<double>(t, minus_inf_ok)) >= 0) x = t.as<double>()[n];
  return {n, std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf"};
}

}  // namespace

void require_finite(const std::string& flag, const std::string& path, const Tensor& t, bool minus_inf_ok,
                    bool can_allow) {
  const auto [n, what] = find_nonfinite(t, minus_inf_ok);
  if (n < 0) return;
  throw Error(fmt::format("{}: {} holds {} at {}; non-finite inputs are refused{}", flag, path, what, index_str(t, n),
                          can_allow ? " (--allow-nonfinite propagates them)" : ""));
}

void require_finite_result(const std::string& flag, const Tensor& out) {
  const auto [n, what] = find_nonfinite(out, false);
  if (n < 0) return;
  throw Error(fmt::format("{}: the result holds {} at {} though every input is finite: float32 overflowed (a score "
                          "s·q·k or a sum of values past 3.4e38); float64 inputs or a smaller --scale compute it "
                          "(--allow-nonfinite writes it as it is)",
                          flag, what, index_str(out, n)));
}

}  // namespace attnscale::cli
