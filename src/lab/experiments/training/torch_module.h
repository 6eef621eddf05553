// The lab's libtorch module: what needs libtorch in the training and recall experiments (the
// model, the autograd op, the tasks' batches, the training loop: train_run.h) is built as a shared
// module, libattnscale_torch_units.so, which the lab opens on the first training run. A process
// that runs no training (`attnscale --version`, `attend`, `import attnscale.lab`, the other
// experiments) loads neither libtorch nor the OpenBLAS it links.
//
// Where the module is, relative to the object the lab is linked into: an executable (the CLI, the
// tests) looks in <its folder>/ATTNSCALE_TORCH_MODULE_DIR (../lib/attnscale: where
// `cmake --install` puts it, and the build tree mirrors, build/bin → build/lib/attnscale); a
// shared object (the Python module attnscale._lab) looks next to itself.
#pragma once
#include <string>

#include "lab/experiments/training/train_run.h"

namespace attnscale::lab::training {

// train(c) (train_run.h) in the module, on the calling thread, with torch's and OpenBLAS's threads
// set to one (so a run's bits do not depend on --threads). The first call opens the module; where
// it cannot, throws Error naming the module's path with dlerror()'s reason.
RunRecord train_in_torch_module(const RunConfig& c);

// The path the module is opened from, in this process.
std::string torch_module_path();

}  // namespace attnscale::lab::training

// The module's entry points (torch_module_entry.cc), looked up by these names. train: *record =
// the run of *config; exceptions (Error naming a flag) pass through to the caller. build: the
// version and commit the module was built from ("0.1.0 (25199c593217)"), which must be the lab's:
// RunConfig and RunRecord cross between them as they are laid out, so a module of another build
// (a stale file beside a new CLI) is refused with one clear error rather than run.
extern "C" void attnscale_torch_train(const attnscale::lab::training::RunConfig* config,
                                      attnscale::lab::training::RunRecord* record);
extern "C" const char* attnscale_torch_module_build();

namespace attnscale::lab::training {
// This build's version and commit, as attnscale_torch_module_build() gives them.
std::string build_stamp();
}  // namespace attnscale::lab::training
