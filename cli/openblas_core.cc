#include "openblas_core.h"

#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "attention/kernels.h"
#include "openblas_library.h"

namespace attnscale::cli {
namespace {

constexpr const char* kChoseVariable = "ATTNSCALE_OPENBLAS_CHOSE";  // what OpenBLAS took before the restart

// The name of the kernels OpenBLAS runs ("Prescott", "Haswell", "SkylakeX", ...), or null where it
// cannot be opened. Opens it (openblas_library.h).
const char* openblas_core() {
  using Name = char* (*)();
  void* library = openblas_library().handle;
  const auto name = library ? reinterpret_cast<Name>(dlsym(library, "openblas_get_corename")) : nullptr;
  return name ? name() : nullptr;
}

bool one_of(const char* core, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (strcasecmp(core, n) == 0) return true;
  return false;
}

// The commands whose time OpenBLAS's kernels decide: the bench's sgemm, and libtorch's products in
// the training runs (the report runs them too).
bool uses_openblas(char** argv) {
  for (char** a = argv + 1; *a; ++a)  // asking for help runs nothing
    if (std::strcmp(*a, "--help") == 0 || std::strcmp(*a, "-h") == 0) return false;
  if (std::strcmp(argv[1], "bench") == 0 || std::strcmp(argv[1], "report") == 0) return true;
  if (std::strcmp(argv[1], "experiment") != 0) return false;
  for (char** a = argv + 2; *a; ++a)
    if (std::strcmp(*a, "training") == 0 || std::strcmp(*a, "recall") == 0) return true;
  return false;
}

}  // namespace

void restart_with_openblas_core(char** argv) {
  if (argv[0] && argv[1] && uses_openblas(argv)) restart_with_openblas_kernels(argv);
}

void restart_with_openblas_kernels(char** argv) {
  if (!argv[0] || std::getenv("OPENBLAS_CORETYPE")) return;
  const char* core = openblas_core();
  if (!core) return;
  // OpenBLAS's kernels of the width of the library's target: AVX-512 (every AVX3 target) or AVX2.
  detail::simd::init_target_from_env();
  const std::string target = detail::simd::target_name();
  const char* wanted = nullptr;
  if (target.rfind("AVX3", 0) == 0 && !one_of(core, {"SkylakeX", "Cooperlake", "SapphireRapids"})) wanted = "SkylakeX";
  if (target == "AVX2" && !one_of(core, {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"}))
    wanted = "Haswell";
  if (!wanted) return;
  setenv(kChoseVariable, core, 1);
  setenv("OPENBLAS_CORETYPE", wanted, 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // no restart: the command goes on with OpenBLAS's own choice
  unsetenv(kChoseVariable);
}

std::string openblas_core_note() {
  const char* core = openblas_core();
  std::string note = std::string(core ? core : "unknown") + " kernels";
  if (const char* chose = std::getenv(kChoseVariable))
    note += std::string(" (OpenBLAS took ") + chose + "; OPENBLAS_CORETYPE set at the start)";
  return note;
}

}  // namespace attnscale::cli
