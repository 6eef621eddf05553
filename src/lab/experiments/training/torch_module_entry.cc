// The libtorch module's entry point (torch_module.h): a training run on the calling thread, with
// the process set up for libtorch's way of allocating and with its thread pools at one thread.
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>

#include <climits>
#include <string>

#include "lab/experiments/training/torch_module.h"

namespace attnscale::lab::training {
namespace {

// libtorch allocates every step's activations and gradients afresh. glibc serves blocks over
// 128 KiB with mmap and gives them back to the kernel when freed, so each step page-faulted its
// tensors in again: an additive-attention run (d_head 64: [8, 2, 64, 64, 64] tensors, 16 MiB each)
// spent 20 of its 49 CPU seconds in the kernel. Freed memory now stays in the heap for the next
// step (mmap only past 1 GiB, trim only past 2 GiB): the same run took 7.8 CPU seconds, 11.7 s
// wall against 76.6 s at load average 4, with the same bytes out (docs/lab.md).
void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  mallopt(M_TOP_PAD, 256 << 20);
}

// Torch's intra-op threads and OpenBLAS's: one per run, on the run's own thread. Parallelism is
// across runs, so a run's arithmetic (and every row) is the same for any --threads. OpenBLAS came
// with libtorch, as this module's dependency: RTLD_DEFAULT searches the module's own scope too.
void single_threaded_torch() {
  keep_freed_memory();
  at::set_num_threads(1);
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(1);
}

}  // namespace
}  // namespace attnscale::lab::training

extern "C" __attribute__((visibility("default"))) void attnscale_torch_train(
    const attnscale::lab::training::RunConfig* config, attnscale::lab::training::RunRecord* record) {
  attnscale::lab::training::single_threaded_torch();
  *record = attnscale::lab::training::train(*config);
}

extern "C" __attribute__((visibility("default"))) const char* attnscale_torch_module_build() {
  static const std::string stamp = attnscale::lab::training::build_stamp();  // the module's own copy
  return stamp.c_str();
}
