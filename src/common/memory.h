// Refusing allocations that cannot succeed, before attempting them.
//
// A request larger than the machine's physical memory plus swap can never be satisfied; trying
// anyway either throws std::bad_alloc deep inside a kernel or, with overcommit, gets the process
// killed once the pages are touched. check_allocation turns it into a clear Error up front.
#pragma once
#include <cstdint>
#include <string>

namespace attnscale::detail {

// Physical memory plus swap, in bytes (sysinfo); a large constant if it cannot be read.
std::int64_t memory_limit_bytes();

// "1.5 GiB", "3.6 TiB", "512 B".
std::string format_bytes(double bytes);

// Throws Error("<what> needs <bytes>, more than the <limit> of memory (RAM + swap) this machine has")
// when `bytes` (may be computed in double to avoid overflow) exceeds memory_limit_bytes().
void check_allocation(const std::string& what, double bytes);

}  // namespace attnscale::detail
