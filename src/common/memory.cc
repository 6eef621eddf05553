#include "common/memory.h"

#include <malloc.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attnscale/error.h"

namespace attnscale::detail {

std::int64_t memory_limit_bytes() {
  // Read once (sysinfo is a system call): every tensor's allocation is checked against it.
  static const std::int64_t limit = [] {
    struct sysinfo info {};
    if (sysinfo(&info) != 0) return std::int64_t{1} << 50;
    const double bytes = (static_cast<double>(info.totalram) + static_cast<double>(info.totalswap)) * info.mem_unit;
    return bytes > 0x1p62 ? std::int64_t{1} << 62 : static_cast<std::int64_t>(bytes);
  }();
  return limit;
}

std::string format_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

void fail_allocation(const std::string& what, double bytes) {
  throw Error(what + " needs " + format_bytes(bytes) + ", more than the " +
              format_bytes(static_cast<double>(memory_limit_bytes())) + " of memory (RAM + swap) this machine has");
}

void check_estimate(const std::string& what, double bytes, const std::string& advice) {
  if (!(bytes > static_cast<double>(memory_limit_bytes()))) return;
  throw Error(what + " needs about " + format_bytes(bytes) + ", more than the " +
              format_bytes(static_cast<double>(memory_limit_bytes())) + " of memory (RAM + swap) this machine has; " +
              advice);
}

namespace {

// Blocks of a huge page or more are huge pages, and kept. On a machine whose page walks are costly
// (a guest with shadow page tables), a cache read through 4 KiB pages is slower and erratic: int8
// K/V of 2 MiB each (H = 8, Nkv = 4096, d = 64), one thread, 10 rounds: 5.5-18.8 GB/s in 4 KiB
// pages, 20.7-23.2 in huge pages (docs/performance.md).
constexpr std::size_t kHugeBytes = std::size_t{2} << 20;
constexpr std::size_t kHugeAlign = std::size_t{2} << 20;   // where they start (a huge page)
constexpr std::size_t kKeepBytes = std::size_t{256} << 20;  // at most this much kept unused
// Blocks from 128 KiB (glibc's first mmap threshold) are kept too, on page boundaries: freed to
// glibc, blocks of that size go back to the kernel (unmapped, or trimmed from the heap's top), and
// the next call's blocks fault their pages in afresh, one 4 KiB page at a time (a float32 backward
// from Python, N = 64-2048, H = 8, d = 128: 100-1500 page faults a call, docs/performance.md).
constexpr std::size_t kKeptFrom = std::size_t{128} << 10;  // the smallest block kept
constexpr std::size_t kPageAlign = 4096;

// Blocks of 128 KiB and more, kept for the next call after they are released: the block sizes in
// use, and the released blocks, oldest first. Never destroyed (a block may be released during exit).
struct BlockCache {
  std::mutex mutex;
  std::unordered_map<void*, std::size_t> live;
  std::vector<std::pair<void*, std::size_t>> kept;
  std::size_t kept_bytes = 0;
};
BlockCache& block_cache() {
  static BlockCache* cache = new BlockCache;
  return *cache;
}

}  // namespace

void* allocate_block(std::size_t bytes) {
  const bool huge = bytes >= kHugeBytes, kept = bytes >= kKeptFrom;
  const std::size_t align = huge ? kHugeAlign : kept ? kPageAlign : 64;
  const std::size_t size = (std::max<std::size_t>(bytes, 1) + align - 1) / align * align;
  if (!kept) return std::aligned_alloc(align, size);
  BlockCache& c = block_cache();
  {
    // The smallest kept block that holds `size` and is less than twice as large, of those the
    // last released (its pages the likeliest to be in the caches still).
    std::lock_guard<std::mutex> lock(c.mutex);
    std::size_t best = c.kept.size();
    for (std::size_t i = c.kept.size(); i-- > 0;)
      if (c.kept[i].second >= size && c.kept[i].second < 2 * size &&
          (best == c.kept.size() || c.kept[i].second < c.kept[best].second))
        best = i;
    if (best < c.kept.size()) {
      const auto [p, kept] = c.kept[best];
      c.kept.erase(c.kept.begin() + static_cast<std::ptrdiff_t>(best));
      c.kept_bytes -= kept;
      c.live.emplace(p, kept);
      return p;
    }
  }
  void* p = std::aligned_alloc(align, size);
  if (!p) return nullptr;
#ifdef MADV_HUGEPAGE
  if (huge) madvise(p, size, MADV_HUGEPAGE);  // advice only: a refusal changes nothing
#endif
  std::lock_guard<std::mutex> lock(c.mutex);
  c.live.emplace(p, size);
  return p;
}

void release_block(void* p) {
  if (!p) return;
  if (reinterpret_cast<std::uintptr_t>(p) % kPageAlign != 0) {  // not a kept block's start
    std::free(p);
    return;
  }
  BlockCache& c = block_cache();
  std::vector<void*> drop;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    const auto it = c.live.find(p);
    if (it == c.live.end()) {  // a small block that happens to lie on a page boundary
      std::free(p);
      return;
    }
    const std::size_t size = it->second;
    c.live.erase(it);
    if (size > kKeepBytes) {
      drop.push_back(p);
    } else {
      c.kept.emplace_back(p, size);
      c.kept_bytes += size;
      while (c.kept_bytes > kKeepBytes) {  // the oldest go
        drop.push_back(c.kept.front().first);
        c.kept_bytes -= c.kept.front().second;
        c.kept.erase(c.kept.begin());
      }
    }
  }
  for (void* q : drop) std::free(q);
}

std::size_t block_capacity(const void* p) {
  return malloc_usable_size(const_cast<void*>(p));  // every block is aligned_alloc's
}

std::size_t kept_block_bytes() {
  BlockCache& c = block_cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.kept_bytes;
}

void free_kept_blocks() {
  BlockCache& c = block_cache();
  std::vector<std::pair<void*, std::size_t>> drop;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    drop.swap(c.kept);
    c.kept_bytes = 0;
  }
  for (const auto& block : drop) std::free(block.first);
}

}  // namespace attnscale::detail
