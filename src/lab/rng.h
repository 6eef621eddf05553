// Counter-based random streams (Random123's Philox4x32-10) and the lab's component distributions.
//
// Every number is a pure function of (seed, stream, trial, index): the key holds the seed, the
// counter holds (stream, trial, index). No state is carried from one draw to the next, so a
// result does not depend on how work is split across threads or in what order it runs.
// Rejection samplers (Student-t, gamma) use the top 16 bits of the 64-bit index as the attempt
// number, so plain indices must stay below 2^48.
#pragma once
#include <Random123/boxmuller.hpp>
#include <Random123/philox.h>
#include <Random123/uniform.hpp>

#include <cmath>
#include <cstdint>
#include <string>

namespace attnscale::lab {

class Stream {
 public:
  Stream(std::uint64_t seed, std::uint32_t stream, std::uint32_t trial)
      : key_{{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}},
        stream_(stream),
        trial_(trial) {}

  // Four independent 32-bit words for `index`.
  r123::Philox4x32::ctr_type block(std::uint64_t index) const {
    r123::Philox4x32::ctr_type ctr = {
        {static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), trial_, stream_}};
    return r123::Philox4x32()(ctr, key_);
  }

  // Uniform on (0, 1]: 53-bit resolution, never exactly 0.
  double uniform(std::uint64_t index) const {
    const auto r = block(index);
    const std::uint64_t u = (static_cast<std::uint64_t>(r[0]) << 32) | r[1];
    return r123::u01<double>(u);
  }

  // Standard normal via Box-Muller on two 64-bit uniforms.
  double normal(std::uint64_t index) const {
    const auto r = block(index);
    const std::uint64_t u0 = (static_cast<std::uint64_t>(r[0]) << 32) | r[1];
    const std::uint64_t u1 = (static_cast<std::uint64_t>(r[2]) << 32) | r[3];
    return r123::boxmuller(u0, u1).x;
  }

  // Two independent standard normals from one block (both Box-Muller outputs): the fast path for
  // filling large Gaussian matrices. Element 2i and 2i+1 of fill_normal come from block(i).
  void normal_pair(std::uint64_t index, double& a, double& b) const {
    const auto r = block(index);
    const std::uint64_t u0 = (static_cast<std::uint64_t>(r[0]) << 32) | r[1];
    const std::uint64_t u1 = (static_cast<std::uint64_t>(r[2]) << 32) | r[3];
    const auto p = r123::boxmuller(u0, u1);
    a = p.x;
    b = p.y;
  }
  // out[0..n) = standard normals; element e is a pure function of (offset + e).
  // offset must be even.
  void fill_normal(std::uint64_t offset, std::int64_t n, double* out) const {
    std::int64_t e = 0;
    for (; e + 1 < n; e += 2) normal_pair((offset + e) / 2, out[e], out[e + 1]);
    if (e < n) {
      double spare;
      normal_pair((offset + e) / 2, out[e], spare);
    }
  }

  // Gamma(shape, 1) by Marsaglia-Tsang (shape >= 1; shape < 1 via the boost U^(1/shape)).
  // Attempt a of the rejection loop reads block(index | a << 48).
  double gamma(std::uint64_t index, double shape) const;

  // The Philox key (seed) and the fixed counter words, for the vectorised bulk fills (normals.h).
  const r123::Philox4x32::key_type& key() const { return key_; }
  std::uint32_t stream() const { return stream_; }
  std::uint32_t trial() const { return trial_; }

 private:
  r123::Philox4x32::key_type key_;
  std::uint32_t stream_;
  std::uint32_t trial_;
};

// A component distribution with mean 0 and variance 1 before scaling.
enum class DistKind { normal, uniform, rademacher, laplace, student_t };

struct Dist {
  DistKind kind = DistKind::normal;
  double nu = 5;  // Student-t degrees of freedom (> 2 so the variance exists)

  // "normal" | "uniform" | "rademacher" | "laplace" | "t5", "t4.5", ... (Student-t with nu).
  static Dist parse(const std::string& name);  // throws Error
  std::string name() const;
  // Kurtosis E[x^4] of the standardised distribution (infinite for Student-t with nu <= 4).
  double kurtosis() const;
};

// One standardised draw (mean 0, variance 1) of `dist` at `index`.
double draw(const Dist& dist, const Stream& s, std::uint64_t index);

// Components q_i, k_i with mean mu, standard deviation sigma and correlation rho:
//   a, b independent standardised draws;  q = mu + sigma a;  k = mu + sigma (rho a + sqrt(1-rho^2) b).
// Cov(q, k) = sigma^2 rho, whatever the distribution. Draws use indices 2i and 2i+1.
struct Components {
  Dist dist;
  double mu = 0, sigma = 1, rho = 0;
  void pair(const Stream& s, std::uint64_t i, double& q, double& k) const {
    const double a = draw(dist, s, 2 * i), b = draw(dist, s, 2 * i + 1);
    q = mu + sigma * a;
    k = mu + sigma * (rho * a + std::sqrt(1 - rho * rho) * b);
  }
};

// A stream number for one experiment and the data-defining parameters of a point (FNV-1a hash,
// 24 bits, with the experiment's id in the top 8 bits). Points that share these parameters share
// their random numbers (e.g. scaled and unscaled attention over the same Q and K, as in the Simulation note).
std::uint32_t stream_id(std::uint32_t experiment, std::initializer_list<std::int64_t> params);

}  // namespace attnscale::lab
