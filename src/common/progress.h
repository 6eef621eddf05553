// A progress bar on stderr for work that takes more than a couple of seconds.
//
// Nothing is shown until `delay` seconds have passed since construction, so quick runs stay
// silent. On a terminal the bar redraws one line ("\r"); otherwise (a log file, a pipe) each
// update after the delay prints one plain line.
//   ProgressBar bar("saturation");
//   for (...) bar.update(done, total);
//   bar.finish();
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

namespace attnscale {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label, double delay_seconds = 2.0, std::FILE* out = stderr);
  ~ProgressBar() { finish(); }
  void update(std::size_t done, std::size_t total);
  void finish();  // ends the bar's line (if one was drawn); idempotent

 private:
  std::string label_;
  double delay_;
  std::FILE* out_;
  bool tty_;
  bool drawn_ = false;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace attnscale
