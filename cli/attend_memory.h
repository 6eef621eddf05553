// What one `attend` call holds at once, checked against the machine's memory before any input is
// read or output written.
//
// Every tensor is checked alone where it is allocated (common/memory.h), but a call holds them
// together: its inputs q, k, v and --mask, then its output and, when asked, --lse and --probs.
// Inputs that passed one by one were read in full, and the call could then end in std::bad_alloc or
// the kernel's OOM killer. The sizes come from the files' headers (their data is not read), so
// the refusal takes a moment (inputs of 30% of 23.5 GiB each, as sparse files: 18 ms):
//   --q [29620540, 64] float32, --k [29620540, 64] float32, --v [29620540, 64] float32, --out
//   [29620540, 64] float32: the call needs about 28.2 GiB, more than the 23.5 GiB of memory
//   (RAM + swap) this machine has; smaller arrays need less
// An array that alone exceeds the memory is refused with its own allocation's message, as before
// ("--probs: tensor [1000000, 1000000] float32 needs 3.6 TiB, more than ...").
// The kernels' scratch and --reference's float64 copies are not counted: the sum is a lower
// bound, so a refused call could not have run.
#pragma once
#include <string>

namespace attnscale::cli {

// The files of one call; an empty path is a flag not given.
struct AttendFiles {
  std::string q, k, v, mask;
  std::string lse, probs;  // outputs: only whether they are asked for counts
};

// Reads the inputs' headers (read_input_header: a bad file is refused as read_input() would) and
// throws Error, naming the flags and shapes, when the arrays the call holds exceed the memory.
void check_attend_memory(const AttendFiles& files);

}  // namespace attnscale::cli
