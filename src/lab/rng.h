// Counter-based random streams (Random123's Philox4x32-10).
//
// Every number is a pure function of (seed, stream, trial, index): the key holds the seed, the
// counter holds (stream, trial, index). No state is carried from one draw to the next, so a
// result does not depend on how work is split across threads or in what order it runs.
#pragma once
#include <Random123/boxmuller.hpp>
#include <Random123/philox.h>
#include <Random123/uniform.hpp>

#include <cstdint>

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

 private:
  r123::Philox4x32::key_type key_;
  std::uint32_t stream_;
  std::uint32_t trial_;
};

}  // namespace attnscale::lab
