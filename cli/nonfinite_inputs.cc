#include "nonfinite_inputs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
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

template <class T>
void scan(const std::string& flag, const std::string& path, const Tensor& t, bool minus_inf_ok, bool can_allow) {
  const T* p = t.as<T>();
  for (std::int64_t n = 0; n < t.numel(); ++n) {
    if (std::isfinite(p[n]) || (minus_inf_ok && p[n] == -INFINITY)) continue;
    const char* what = std::isnan(p[n]) ? "nan" : p[n] > 0 ? "inf" : "-inf";
    throw Error(fmt::format("{}: {} holds {} at {}; non-finite inputs are refused{}", flag, path, what,
                            index_str(t, n), can_allow ? " (--allow-nonfinite propagates them)" : ""));
  }
}

}  // namespace

void require_finite(const std::string& flag, const std::string& path, const Tensor& t, bool minus_inf_ok,
                    bool can_allow) {
  if (t.dtype() == DType::f32) scan<float>(flag, path, t, minus_inf_ok, can_allow);
  if (t.dtype() == DType::f64) scan<double>(flag, path, t, minus_inf_ok, can_allow);
}

}  // namespace attnscale::cli
