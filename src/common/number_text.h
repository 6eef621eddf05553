#pragma once
// A double in an error message as a reader wrote it: up to 9 significant digits, exponent form
// for small and large magnitudes (1e-09, 2.5, 1e+300, nan, inf). std::to_string's fixed "%f"
// printed -2 as "-2.000000" and -1e-9 as "-0.000000", a value that looks allowed.
#include <cstdio>
#include <string>

namespace attnscale::detail {

inline std::string number_text(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", x);
  return text;
}

}  // namespace attnscale::detail
