// OpenBLAS, opened when a command needs it (dlopen), never linked into the CLI: its pthread build
// starts a pool of worker threads (spinning in sched_yield) in every process that loads it, which
// cost every other subcommand ~35 ms of CPU time (measured on `attnscale experiment saturation`).
// `bench` uses it for its sgemm row; `bench`, `report` and `experiment training|recall` open it at
// their start to see which kernels it took (openblas_core.h). The training runs' libtorch (the lab's
// libtorch module) links the same library and finds it already loaded.
#pragma once
#include <string>

namespace attnscale::cli {

struct OpenBlasLibrary {
  void* handle = nullptr;  // from dlopen("libopenblas.so.0"); null where it could not be opened
  std::string error;       // dlerror() where it could not
};

// Opened on the first call, then kept.
const OpenBlasLibrary& openblas_library();

}  // namespace attnscale::cli
