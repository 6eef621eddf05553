// A stand-in for the lab's libtorch module of another build (test_torch_module.py): its build
// stamp is not the lab's, so the lab must refuse it before any run (torch_module.h).
#include <cstdlib>

extern "C" __attribute__((visibility("default"))) void attnscale_torch_train(const void*, void*) { std::abort(); }
extern "C" __attribute__((visibility("default"))) const char* attnscale_torch_module_build() {
  return "0.0.0 (000000000000)";
}
