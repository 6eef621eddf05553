#include "common/progress.h"

#include <unistd.h>

namespace attnscale {

ProgressBar::ProgressBar(std::string label, double delay_seconds, std::FILE* out)
    : label_(std::move(label)),
      delay_(delay_seconds),
      out_(out),
      tty_(isatty(fileno(out)) != 0),
      start_(std::chrono::steady_clock::now()) {}

void ProgressBar::update(std::size_t done, std::size_t total) {
  if (finished_) return;
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (t < delay_) return;
  const double frac = total ? static_cast<double>(done) / total : 1.0;
  if (tty_) {
    constexpr int kWidth = 30;
    const int fill = static_cast<int>(frac * kWidth + 0.5);
    std::string bar(fill, '#');
    bar.resize(kWidth, ' ');
    std::fprintf(out_, "\r%s [%s] %zu/%zu %5.1fs", label_.c_str(), bar.c_str(), done, total, t);
  } else {
    std::fprintf(out_, "%s: %zu/%zu (%.0f%%) %.1fs\n", label_.c_str(), done, total, 100 * frac, t);
  }
  std::fflush(out_);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (drawn_ && tty_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
}

}  // namespace attnscale
