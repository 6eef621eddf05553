#include "lab/sweep_memory.h"

#include <algorithm>

#include "common/memory.h"

namespace attnscale::lab {

double per_trial_bytes(std::int64_t trials, std::size_t width) {
  return 2.0 * sizeof(double) * static_cast<double>(trials) * static_cast<double>(width);
}

double largest(const Args& a, const std::string& flag) {
  const auto v = a.ints(flag);
  return v.empty() ? 0.0 : static_cast<double>(*std::max_element(v.begin(), v.end()));
}

double concurrent_points(const Args& a, std::size_t points) {
  return static_cast<double>(std::clamp<std::int64_t>(static_cast<std::int64_t>(points), 1, std::max(a.threads, 1)));
}

double trial_sweep_bytes(const Args& a, const TrialSweep& sweep) {
  const double points = static_cast<double>(sweep.points);
  const double rows_per_point = static_cast<double>(sweep.rows_per_point != 0 ? sweep.rows_per_point : sweep.width);
  return concurrent_points(a, sweep.points) *
             (per_trial_bytes(a.trials, sweep.width) + sweep.trial_extra_bytes * static_cast<double>(a.trials)) +
         a.threads * sweep.thread_bytes + points * rows_per_point * kRowBytes;
}

void check_sweep_memory(const Args& a, const std::vector<std::string>& flags, double bytes) {
  if (!(bytes > static_cast<double>(detail::memory_limit_bytes()))) return;
  std::string given;
  for (const std::string& f : flags)
    given += (given.empty() ? "--" : " --") + f + " " + (f == "trials" ? std::to_string(a.trials) : a.get(f));
  detail::check_estimate(given + ": the sweep", bytes,
                         flags.empty() || flags[0] != "trials" ? "smaller values need less"
                                                               : "fewer trials or smaller sizes need less");
}

}  // namespace attnscale::lab
