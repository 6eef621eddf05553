#include "lab/rng.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "attnscale/error.h"

namespace attnscale::lab {
namespace {
constexpr std::uint64_t kAttempt = std::uint64_t{1} << 48;
}

// Marsaglia & Tsang (2000): for shape a >= 1, with c = a - 1/3, draw x ~ N(0,1), v = (1 + x/(3 sqrt c))^3,
// accept c v when log u < x^2/2 + c - c v + c log v. Acceptance > 95%, so 30 attempts (blocks index + 2a·2^48 for x,
// index + (2a+1)·2^48 for u) never run out
// in practice; the last one returns the mode rather than loop forever.
double Stream::gamma(std::uint64_t index, double shape) const {
  if (shape < 1) {
    // Gamma(a) = Gamma(a + 1) U^(1/a).
    const double u = uniform(index + 62 * kAttempt);
    return gamma(index, shape + 1) * std::pow(u, 1 / shape);
  }
  const double c = shape - 1.0 / 3, k = 1 / std::sqrt(9 * c);
  for (std::uint64_t a = 0; a < 30; ++a) {
    const double x = normal(index + 2 * a * kAttempt);
    double v = 1 + k * x;
    if (v <= 0) continue;
    v = v * v * v;
    const double u = uniform(index + (2 * a + 1) * kAttempt);
    if (std::log(u) < 0.5 * x * x + c - c * v + c * std::log(v)) return c * v;
  }
  return c;
}

Dist Dist::parse(const std::string& name) {
  Dist d;
  if (name == "normal") d.kind = DistKind::normal;
  else if (name == "uniform") d.kind = DistKind::uniform;
  else if (name == "rademacher") d.kind = DistKind::rademacher;
  else if (name == "laplace") d.kind = DistKind::laplace;
  else if (name.size() > 1 && name[0] == 't') {
    char* end = nullptr;
    d.nu = std::strtod(name.c_str() + 1, &end);
    if (*end != '\0' || !(d.nu > 2) || !std::isfinite(d.nu))
      throw Error("distribution '" + name + "': Student-t needs nu > 2 (e.g. t5)");
    d.kind = DistKind::student_t;
  } else {
    throw Error("unknown distribution '" + name + "' (expected normal, uniform, rademacher, laplace, tNU)");
  }
  return d;
}

std::string Dist::name() const {
  switch (kind) {
    case DistKind::normal: return "normal";
    case DistKind::uniform: return "uniform";
    case DistKind::rademacher: return "rademacher";
    case DistKind::laplace: return "laplace";
    case DistKind::student_t: {
      // The fewest digits that read back as this nu (t5, t10, t2.1, t5.0000001): "%g"'s six digits
      // named t5.0000001 "t5", so its rows and its reproduce command said another distribution.
      // Exponent form only where positional digits cannot say it (t1e+300): one digit of "%g" reads
      // 10 back as "1e+01", which parses but is no way to write t10.
      char buf[40];
      for (int digits = 1; digits <= 17; ++digits) {
        std::snprintf(buf, sizeof buf, "t%.*g", digits, nu);
        if (std::strtod(buf + 1, nullptr) == nu && (std::strchr(buf, 'e') == nullptr || nu >= 1e17)) break;
      }
      return buf;
    }
  }
  return "?";
}

// Standardised kurtosis: normal 3; uniform 9/5; Rademacher 1; Laplace 6;
// Student-t 3 + 6/(nu - 4) for nu > 4 (infinite otherwise).
double Dist::kurtosis() const {
  switch (kind) {
    case DistKind::normal: return 3;
    case DistKind::uniform: return 1.8;
    case DistKind::rademacher: return 1;
    case DistKind::laplace: return 6;
    case DistKind::student_t: return nu > 4 ? 3 + 6 / (nu - 4) : std::numeric_limits<double>::infinity();
  }
  return 0;
}

double draw(const Dist& dist, const Stream& s, std::uint64_t index) {
  switch (dist.kind) {
    case DistKind::normal: return s.normal(index);
    case DistKind::uniform: return std::sqrt(3.0) * (2 * s.uniform(index) - 1);  // U(-√3, √3)
    case DistKind::rademacher: return (s.block(index)[0] & 1) ? 1.0 : -1.0;
    case DistKind::laplace: {
      // Laplace(0, b) with b = 1/√2 has variance 2b² = 1: x = -b sign(u) log(1 - 2|u|), u ∈ (-1/2, 1/2].
      const double u = s.uniform(index) - 0.5;
      const double b = 1 / std::sqrt(2.0);
      return (u < 0 ? b : -b) * std::log1p(-2 * std::abs(u));
    }
    case DistKind::student_t: {
      // t = z / sqrt(g / nu) with g ~ chi²(nu) = 2 Gamma(nu/2); Var t = nu/(nu-2), so rescale.
      const auto r = s.block(index);
      const std::uint64_t u0 = (static_cast<std::uint64_t>(r[0]) << 32) | r[1];
      const std::uint64_t u1 = (static_cast<std::uint64_t>(r[2]) << 32) | r[3];
      const double z = r123::boxmuller(u0, u1).x;
      const double g = 2 * s.gamma(index + 64 * kAttempt, dist.nu / 2);
      return z / std::sqrt(g / dist.nu) * std::sqrt((dist.nu - 2) / dist.nu);
    }
  }
  return 0;
}

std::uint32_t stream_id(std::uint32_t experiment, std::initializer_list<std::int64_t> params) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::int64_t p : params)
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<std::uint64_t>(p) >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  return (experiment << 24) | static_cast<std::uint32_t>((h ^ (h >> 24) ^ (h >> 48)) & 0xffffff);
}

}  // namespace attnscale::lab
