// Refusing allocations that cannot succeed, before attempting them.
//
// A request larger than the machine's physical memory plus swap can never be satisfied; trying
// anyway either throws std::bad_alloc deep inside a kernel or, with overcommit, gets the process
// killed once the pages are touched. check_allocation turns it into a clear Error up front.
//
// allocate_block: the memory of large arrays (tensors and the kernels' scratch), with huge pages.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace attnscale::detail {

// Physical memory plus swap, in bytes (sysinfo); a large constant if it cannot be read.
std::int64_t memory_limit_bytes();

// "1.5 GiB", "3.6 TiB", "512 B".
std::string format_bytes(double bytes);

// Throws Error("<what> needs <bytes>, more than the <limit> of memory (RAM + swap) this machine has")
// when `bytes` (may be computed in double to avoid overflow) exceeds memory_limit_bytes(). `what` is
// a callable returning the name, called only for the message (every tensor is checked).
[[noreturn]] void fail_allocation(const std::string& what, double bytes);
template <class What>
void check_allocation(const What& what, double bytes) {
  if (bytes > static_cast<double>(memory_limit_bytes())) fail_allocation(what(), bytes);
}

// The same check for an estimate of what a whole run would hold (several arrays, rows, records),
// made before any of it is allocated: throws Error("<what> needs about <bytes>, more than the
// <limit> of memory (RAM + swap) this machine has; <advice>") when `bytes` exceeds the limit.
// `what` names the flags that set the size ("--trials 2147483648 --d 64: the sweep").
void check_estimate(const std::string& what, double bytes, const std::string& advice);

// `bytes` of memory, 64-byte aligned, released with release_block; nullptr when none is left.
// Blocks of 2 MiB and more start on a 2 MiB boundary and ask for transparent huge pages (as numpy
// does for arrays of 4 MiB and more): a stream over a KV cache of hundreds of MiB then walks 512
// times fewer page-table entries, and the first touch of a fresh scratch buffer takes one page
// fault per 2 MiB instead of one per 4 KiB (docs/performance.md has the measurements). Released
// blocks of 128 KiB and more (on page boundaries) are kept, up to 256 MiB of them, and handed out
// again for requests they hold with less than half to spare: a call's scratch and outputs (the
// backward's packed keys and partials, the arrays the Python module returns) then find the pages
// of the call before it instead of new pages the kernel must clear (3-5% of a backward call of
// tens of MiB; up to 36% of one of a few MiB, whose pages glibc had given back to the kernel).
void* allocate_block(std::size_t bytes);
void release_block(void* p);
// The bytes a block from allocate_block holds (at least the bytes asked for).
std::size_t block_capacity(const void* p);
// Bytes of released blocks kept for reuse now.
std::size_t kept_block_bytes();
// Frees the kept blocks now (the next huge request gets new pages).
void free_kept_blocks();

}  // namespace attnscale::detail
