// attnscale bench: attention throughput as fractions of this machine's own limits, all measured in
// the same run:
//   fp32-peak   independent FMA chains per thread on the dispatched SIMD target (16; 12 on AVX2)
//   bf16-peak   16 independent vdpbf16ps chains (AVX-512 BF16), else Highway's bf16 dot, which
//               without such an instruction is two float32 FMAs: there the FMA peak
//   amx-peak    tdpbf16ps into 4 independent accumulator tiles (AMX), only where the bf16 products
//               run on AMX
//   copy        a 256 MiB memcpy split across the threads (bytes read + written per second)
//   copy-cache  the same over a quarter of the measured last-level cache, repeated: cache-resident
//   read        256 MiB read split across the threads, two streams a thread side by side (bytes
//               read per second): what decode does (K and V), so that the copy, which also writes,
//               can be judged as its yardstick
//   sgemm       OpenBLAS sgemm 2048^3, for comparison with a tuned GEMM library (its kernels of the
//               library's SIMD width: openblas_core.h)
// The peak loops, copy, copy-cache and read run on every thread at once: each thread waits at a
// start barrier until all have come, and the rate is the work of all over the time from the first
// thread's start to the last one's end (common/timed_together.h says why and what was weighed).
// Flop-bound rows are divided by the peak of the instructions their products run on (bf16 rows
// by amx-peak where the bf16 products run on AMX, by bf16-peak on vdpbf16ps, by fp32-peak where
// they are widened to float32), decode rows (bound by reading K and V)
// by the copy: the cache-resident copy when K and V fit in half the last-level cache, else the
// DRAM copy, and the row says which. Every round runs every row once, each between two runs of its
// limit (limit_bracket.h), so a row and its limit see the same load, every other round in reverse
// order (a row's place in a round moved decode rows by 10-30%); the table gives the median over
// rounds and the range. PyTorch's numbers join the table through bench/compare.py (--format csv).
//
// FLOPs: forward 4·B·Hq·Nq·Nkv·d, counting only visible (query, key) pairs under a causal mask;
// backward 2.5x that (five products of the same size against the forward's two).
#include <cblas.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "attention/bf16_kernels.h"
#include "attention/peak_loops.h"
#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "attnscale/kv_cache.h"
#include "attnscale/version.h"
#include "common/memory.h"
#include "common/parallel.h"
#include "common/timed_together.h"
#include "host_steal.h"
#include "limit_bracket.h"
#include "openblas_core.h"
#include "openblas_library.h"
#include "subcommands.h"

// OpenBLAS is opened when `attnscale bench` runs (openblas_library.h), not linked into the CLI.
namespace {
struct OpenBlas {
  void (*set_num_threads)(int) = nullptr;
  decltype(&cblas_sgemm) sgemm = nullptr;
};

const OpenBlas& openblas() {
  static const OpenBlas blas = [] {
    const auto& library = attnscale::cli::openblas_library();
    if (!library.handle) throw attnscale::Error(fmt::format("bench: cannot load libopenblas.so.0: {}", library.error));
    void* lib = library.handle;
    OpenBlas b;
    b.set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(lib, "openblas_set_num_threads"));
    b.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(lib, "cblas_sgemm"));
    if (!b.set_num_threads || !b.sgemm) throw attnscale::Error("bench: libopenblas.so.0 lacks cblas_sgemm");
    return b;
  }();
  return blas;
}
}  // namespace

namespace attnscale::cli {
namespace {

using Clock = std::chrono::steady_clock;

Tensor filled(DType dtype, const std::vector<std::int64_t>& shape, std::uint32_t salt) {
  Tensor t(dtype, shape.data(), static_cast<int>(shape.size()));
  std::uint32_t x = 2463534242u + salt;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    const float f = static_cast<float>(x % 20001) / 10000.0f - 1.0f;
    if (dtype == DType::bf16) t.as<bf16>()[i] = to_bf16(f);
    else if (dtype == DType::f16) t.as<f16>()[i] = to_f16(f);
    else t.as<float>()[i] = f;
  }
  return t;
}

double visible_pairs(std::int64_t Nq, std::int64_t Nkv, bool causal) {
  if (!causal) return static_cast<double>(Nq) * Nkv;
  double pairs = 0;  // bottom-right aligned: query i sees keys j <= i + Nkv - Nq
  for (std::int64_t i = 0; i < Nq; ++i) pairs += static_cast<double>(std::clamp<std::int64_t>(i + Nkv - Nq + 1, 0, Nkv));
  return pairs;
}

// What the start barrier saw over the timings of a loop run on all threads at once (the limits
// timed by time_together): told under the table when a thread came late or a timing was repeated.
struct StartNotes {
  std::string name;
  int timings = 0;
  int late = 0;      // the barrier waited more than kLate for the last thread (not timed)
  int repeated = 0;  // timings made again: a thread was apart (the barrier broke, or no overlap)
  int apart = 0;     // kept apart after every attempt
  double longest_wait = 0;
  static constexpr double kLate = 1e-3;  // seconds; an awake or parked helper comes within 0.2 ms
  void add(const TogetherTiming& t) {
    ++timings;
    late += t.start_wait > kLate;
    repeated += t.attempts - 1;
    apart += !t.together;
    longest_wait = std::max(longest_wait, t.start_wait);
  }
};

// Something timed: `calls` calls of fn per timing, `work` flops or bytes per call (0: the row
// reports microseconds per call).
struct Timed {
  std::function<void()> fn;
  double work = 0;
  int calls = 1;
  double per = 1e-9;  // rate = work / seconds · per (GFLOP/s, GB/s; 1 for tokens/s)
  bool warm = false;  // one untimed call first: a cache-resident row's data in cache when timing starts
  // Where set, one call that times itself, in place of a clock around `calls` calls of fn: a limit
  // run on all threads at once, from the first thread's start to the last one's end
  // (common/timed_together.h), what it saw counted in `notes`. fn is then the same loop, untimed.
  std::function<TogetherTiming()> together;
  std::shared_ptr<StartNotes> notes;
  double seconds() const {  // per call
    if (warm) fn();
    if (together) {
      const TogetherTiming t = together();
      if (notes) notes->add(t);
      return t.seconds;
    }
    const auto t0 = Clock::now();
    for (int c = 0; c < calls; ++c) fn();
    return std::chrono::duration<double>(Clock::now() - t0).count() / calls;
  }
  double best_seconds(int passes) const {  // the fastest of a few passes: a limit is what the machine can do
    double best = seconds();
    for (int p = 1; p < passes; ++p) best = std::min(best, seconds());
    return best;
  }
};

// A limit run on every thread at once, timed by itself; `work` per call.
Timed timed_together(std::function<TogetherTiming()> together, double work, std::shared_ptr<StartNotes> notes) {
  Timed t;
  t.fn = [together] { together(); };
  t.work = work;
  t.together = std::move(together);
  t.notes = std::move(notes);
  return t;
}

struct Limit {
  std::string name, unit, what;
  Timed timed;
  std::vector<double> rates;  // every run of it, over all rounds
};

struct Row {
  std::string name;
  std::int64_t B = 1, Hq = 1, Hkv = 1, Nq = 0, Nkv = 0, d = 0;
  bool causal = false;
  std::string dtype = "f32";
  int threads = 1;
  std::string unit;
  Timed timed;
  Limit* limit = nullptr;            // null: no ratio
  std::vector<double> seconds;       // per round
  std::vector<LimitBracket> rounds;  // per round, where the row has a limit
  std::vector<double> of_read;       // DRAM decode rows, per round: rate / the read stream's rate timed beside
};

struct Stats {
  double median, lo, hi;
};
Stats stats(std::vector<double> v) {
  if (v.empty()) return {0, 0, 0};
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

// The largest --n and --d. A forward row at N = 2^18 (8 heads, d = 128) does 4·8·N²·d = 2.8·10^14
// flops a call, minutes on a large machine and hours on a small one; 2^24, once allowed, is 4096
// times that a call. d up to 2^16 (64 Ki columns) at small N; the rows' memory is checked apart
// (check_forward_rows_fit).
constexpr std::int64_t kMaxBenchN = std::int64_t{1} << 18, kMaxBenchD = std::int64_t{1} << 16;

struct Bench {
  int threads = 0;
  int rounds = 5;
  bool quick = false;
  std::string format = "table";
  std::vector<std::string> n_lists, d_lists;  // --n, --d as given (each a comma-separated list)
  std::vector<std::int64_t> ns, ds;
  std::vector<std::string> row_lists;  // --rows as given
  std::set<std::string> rows;          // the cases to time (empty: all)
  bool memory_case = false;
};

// The items of a comma-separated list, empty ones kept ("4096,," has three). List flags are split
// here rather than by CLI11's delimiter, which drops empty items.
std::vector<std::string> list_items(const std::string& list) {
  std::vector<std::string> items;
  for (std::size_t start = 0;;) {
    const std::size_t comma = list.find(',', start);
    items.push_back(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

// The N and d of the forward rows ("fwd"): --n and --d, else the defaults (fewer N with --quick).
std::vector<std::int64_t> forward_ns(const Bench& opt) {
  return !opt.ns.empty() ? opt.ns
         : opt.quick     ? std::vector<std::int64_t>{1024, 4096}
                         : std::vector<std::int64_t>{512, 1024, 2048, 4096, 8192};
}
std::vector<std::int64_t> forward_ds(const Bench& opt) {
  return !opt.ds.empty() ? opt.ds : std::vector<std::int64_t>{64, 128};
}

// The cases `attnscale bench` times, in its table's order (--rows picks some of them).
const std::vector<std::string>& case_names() {
  static const std::vector<std::string> names = {
      "fwd",           "peak-scaling", "fwd-1thread", "fwd-scaling", "fwd-bf16",     "bwd",
      "bwd-bf16",      "bwd-1thread",  "bwd-scaling", "decode",      "kv-f32",       "kv-bf16",
      "kv-f16",        "kv-i8",        "kv-paged",    "kv-bf16-dot", "kv-short",     "kv-short-dram",
      "kv-gqa-flops",  "kv-i8-tok",    "small-call"};
  return names;
}

// The case names of --rows (each flag a comma-separated list), every one a case the bench has.
std::set<std::string> row_names(const std::vector<std::string>& lists) {
  const auto& names = case_names();
  std::set<std::string> out;
  for (const std::string& list : lists)
    for (const std::string& item : list_items(list)) {
      if (std::find(names.begin(), names.end(), item) == names.end())
        throw attnscale::Error(fmt::format("--rows: no case '{}' in the list '{}' (cases: {})", item, list,
                                           fmt::join(names, ", ")));
      out.insert(item);
    }
  return out;
}

// The integers of a list flag given once or more, each a comma-separated list, every item in
// [lo, hi].
std::vector<std::int64_t> int_lists(const std::string& flag, const std::vector<std::string>& lists, std::int64_t lo,
                                    std::int64_t hi) {
  std::vector<std::int64_t> out;
  for (const std::string& list : lists)
    for (const std::string& item : list_items(list)) {
      if (const std::string why = integer_in<std::int64_t>(lo, hi)(item); !why.empty())
        throw attnscale::Error(fmt::format("{}: {} in the list '{}'", flag, why, list));
      out.push_back(std::stoll(item));
    }
  return out;
}

double rate_of(const Timed& t, double seconds) { return t.work > 0 ? t.work / seconds * t.per : seconds * 1e6; }

// The last-level cache as the kernel reports it (sysconf's value is wrong in some virtual
// machines: 320 or 508 MiB, where sysfs and lscpu say 32 MiB); 0 if neither knows.
std::size_t reported_l3_bytes() {
  if (std::FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
    unsigned long kib = 0;
    const int got = std::fscanf(f, "%luK", &kib);
    std::fclose(f);
    if (got == 1 && kib > 0) return std::size_t(kib) << 10;
  }
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? static_cast<std::size_t>(l3) : 0;
}

// One thread's memcpy rate (bytes read + written per second) over `bytes`, the best of three
// passes of about 64 MiB each, after one pass that faults the pages in.
double copy_rate(std::size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const int repeat = static_cast<int>(std::max<std::size_t>(1, (std::size_t(64) << 20) / bytes));
  std::memcpy(dst.data(), src.data(), bytes);
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = Clock::now();
    for (int r = 0; r < repeat; ++r) {
      std::memcpy(dst.data(), src.data(), bytes);
      src[r % bytes] = dst[(r * 4099) % bytes];  // keeps the copies from being merged
    }
    best = std::max(best, 2.0 * bytes * repeat / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

struct LastLevelCache {
  std::size_t bytes;
  std::string how;  // printed under the table's header
};

// The cache a core really sees: copies of 1, 2, 4, ... 128 MiB, one thread; the last size whose
// rate stays above 3/4 of the best small copy marks the cliff, and the cache holds its source
// and destination (twice the size). Capped by what the kernel reports, which some virtual
// machines overstate (508 MiB reported where the copy falls off past 16 MiB).
const LastLevelCache& last_level_cache() {
  static const LastLevelCache cache = [] {
    const std::size_t mib = std::size_t(1) << 20;
    double fast = 0;
    std::size_t cliff = 0;
    for (std::size_t size = mib; size <= 128 * mib; size *= 2) {
      const double rate = copy_rate(size);
      if (size <= 4 * mib) fast = std::max(fast, rate);
      if (rate < 0.75 * fast) break;
      cliff = size;
    }
    const std::size_t measured = 2 * cliff, reported = reported_l3_bytes();
    const std::size_t bytes = reported > 0 ? std::min(measured, reported) : measured;
    char how[200];
    std::snprintf(how, sizeof how, "last-level cache %zu MiB: copy rate falls below 3/4 past %zu MiB copies; kernel reports %zu MiB",
                  bytes / mib, cliff / mib, reported / mib);
    return LastLevelCache{bytes, how};
  }();
  return cache;
}

std::size_t l3_bytes() { return last_level_cache().bytes; }

// Copy `bytes` from src to dst `repeat` times, each of `threads` threads its own slice: share
// `share`'s part.
void copy_share(const char* src, char* dst, std::size_t bytes, int threads, int repeat, int share) {
  const std::size_t slice = bytes / threads;
  const std::size_t begin = share * slice, end = share + 1 == threads ? bytes : begin + slice;
  for (int r = 0; r < repeat; ++r) std::memcpy(dst + begin, src + begin, end - begin);
}

// All threads' shares at once (time_together): the copy's time from the first thread's start to
// the last one's end.
TogetherTiming copy_slices(const char* src, char* dst, std::size_t bytes, int threads, int repeat) {
  return time_together(threads, [&](int share) { copy_share(src, dst, bytes, threads, repeat, share); });
}

volatile std::uint64_t read_sink;  // where read_slices leaves its sums

// Read `bytes` of src once, each thread its own slice, as two streams side by side (the slice's
// halves, a vector of each in turn) as decode reads K and V, by the dispatched target's vectors
// (peak::read_two_streams), the sums kept from being optimised away by a volatile store, all
// threads at once (time_together). Counts the bytes read, as decode rows do. One stream a thread read less than two (three runs of a test
// program, 2 threads, 256 MiB, 9 rounds alternated with a copy, load average 1.9, medians in GB/s):
// one stream 53.5 / 47.8 / 48.8, two 61.3 / 51.3 / 52.0, four 61.4 / 53.0 / 53.2, the copy 61.9 /
// 52.6 / 56.0. Eight-byte loads, as this loop read before, held an Intel Xeon (Emerald Rapids) to
// 24-25 GB/s over 1 GiB where vectors read 32-33 and one-row decode 30-31 (docs/performance.md).
TogetherTiming read_slices(const char* src, std::size_t bytes, int threads) {
  const std::size_t slice = bytes / threads / 128 * 128;
  return time_together(threads, [&](int share) {
    const char* a = src + share * slice;
    read_sink = detail::peak::read_two_streams(a, a + slice / 2, slice / 2);
  });
}

void print_table(const std::vector<std::unique_ptr<Limit>>& limits, const std::deque<Row>& rows,
                 const std::vector<std::shared_ptr<StartNotes>>& start_notes, int threads, int rounds, double load0,
                 double load1, double steal) {
  std::printf("attnscale %s (%s), CPU target %s, bf16 dot %s, bf16 products %s, threads %d, %d interleaved rounds, "
              "L3 %zu MiB\n",
              version(), git_hash(), cpu_target(), detail::peak::bf16_instruction(),
              detail::bfdot::path_name(detail::bfdot::path()), threads, rounds, l3_bytes() >> 20);
  std::printf("%s\n", last_level_cache().how.c_str());
  std::printf("load average %.2f before, %.2f after (%ld CPUs)", load0, load1, sysconf(_SC_NPROCESSORS_ONLN));
  if (steal >= 0) std::printf("; CPU time taken by the host (steal) %.1f%% of the run's", 100 * steal);
  std::printf("\n");
  std::printf("%-11s %9s %9s %9s  %-7s %s\n", "limit", "median", "min", "max", "unit", "what");
  for (const auto& l : limits) {
    if (l->rates.empty()) continue;  // no row of this run uses it (--rows)
    const Stats s = stats(l->rates);
    std::printf("%-11s %9.2f %9.2f %9.2f  %-7s %s\n", l->name.c_str(), s.median, s.lo, s.hi, l->unit.c_str(),
                l->what.c_str());
  }
  std::printf("\n%-13s %2s %3s %3s %5s %6s %4s %-6s %-4s %3s %9s %9s %15s %-7s %-10s %6s %13s %7s\n", "case", "B", "Hq",
              "Hkv", "Nq", "Nkv", "d", "mask", "dt", "thr", "ms", "rate", "[min - max]", "unit", "of limit", "ratio",
              "[min - max]", "steady");
  for (const Row& r : rows) {
    const Stats t = stats(r.seconds);
    std::vector<double> rates;
    for (double s : r.seconds) rates.push_back(rate_of(r.timed, s));
    const Stats rt = stats(rates);
    std::printf("%-13s %2lld %3lld %3lld %5lld %6lld %4lld %-6s %-4s %3d %9.3f %9.2f %7.2f-%-7.2f %-7s", r.name.c_str(),
                (long long)r.B, (long long)r.Hq, (long long)r.Hkv, (long long)r.Nq, (long long)r.Nkv, (long long)r.d,
                r.causal ? "causal" : "none", r.dtype.c_str(), r.threads, t.median * 1e3, rt.median, rt.lo, rt.hi,
                r.unit.c_str());
    if (r.limit) {
      const BracketSummary b = summarise(r.rounds, stats(r.limit->rates).median);
      const Stats q = stats(b.ratios);
      std::printf(" %-10s %6.3f %6.3f-%-6.3f %3d/%-3d", r.limit->name.c_str(), q.median, q.lo, q.hi, b.steady, b.rounds);
    }
    if (r.unit == "GB/s") std::printf(" %8.0f tok/s", double(r.B) / t.median);
    if (!r.of_read.empty()) std::printf(" %6.3f of read", stats(r.of_read).median);
    std::printf("\n");
  }
  std::printf("rate and ratio: median over rounds [min - max]; ratio: the row's rate over its limit's, the limit timed\n"
              "right before and right after the row in the same round, their mean (every other round runs the rows in\n"
              "reverse order); steady: the rounds whose two limit timings agreed within %.0f%% and neither fell under %.1f\n"
              "of the limit's median over the run (a slow spell of the host), over which the ratio is taken (over\n"
              "every round when none was: 0/N; the limit moved with the host's other work). copy rates\n"
              "count bytes read + written, read bytes read; decode rows count the K and V bytes read, against\n"
              "copy-cache when K and V fit in half of L3 (timed over 8 calls after an untimed one, so that they\n"
              "start in cache); \"of read\": a DRAM decode row's rate over the read stream's, timed beside its copy.\n"
              "fwd-scaling (bwd-scaling): rate on %d\n"
              "threads over the rate on 1 thread (its limit, fwd-1thread, bwd-1thread); peak-scaling: the FMA loop's own\n"
              "ratio, the most those can reach on this machine in that moment. small-call: microseconds per\n"
              "call. Decode rows: tok/s is new tokens per second (calls per second x B, every head of the token),\n"
              "comparable with llama.cpp's; kv-short: short decode (Hq 32 over Hkv 8, 64 and 512 keys, in cache,\n"
              "the library's thread count), where a call's fixed costs stand beside its reads; kv-short-dram: the same\n"
              "calls, each over the next of many copies of the cache (twice the L3 the kernel reports, within\n"
              "256 MiB-1 GiB), from memory as in inference; kv-gqa-flops: GQA decode (8 query heads a KV head,\n"
              "K/V in cache: 2048 keys, or fewer down to 256 where they would not fit in half of L3, a call's\n"
              "fixed costs then weighing more) against the FMA peak; kv-bf16-dot: the bf16 cache with\n"
              "compute = bf16 (GQA's products on bf16 operands: AMX tdpbf16ps where the header says\n"
              "\"bf16 products amx\", vdpbf16ps where it says avx512-bf16, else the float32 products of kv-bf16);\n"
              "kv-i8-tok: int8-KV decode over float32-KV decode (kv-f32-tok, timed just before) in tokens/s.\n"
              "Flop-bound rows go against the peak of the instructions their products run on: f32 rows fp32-peak;\n"
              "fwd-bf16 and bwd-bf16 amx-peak where their products run on AMX (the header's \"bf16 products amx\"),\n"
              "bf16-peak on vdpbf16ps (\"avx512-bf16\"), fp32-peak where bf16 pairs are widened to float32 (\"widened\";\n"
              "there fwd-bf16 and bwd-bf16 run the float32 kernels on float32 copies of their bf16 inputs).\n"
              "The peak loops, copy, copy-cache and read run on all threads at once: each thread waits at a start\n"
              "barrier until all are there, and the rate is the work of all over the time from the first start to\n"
              "the last end (a thread woken late delays the start and is not timed; a timing whose threads did not\n"
              "all run at once is made again, up to 3 times).\n",
              kSteadyTolerance * 100, kSlowShare, threads);
  for (const auto& l : limits) {
    const int slow = slow_timings(l->rates, stats(l->rates).median);
    if (slow > 0)
      std::printf("%s: %d of %zu timings under %.1f of its median (the host slowed the machine for a while)\n",
                  l->name.c_str(), slow, l->rates.size(), kSlowShare);
  }
  for (const auto& n : start_notes) {
    if (n->late == 0 && n->repeated == 0) continue;
    std::printf("start barrier, %s: %d of %d timings waited over %.0f ms for a late thread (longest %.1f ms, not timed)",
                n->name.c_str(), n->late, n->timings, StartNotes::kLate * 1e3, n->longest_wait * 1e3);
    if (n->repeated > 0) std::printf("; %d timings made again, threads apart", n->repeated);
    if (n->apart > 0) std::printf("; %d kept apart after 3 attempts (the fastest)", n->apart);
    std::printf("\n");
  }
}

void print_csv(const std::vector<std::unique_ptr<Limit>>& limits, const std::deque<Row>& rows) {
  std::printf(
      "case,B,H,Hkv,Nq,Nkv,d,causal,dtype,threads,ms,rate,rate_min,rate_max,unit,limit,ratio,ratio_min,ratio_max,"
      "of_read,steady_rounds,rounds\n");
  for (const auto& l : limits) {
    if (l->rates.empty()) continue;  // no row of this run uses it (--rows)
    const Stats s = stats(l->rates);
    std::printf("%s,1,1,1,0,0,0,0,,0,,%.3f,%.3f,%.3f,%s,,,,,,,\n", l->name.c_str(), s.median, s.lo, s.hi, l->unit.c_str());
  }
  for (const Row& r : rows) {
    std::vector<double> rates;
    for (double s : r.seconds) rates.push_back(rate_of(r.timed, s));
    const BracketSummary b = r.limit ? summarise(r.rounds, stats(r.limit->rates).median) : BracketSummary{};
    const Stats rt = stats(rates), q = stats(b.ratios);
    const std::string of_read = r.of_read.empty() ? "" : fmt::format("{:.4f}", stats(r.of_read).median);
    const std::string steady = r.limit ? fmt::format("{},{}", b.steady, b.rounds) : ",";
    std::printf("%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%s,%d,%.4f,%.3f,%.3f,%.3f,%s,%s,%.4f,%.4f,%.4f,%s,%s\n",
                r.name.c_str(), (long long)r.B, (long long)r.Hq, (long long)r.Hkv, (long long)r.Nq, (long long)r.Nkv,
                (long long)r.d, r.causal, r.dtype.c_str(), r.threads, stats(r.seconds).median * 1e3, rt.median, rt.lo,
                rt.hi, r.unit.c_str(), r.limit ? r.limit->name.c_str() : "", q.median, q.lo, q.hi, of_read.c_str(),
                steady.c_str());
  }
}

void run(const Bench& opt) {
  const int threads = opt.threads > 0 ? opt.threads : resolve_threads(0);
  std::vector<std::unique_ptr<Limit>> limits;
  auto limit = [&](std::string name, std::string unit, std::string what, Timed t) {
    limits.push_back(std::make_unique<Limit>(Limit{std::move(name), std::move(unit), std::move(what), std::move(t), {}}));
    return limits.back().get();
  };
  // What the start barrier saw, per loop timed on all threads at once (notes under the table).
  std::vector<std::shared_ptr<StartNotes>> start_notes;
  auto notes = [&](std::string name) {
    start_notes.push_back(std::make_shared<StartNotes>(StartNotes{std::move(name)}));
    return start_notes.back();
  };
  // Peak loops of about 20 ms each on an idle core, every thread's loop started at once and the
  // peak their flops over the time from the first start to the last end (peak_loops.h): a helper
  // thread woken late delays the start rather than halving the peak (its loop run by the caller
  // after its own, as a clock around the whole call saw it).
  const std::int64_t steps = std::int64_t(1) << 23;
  Limit* fp32_peak = limit("fp32-peak", "GFLOP/s", "FMA, independent chains on each thread, dispatched target",
                           timed_together([=] { return detail::peak::timed_fp32_fma(threads, steps).time; },
                                          detail::peak::fp32_flops_per_step() * threads * double(steps), notes("fp32-peak")));
  Limit* bf16_peak = limit("bf16-peak", "GFLOP/s", std::string("bf16 dot, independent chains on each thread: ") +
                                                        detail::peak::bf16_instruction(),
                           timed_together([=] { return detail::peak::timed_bf16_dot(threads, steps / 2).time; },
                                          detail::peak::bf16_flops_per_step() * threads * double(steps / 2),
                                          notes("bf16-peak")));
  // Where the bf16 products run on AMX, the bf16 attention rows go against the AMX loop (29x the
  // vdpbf16ps loop on the Intel AMX test machine; 4 tdpbf16ps a step, 2^20 steps, about 20 ms there).
  Limit* amx_peak = nullptr;
  if (detail::bfdot::path() == detail::bfdot::Path::amx) {
    amx_peak = limit("amx-peak", "GFLOP/s", "AMX tdpbf16ps, 4 independent accumulator tiles on each thread",
                     timed_together([=] { return detail::peak::timed_amx_bf16(threads, steps / 8).time; },
                                    detail::peak::amx_flops_per_step() * threads * double(steps / 8), notes("amx-peak")));
  }
  std::vector<std::shared_ptr<void>> keep;  // tensors the limits' and rows' closures use
  auto hold = [&](Tensor t) {
    auto p = std::make_shared<Tensor>(std::move(t));
    keep.push_back(p);
    return p.get();
  };
  const std::size_t dram_bytes = std::size_t(256) << 20, cache_bytes = l3_bytes() / 4;
  // Tensors, so that the yardsticks get the same (huge) pages as the K and V they judge.
  auto bytes = [&](int value) {
    char* p = static_cast<char*>(hold(Tensor(DType::u8, {std::int64_t(dram_bytes)}))->data());
    std::memset(p, value, dram_bytes);
    return p;
  };
  const char* src = bytes(1);
  char* dst = bytes(0);
  Limit* copy = limit("copy", "GB/s", "memcpy 256 MiB -> 256 MiB over the threads (read + write), best of 3",
                      timed_together([=] { return copy_slices(src, dst, dram_bytes, threads, 1); }, 2.0 * dram_bytes,
                                     notes("copy")));
  Limit* read = limit("read", "GB/s", "256 MiB read over the threads, two streams each (as K and V), timed beside the copy",
                      timed_together([=] { return read_slices(src, dram_bytes, threads); }, double(dram_bytes),
                                     notes("read")));
  const int cache_repeat = 16;
  Limit* copy_cache = limit("copy-cache", "GB/s", "memcpy of L3/4 bytes (measured L3), 16 times, best of 3 (cache-resident)",
                            timed_together([=] { return copy_slices(src, dst, cache_bytes, threads, cache_repeat); },
                                           2.0 * cache_bytes * cache_repeat, notes("copy-cache")));
  openblas().set_num_threads(threads);
  const int n = 2048;
  auto ga = std::make_shared<std::vector<float>>(n * n, 0.5f), gb = std::make_shared<std::vector<float>>(n * n, 0.25f),
       gc = std::make_shared<std::vector<float>>(n * n);
  Limit* sgemm = limit("sgemm", "GFLOP/s", "OpenBLAS sgemm 2048^3, " + openblas_core_note(),
                       {[=] {
                          openblas().sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, ga->data(), n,
                                           gb->data(), n, 0.0f, gc->data(), n);
                        },
                        2.0 * n * n * double(n)});

  std::deque<Row> rows;  // stable addresses: a row may serve as another's limit
  auto attention = [&](const std::string& name, std::int64_t H, std::int64_t N, std::int64_t d, bool causal, DType dtype,
                       bool backward_too, int thr) {
    const Tensor* q = hold(filled(dtype, {1, H, N, d}, 1));
    const Tensor* k = hold(filled(dtype, {1, H, N, d}, 2));
    const Tensor* v = hold(filled(dtype, {1, H, N, d}, 3));
    Tensor* out = hold(Tensor(dtype, {1, H, N, d}));
    Tensor* lse = hold(Tensor(DType::f32, {1, H, N}));
    Options o;
    o.threads = thr;
    o.mask.causal = causal;
    o.compute = dtype == DType::bf16 ? Compute::bf16 : Compute::native;
    const double flops = 4.0 * H * visible_pairs(N, N, causal) * d;
    Row r;
    r.name = name;
    r.Hq = r.Hkv = H;
    r.Nq = r.Nkv = N;
    r.d = d;
    r.causal = causal;
    r.dtype = dtype == DType::bf16 ? "bf16" : "f32";
    r.threads = thr;
    r.unit = "GFLOP/s";
    // The peak of the instructions the products run on: bf16 pairs widened to float32 run on FMAs.
    r.limit = dtype != DType::bf16                                                ? fp32_peak
              : amx_peak                                                          ? amx_peak
              : detail::bfdot::path() == detail::bfdot::Path::avx512_bf16 ? bf16_peak
                                                                                  : fp32_peak;
    if (!backward_too) {
      r.timed = {[=] { forward(q->view(), k->view(), v->view(), {out->view(), lse->view()}, o); }, flops};
    } else {
      forward(q->view(), k->view(), v->view(), {out->view(), lse->view()}, o);
      const Tensor* dout = hold(filled(dtype, {1, H, N, d}, 4));
      Tensor* dq = hold(Tensor(dtype, {1, H, N, d}));
      Tensor* dk = hold(Tensor(dtype, {1, H, N, d}));
      Tensor* dv = hold(Tensor(dtype, {1, H, N, d}));
      r.timed = {[=] {
                   backward(q->view(), k->view(), v->view(), out->view(), lse->view(), dout->view(),
                            {dq->view(), dk->view(), dv->view()}, o);
                 },
                 2.5 * flops};
    }
    rows.push_back(std::move(r));
    return &rows.back();
  };
  const std::vector<std::int64_t> ns = forward_ns(opt), ds = forward_ds(opt);
  // --rows: the cases asked for are set up (with what their limits need); all of them without it.
  auto want = [&](const char* name) { return opt.rows.empty() || opt.rows.count(name) > 0; };
  if (want("fwd"))
    for (std::int64_t d : ds)
      for (std::int64_t n : ns)
        for (bool causal : {false, true}) attention("fwd", 8, n, d, causal, DType::f32, false, threads);
  const std::int64_t n_key = opt.quick ? 2048 : 4096;
  // Thread scaling: the same forward on 1 thread (against the peak) and on `threads` threads
  // against the 1-thread run timed just before it. The FMA loop's own ratio beside them: what the
  // cores give when both run (a shared machine's neighbours, a lower clock with every core busy).
  if (want("peak-scaling")) {
    // Both loops timed the same way (by themselves), so that their ratio compares like with like.
    Limit* one = limit("fma-1thread", "GFLOP/s", "the FMA loop on 1 thread (peak-scaling's reference)",
                       timed_together([=] { return detail::peak::timed_fp32_fma(1, steps).time; },
                                      detail::peak::fp32_flops_per_step() * double(steps), nullptr));
    Row r;
    r.name = "peak-scaling";
    r.threads = threads;
    r.unit = "GFLOP/s";
    r.timed = fp32_peak->timed;
    r.timed.notes = notes("peak-scaling");
    r.limit = one;
    rows.push_back(std::move(r));
  }
  if (want("fwd-1thread") || want("fwd-scaling")) {
    Row* one = attention("fwd-1thread", 8, n_key, 128, false, DType::f32, false, 1);
    Limit* as_limit = limit("fwd-1thread", "GFLOP/s", "the forward on 1 thread (fwd-scaling's reference)", one->timed);
    Row* all = attention("fwd-scaling", 8, n_key, 128, false, DType::f32, false, threads);
    all->unit = "GFLOP/s";
    all->limit = as_limit;
  }
  if (want("fwd-bf16")) attention("fwd-bf16", 8, n_key, 128, false, DType::bf16, false, threads);
  if (want("bwd")) {
    attention("bwd", 8, n_key, 128, false, DType::f32, true, threads);
    attention("bwd", 8, n_key, 128, true, DType::f32, true, threads);
  }
  if (want("bwd-bf16")) attention("bwd-bf16", 8, n_key, 128, false, DType::bf16, true, threads);
  if (want("bwd-1thread") || want("bwd-scaling")) {  // the backward's thread scaling, as the forward's
    Row* one = attention("bwd-1thread", 8, n_key, 128, false, DType::f32, true, 1);
    Limit* as_limit = limit("bwd-1thread", "GFLOP/s", "the backward on 1 thread (bwd-scaling's reference)", one->timed);
    Row* all = attention("bwd-scaling", 8, n_key, 128, false, DType::f32, true, threads);
    all->limit = as_limit;
  }
  // Decode: Nq = 1 per query head against a long KV cache; bound by reading K and V once. "decode"
  // rows go through forward() with float32 K/V; "kv-*" rows through the cache API (kv_cache.h):
  // contiguous float32, bfloat16, float16 and int8 (q8, 32 values a scale), and a paged float32
  // cache with blocks of 16 keys in shuffled order.
  enum class Cache { forward, f32, bf16, f16, i8, paged };
  auto case_name = [](Cache kind) {  // the row's name in the table (and for --rows)
    static const char* const names[] = {"decode", "kv-f32", "kv-bf16", "kv-f16", "kv-i8", "kv-paged"};  // Cache's order
    return names[static_cast<int>(kind)];
  };
  // The float32 K and V of a shape, made once: "decode", "kv-f32" and the paged cache's copy of
  // them read the same tensors, so that where a row's memory landed in the run does not tell two
  // rows apart (2026-12-04, 19:08 UTC: 0.937 of the copy against 0.798 for the two routes of one
  // kernel, the same time when alternated in one process). Their position in a round still does
  // (docs/performance.md).
  std::map<std::array<std::int64_t, 3>, std::pair<const Tensor*, const Tensor*>> f32_kv;
  auto f32_keys_values = [&](std::int64_t Hkv, std::int64_t nkv, std::int64_t d) {
    auto& kv = f32_kv[{Hkv, nkv, d}];
    if (!kv.first)
      kv = {hold(filled(DType::f32, {1, Hkv, nkv, d}, 6)), hold(filled(DType::f32, {1, Hkv, nkv, d}, 7))};
    return kv;
  };
  // call_threads: the threads the call asks the library for (-1: the bench's count).
  auto decode = [&](Cache kind, std::int64_t Hq, std::int64_t Hkv, std::int64_t nkv, std::int64_t d,
                    Compute compute = Compute::native, int call_threads = -1) {
    const Tensor* q = hold(filled(DType::f32, {1, Hq, 1, d}, 5));
    Tensor* out = hold(Tensor(DType::f32, {1, Hq, 1, d}));
    const TensorView q3 = TensorView::contiguous(q->view().data, DType::f32, {1, Hq, d});
    const TensorView out3 = TensorView::contiguous(out->view().data, DType::f32, {1, Hq, d});
    Row r;
    r.name = case_name(kind);
    r.Hq = Hq;
    r.Hkv = Hkv;
    r.Nq = 1;
    r.Nkv = nkv;
    r.d = d;
    r.threads = threads;
    r.unit = "GB/s";
    DecodeOptions opts;
    opts.threads = call_threads >= 0 ? call_threads : threads;
    opts.compute = compute;
    double element_bytes = 4;
    if (kind == Cache::forward || kind == Cache::f32 || kind == Cache::paged) {
      const auto [k, v] = f32_keys_values(Hkv, nkv, d);
      if (kind == Cache::forward) {
        Options o;
        o.threads = threads;
        r.timed.fn = [=] { forward(q->view(), k->view(), v->view(), {out->view()}, o); };
      } else if (kind == Cache::f32) {
        const KVCache c{k->view(), v->view(), {}, {}, {}, {}};
        r.timed.fn = [=] { attnscale::decode(q3, c, out3, {}, opts); };
      } else {
        const std::int64_t block = 16, blocks = nkv / block;
        Tensor* pk = hold(Tensor(DType::f32, {blocks, block, Hkv, d}));
        Tensor* pv = hold(Tensor(DType::f32, {blocks, block, Hkv, d}));
        Tensor* table = hold(Tensor(DType::i32, {1, blocks}));
        Tensor* lens = hold(Tensor(DType::i32, {1}));
        lens->as<std::int32_t>()[0] = static_cast<std::int32_t>(nkv);
        for (std::int64_t i = 0; i < blocks; ++i)  // a fixed shuffle: block i of the sequence at (i·7919) mod blocks
          table->as<std::int32_t>()[i] = static_cast<std::int32_t>((i * 7919) % blocks);
        for (std::int64_t h = 0; h < Hkv; ++h)
          for (std::int64_t j = 0; j < nkv; ++j) {
            const std::int64_t slot = (table->as<std::int32_t>()[j / block] * block + j % block) * Hkv + h;
            std::copy_n(k->as<float>() + (h * nkv + j) * d, d, pk->as<float>() + slot * d);
            std::copy_n(v->as<float>() + (h * nkv + j) * d, d, pv->as<float>() + slot * d);
          }
        const KVCache c{pk->view(), pv->view(), {}, {}, table->view(), lens->view()};
        r.timed.fn = [=] { attnscale::decode(q3, c, out3, {}, opts); };
      }
    } else if (kind == Cache::bf16 || kind == Cache::f16) {
      element_bytes = 2;
      const DType t = kind == Cache::bf16 ? DType::bf16 : DType::f16;
      const Tensor* k = hold(filled(t, {1, Hkv, nkv, d}, 6));
      const Tensor* v = hold(filled(t, {1, Hkv, nkv, d}, 7));
      const KVCache c{k->view(), v->view(), {}, {}, {}, {}};
      r.timed.fn = [=] { attnscale::decode(q3, c, out3, {}, opts); };
    } else {
      element_bytes = 1 + 4.0 / 32;  // int8 values and a float32 scale per 32
      const Tensor kf = filled(DType::f32, {1, Hkv, nkv, d}, 6), vf = filled(DType::f32, {1, Hkv, nkv, d}, 7);
      // K, V and their scales in one allocation, as llama.cpp keeps its cache in one buffer: huge
      // pages for all of it (the scales of 4096 keys alone, 512 KiB, would get 4 KiB pages, whose
      // first reads after the other rows ran cost a call up to a millisecond on a machine with
      // costly page walks; docs/performance.md).
      const std::int64_t values = Hkv * nkv * d, scales = values / 32 * 4;
      char* base = static_cast<char*>(hold(Tensor(DType::u8, {2 * values + 2 * scales}))->data());
      const TensorView k = TensorView::contiguous(base, DType::i8, {1, Hkv, nkv, d});
      const TensorView v = TensorView::contiguous(base + values, DType::i8, {1, Hkv, nkv, d});
      const TensorView ks = TensorView::contiguous(base + 2 * values, DType::f32, {1, Hkv, nkv, d / 32});
      const TensorView vs = TensorView::contiguous(base + 2 * values + scales, DType::f32, {1, Hkv, nkv, d / 32});
      quantize_q8(kf.view(), k, ks);
      quantize_q8(vf.view(), v, vs);
      const KVCache c{k, v, ks, vs, {}, {}};
      r.timed.fn = [=] { attnscale::decode(q3, c, out3, {}, opts); };
    }
    r.dtype = kind == Cache::bf16 ? "bf16" : kind == Cache::f16 ? "f16" : kind == Cache::i8 ? "i8" : "f32";
    const double bytes = 2.0 * Hkv * nkv * d * element_bytes;
    // Cache-resident when K and V take at most half the measured L3, the footprint of copy-cache
    // itself (a quarter copied, source and destination). Nearer the cache's size a row keeps only
    // part of its K and V there from one call to the next, and the part changed with the other
    // tenants of a shared L3: bf16, H = 8, Nkv = 4096, d = 128 (16 MiB, with 16 MiB measured)
    // took 0.21-0.23 ms in some runs and 0.49 in others (docs/performance.md).
    const bool cached = bytes <= double(l3_bytes()) / 2;
    r.limit = cached ? copy_cache : copy;
    r.timed.work = bytes;
    r.timed.calls = cached ? 8 : 1;
    r.timed.warm = cached;  // the rows before it (and its limit's copy) leave other data in L3
    rows.push_back(std::move(r));
    return &rows.back();
  };
  auto wanted = [&](Cache kind) { return want(case_name(kind)); };
  // ggml-comparable cases (H = 8, d = 64 and 128, Nkv 4096 and 65536), then GQA (every cache type).
  for (std::int64_t d : {std::int64_t{64}, std::int64_t{128}})
    for (std::int64_t nkv : {std::int64_t{4096}, std::int64_t{65536}})
      for (Cache kind : {Cache::forward, Cache::f32, Cache::bf16, Cache::f16, Cache::i8})
        if (wanted(kind)) decode(kind, 8, 8, nkv, d);
  if (wanted(Cache::paged)) decode(Cache::paged, 8, 8, 65536, 128);
  // kv-bf16-dot: the bf16 cache with compute = bf16 (GQA's products on bf16 operands).
  const auto bf16_products = [&](std::int64_t Hq, std::int64_t Hkv, std::int64_t nkv) {
    if (want("kv-bf16-dot")) decode(Cache::bf16, Hq, Hkv, nkv, 128, Compute::bf16)->name = "kv-bf16-dot";
  };
  for (Cache kind : {Cache::forward, Cache::f32, Cache::bf16, Cache::f16, Cache::i8})  // 8 query heads per KV head
    if (wanted(kind)) decode(kind, 32, 4, 65536, 128);
  bf16_products(32, 4, 65536);
  if (!opt.quick) {
    for (Cache kind : {Cache::forward, Cache::f32, Cache::bf16, Cache::i8})
      if (wanted(kind)) decode(kind, 8, 1, 262144, 128);
    bf16_products(8, 1, 262144);
  }
  // Short decode: Llama 3's groups (32 query heads over 8 KV heads), d = 128, over 64 and 512 keys,
  // in cache, where a call's fixed costs (Q's packing, the merge, a hand-off to a thread) stand
  // beside its reads; the thread count left to the library unless --threads names one, as
  // small-call's (under 256 KiB of K and V it takes one).
  if (want("kv-short"))
    for (std::int64_t nkv : {std::int64_t{64}, std::int64_t{512}})
      for (Cache kind : {Cache::f32, Cache::bf16}) {
        Row* r = decode(kind, 32, 8, nkv, 128, Compute::native, opt.threads);
        r->name = "kv-short";
        r->timed.calls = 8;  // in cache whatever decode() judged from the L3 measured
        r->timed.warm = true;
        r->limit = copy_cache;
      }
  // The same short calls with K and V from memory, as in inference, where the other layers (their
  // caches and weights) evict a layer's cache between its calls: each call reads the next of many
  // copies of the cache laid side by side over twice the last-level cache the kernel reports (at
  // least 256 MiB, at most 1 GiB), so that none is in cache when it is read; against the DRAM copy.
  // The copies' values are one byte pattern, a small normal number in float32 and in bf16 alike, so
  // that all four rows share one allocation.
  if (want("kv-short-dram")) {
    const std::size_t span = std::clamp(2 * reported_l3_bytes(), std::size_t(256) << 20, std::size_t(1) << 30);
    char* pool = static_cast<char*>(hold(Tensor(DType::u8, {std::int64_t(span)}))->data());
    std::memset(pool, 0x3c, span);  // 0x3c3c3c3c: 0.0115 as float32; 0x3c3c: 0.0115 as bf16
    for (std::int64_t nkv : {std::int64_t{64}, std::int64_t{512}})
      for (Cache kind : {Cache::f32, Cache::bf16}) {
        const std::int64_t Hq = 32, Hkv = 8, d = 128;
        Row* r = decode(kind, Hq, Hkv, nkv, d, Compute::native, opt.threads);  // its shape and rate
        r->name = "kv-short-dram";
        const DType t = kind == Cache::bf16 ? DType::bf16 : DType::f32;
        const std::size_t half = static_cast<std::size_t>(Hkv * nkv * d) * dtype_size(t);
        auto caches = std::make_shared<std::vector<KVCache>>();
        for (std::size_t at = 0; at + 2 * half <= span; at += 2 * half)
          caches->push_back({TensorView::contiguous(pool + at, t, {1, Hkv, nkv, d}),
                             TensorView::contiguous(pool + at + half, t, {1, Hkv, nkv, d}), {}, {}, {}, {}});
        const Tensor* q = hold(filled(DType::f32, {1, Hq, d}, 5));
        Tensor* out = hold(Tensor(DType::f32, {1, Hq, d}));
        DecodeOptions o;
        o.threads = opt.threads;
        auto next = std::make_shared<std::size_t>(0);
        r->timed.fn = [=] {
          attnscale::decode(q->view(), (*caches)[*next], out->view(), {}, o);
          *next = (*next + 1) % caches->size();
        };
        r->timed.calls = 64;
        r->timed.warm = false;
        r->limit = copy;
      }
  }
  // GQA decode's arithmetic against the FMA peak, its K/V cache-resident (Hq = 32 over Hkv = 4,
  // d = 128; Nkv = 2048, 8 MiB, halved down to 256 until K and V fit in half of the last-level
  // cache measured, the decode rows' criterion: a guest whose cache behaves as 2 MiB read 8 MiB at
  // memory's pace). A group of 8 query rows does 4·8·d flops a key for the key's 2·d float32
  // values, 4 flops a byte: for the DRAM GQA row to read at a fraction f of the copy, the
  // arithmetic must run at 4·f·copy GFLOP/s at least, which this row bounds from above.
  if (want("kv-gqa-flops")) {
    const std::int64_t Hq = 32, Hkv = 4, d = 128;
    std::int64_t nkv = 2048;
    while (nkv > 256 && double(2 * Hkv * nkv * d * sizeof(float)) > double(l3_bytes()) / 2) nkv /= 2;
    Row* r = decode(Cache::f32, Hq, Hkv, nkv, d);
    r->name = "kv-gqa-flops";
    r->unit = "GFLOP/s";
    r->timed.work = 4.0 * Hq * nkv * d;
    r->timed.calls = 8;  // timed in cache whatever decode() judged from the L3 measured
    r->timed.warm = true;
    r->limit = fp32_peak;
  }
  // int8 against float32 K/V in tokens per second (one new token per call), timed side by side.
  if (want("kv-i8-tok")) {
    const Row* f32 = nullptr;
    for (const Row& r : rows)
      if (r.name == "kv-f32" && r.Hq == 8 && r.Nkv == 65536 && r.d == 128) f32 = &r;
    if (!f32) f32 = decode(Cache::f32, 8, 8, 65536, 128);  // its limit, without its row (--rows)
    Limit* f32_tokens = limit("kv-f32-tok", "tok/s", "kv-f32 decode, H = 8, Nkv = 65536, d = 128, in tokens/s",
                              {f32->timed.fn, 1.0, 1, 1.0});
    Row* i8 = decode(Cache::i8, 8, 8, 65536, 128);
    i8->name = "kv-i8-tok";
    i8->unit = "tok/s";
    i8->timed.work = 1.0;
    i8->timed.per = 1.0;
    // Four calls a timing, about as long as the float32 call it is set against (3-4 ms each
    // against 12-14), so that both see the host's hiccups for as long (bench/goals.py does the same).
    i8->timed.calls = 4;
    i8->limit = f32_tokens;
  }

  // A small call: the fixed cost of one forward (threads, scratch, dispatch), with the thread
  // count left to the library unless --threads names one, as most callers leave it.
  if (want("small-call")) {
    const Tensor* q = hold(filled(DType::f32, {1, 1, 4, 4}, 8));
    Tensor* out = hold(Tensor(DType::f32, {1, 1, 4, 4}));
    Options o;
    o.threads = opt.threads;
    Row r;
    r.name = "small-call";
    r.Nq = r.Nkv = r.d = 4;
    r.threads = threads;
    r.unit = "us/call";
    r.timed = {[=] { forward(q->view(), q->view(), q->view(), {out->view()}, o); }, 0, 2000};
    rows.push_back(std::move(r));
  }

  if (!opt.rows.empty()) {  // rows set up for another's limit only; the limits no kept row uses are not timed
    std::deque<Row> kept;
    for (Row& r : rows)
      if (opt.rows.count(r.name)) kept.push_back(std::move(r));
    rows = std::move(kept);
  }
  double load[2] = {0, 0};
  getloadavg(load, 1);
  const double load0 = load[0];
  const CpuTimes cpu0 = read_cpu_times();
  for (Row& r : rows) {  // warm-up: first-touch of outputs, thread and target start-up
    if (r.limit) r.limit->timed.fn();
    r.timed.fn();
  }
  // Every other round in reverse order: in a full run the first of two decode rows over the same
  // K and V (one kernel by two routes) read 0.67-0.96 of the copy where the second read 0.93-1.08,
  // and each alone the same (2026-12-04, docs/performance.md).
  for (int round = 0; round < opt.rounds; ++round)
    for (std::size_t x = 0; x < rows.size(); ++x) {
      Row& r = rows[round % 2 ? rows.size() - 1 - x : x];
      // The limit timed right before the row and again right after it: the row's ratio is its rate
      // over their mean, and the round steady where they agree (LimitBracket).
      auto limit_rate = [&] {
        // Copies take the best of 3 passes: one pass swings with the neighbours' memory traffic.
        const int passes = r.limit == copy || r.limit == copy_cache ? 3 : 1;
        const double rate = rate_of(r.limit->timed, r.limit->timed.best_seconds(passes));
        r.limit->rates.push_back(rate);
        return rate;
      };
      const double before = r.limit ? limit_rate() : 0;
      const double s = r.timed.seconds();
      r.seconds.push_back(s);
      if (r.limit) r.rounds.push_back(LimitBracket{before, limit_rate(), rate_of(r.timed, s)});
      // The read stream beside every DRAM decode row's copy: how much of the copy's rate a pure
      // reader reaches in the same moment (their ratio is the `read` line of the table), and the
      // row's rate against it ("of read": where a machine reads slower than it copies, the most a
      // decode, which only reads, can approach).
      if (r.limit == copy) {
        const double read_rate = rate_of(read->timed, read->timed.best_seconds(3));
        read->rates.push_back(read_rate);
        r.of_read.push_back(rate_of(r.timed, s) / read_rate);
      }
    }
  // Nor is the bf16 dot loop where the bf16 products are widened to float32 (their rows go against
  // fp32-peak): timed once per round on its own when the run has bf16 rows, it shows why they are.
  // Before sgemm: OpenBLAS's threads spin for a while after a call (bench/goals.py). Timed right
  // after the last sgemm, this loop read one core's worth of two in whole runs on a 2-vCPU guest
  // (100.6-101.8 GFLOP/s over every round, fp32-peak 196-199 in the same run), likely for that.
  const bool bf16_rows = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.dtype == "bf16"; });
  if (bf16_rows && bf16_peak->rates.empty())
    for (int round = 0; round < opt.rounds; ++round)
      bf16_peak->rates.push_back(rate_of(bf16_peak->timed, bf16_peak->timed.seconds()));
  // sgemm is no row's limit: time it once per round on its own, after the rows.
  for (int round = 0; round < opt.rounds; ++round) sgemm->rates.push_back(rate_of(sgemm->timed, sgemm->timed.seconds()));
  getloadavg(load, 1);
  const double steal = steal_share(cpu0, read_cpu_times());
  if (opt.format == "csv") print_csv(limits, rows);
  else print_table(limits, rows, start_notes, threads, opt.rounds, load0, load[0], steal);
}

// The forward rows of --n and --d hold their tensors all at once (each row's q, k, v and output
// [1, 8, N, d] float32 and lse [1, 8, N], causal and not): refused before any is made when they
// would not fit, naming the flags (each tensor alone passes the library's check long before
// their sum does).
void check_forward_rows_fit(const Bench& opt) {
  if (opt.ns.empty() && opt.ds.empty()) return;  // the default sizes: a few hundred MiB
  if (!opt.rows.empty() && !opt.rows.count("fwd")) return;
  const std::vector<std::int64_t> ns = forward_ns(opt), ds = forward_ds(opt);
  double bytes = 0;
  for (const std::int64_t n : ns)
    for (const std::int64_t d : ds) bytes += 2 * (4 * 8.0 * n * d * 4 + 8.0 * n * 4);
  std::string flags;
  if (!opt.n_lists.empty()) flags += fmt::format("--n {}", fmt::join(opt.n_lists, ","));
  if (!opt.d_lists.empty()) flags += fmt::format("{}--d {}", flags.empty() ? "" : " ", fmt::join(opt.d_lists, ","));
  detail::check_estimate(flags + ": a run of the forward rows", bytes, "smaller or fewer sizes need less");
}

// Forward + backward of one head, N = 65536, d = 128: run under /usr/bin/time -v for peak RSS.
void memory_case() {
  const std::int64_t N = 65536, d = 128;
  const Tensor q = filled(DType::f32, {1, 1, N, d}, 1), k = filled(DType::f32, {1, 1, N, d}, 2),
               v = filled(DType::f32, {1, 1, N, d}, 3), dout = filled(DType::f32, {1, 1, N, d}, 4);
  Tensor out(DType::f32, {1, 1, N, d}), lse(DType::f32, {1, 1, N}), dq(DType::f32, {1, 1, N, d}),
      dk(DType::f32, {1, 1, N, d}), dv(DType::f32, {1, 1, N, d});
  const auto t0 = Clock::now();
  forward(q.view(), k.view(), v.view(), {out.view(), lse.view()});
  backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view()});
  const double bytes = 8.0 * N * d * 4 + N * 4.0;  // q k v dout out dq dk dv, lse
  std::printf("memory case: N=%lld d=%lld, inputs+outputs %.1f MiB, %.1f s\n", (long long)N, (long long)d,
              bytes / (1 << 20), std::chrono::duration<double>(Clock::now() - t0).count());
}

}  // namespace

void add_bench(CLI::App& app) {
  auto opt = std::make_shared<Bench>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure attention throughput against this machine's peaks and copy bandwidth");
  cmd->add_option("--threads", opt->threads, "threads, 0 to 4096 (default: $ATTNSCALE_THREADS, else all cores)")
      ->check(threads_range());
  cmd->add_option("--rounds", opt->rounds, "interleaved rounds (median and range over them), 1 to 1000")
      ->capture_default_str()
      ->check(integer_in<std::int64_t>(1, 1000));
  cmd->add_flag("--quick", opt->quick, "a quick subset: N in {1024, 4096}, key cases at N = 2048");
  cmd->add_option("--n", opt->n_lists,
                  fmt::format("sequence lengths (comma-separated), each 1 to {} (2^18); the forward rows' tensors\n"
                              "of every N and d together must fit in memory",
                              kMaxBenchN))
      ->option_text("N,...");  // not CLI11's "N,... ..."
  cmd->add_option("--d", opt->d_lists, fmt::format("head dimensions (comma-separated), each 1 to {} (2^16)", kMaxBenchD))
      ->option_text("D,...");
  cmd->add_option("--format", opt->format, "table or csv")->check(CLI::IsMember({"table", "csv"}).description(""));
  cmd->add_option("--rows", opt->row_lists, "only these cases (comma-separated: fwd, bwd, decode, kv-i8, ...)")
      ->option_text("CASE,...");
  cmd->add_flag("--memory-case", opt->memory_case, "only forward+backward at N = 65536, d = 128, one head");
  cmd->callback([opt] {
    opt->ns = int_lists("--n", opt->n_lists, 1, kMaxBenchN);
    opt->ds = int_lists("--d", opt->d_lists, 1, kMaxBenchD);
    opt->rows = row_names(opt->row_lists);
    check_forward_rows_fit(*opt);
    if (opt->memory_case) return memory_case();
    run(*opt);
  });
}

}  // namespace attnscale::cli
