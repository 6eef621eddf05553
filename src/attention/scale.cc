// Scale: the factor s in softmax(Q Kᵀ · s).
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

#include "attnscale/attention.h"
#include "attnscale/error.h"

namespace attnscale {

Scale Scale::rule(ScaleRule r) {
  Scale s;
  s.rule_ = r;
  return s;
}

Scale Scale::value(double v) {
  if (!std::isfinite(v)) {
    std::ostringstream m;
    m << "scale: must be finite, got " << v;
    throw Error(m.str());
  }
  Scale s;
  s.is_rule_ = false;
  s.value_ = v;
  return s;
}

Scale Scale::parse(std::string_view text) {
  // Spaces around the text are ignored, on either side alike (strtod alone skips leading ones).
  const std::size_t first = text.find_first_not_of(" \t\n");
  text = first == std::string_view::npos ? std::string_view() : text.substr(first);
  text = text.substr(0, text.find_last_not_of(" \t\n") + 1);
  if (text == "none") return rule(ScaleRule::none);
  if (text == "sqrt") return rule(ScaleRule::sqrt);
  if (text == "linear") return rule(ScaleRule::linear);
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  // ERANGE also flags a subnormal result, which is finite and kept; an overflow (±inf) is not, and
  // a nonzero number that rounds to 0 is refused rather than taken as s = 0.
  if (s.empty() || end != s.c_str() + s.size() || (errno == ERANGE && std::isinf(v)))
    throw Error("scale: expected none, sqrt, linear or a finite number, got '" + s + "'");
  if (errno == ERANGE && v == 0) throw Error("scale: '" + s + "' is too small (it rounds to 0)");
  return value(v);
}

double Scale::resolve(std::int64_t dk) const {
  if (!is_rule_) return value_;
  switch (rule_) {
    case ScaleRule::none: return 1.0;
    case ScaleRule::sqrt: return 1.0 / std::sqrt(static_cast<double>(dk));
    case ScaleRule::linear: return 1.0 / static_cast<double>(dk);
  }
  return 1.0;
}

std::string Scale::describe() const {
  if (is_rule_) {
    switch (rule_) {
      case ScaleRule::none: return "none (1)";
      case ScaleRule::sqrt: return "sqrt (1/sqrt(dk))";
      case ScaleRule::linear: return "linear (1/dk)";
    }
  }
  std::ostringstream m;
  m << value_;
  return m.str();
}

}  // namespace attnscale
