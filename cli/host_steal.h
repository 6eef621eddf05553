// The share of the CPU time a virtual machine's host gave to others while a bench ran: the steal
// column of /proc/stat's "cpu" line (time a vCPU was ready but not run), over all columns.
//
// It shows one way a shared host slows a run: a vCPU descheduled for milliseconds. It does not show
// another: a vCPU that runs at half speed because the physical core's other hardware thread is
// busy, its thread's CPU time then equal to its wall time (limit_bracket.h). Both can halve a
// timing; only a limit timed beside each row catches the second.
#pragma once
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace attnscale::cli {

struct CpuTimes {
  std::uint64_t total = 0, steal = 0;  // in the kernel's clock ticks, over all CPUs
  bool known = false;
};

// "cpu  user nice system idle iowait irq softirq steal guest guest_nice": guest time is also in user
// (the kernel counts it twice), so the total stops at steal.
inline CpuTimes parse_cpu_line(const std::string& line) {
  std::istringstream in(line);
  std::string name;
  in >> name;
  if (name != "cpu") return {};
  CpuTimes t;
  std::uint64_t value = 0;
  int column = 0;
  for (; column < 8 && in >> value; ++column) {
    t.total += value;
    if (column == 7) t.steal = value;
  }
  t.known = column == 8;
  if (!t.known) t = {};
  return t;
}

inline CpuTimes read_cpu_times() {
  std::ifstream f("/proc/stat");
  std::string line;
  return std::getline(f, line) ? parse_cpu_line(line) : CpuTimes{};
}

// The steal share between two readings, or a negative number when it is not known.
inline double steal_share(const CpuTimes& a, const CpuTimes& b) {
  if (!a.known || !b.known || b.total <= a.total) return -1;
  return double(b.steal - a.steal) / double(b.total - a.total);
}

}  // namespace attnscale::cli
