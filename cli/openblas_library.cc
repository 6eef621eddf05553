#include "openblas_library.h"

#include <dlfcn.h>

namespace attnscale::cli {

const OpenBlasLibrary& openblas_library() {
  static const OpenBlasLibrary library = [] {
    OpenBlasLibrary l;
    l.handle = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!l.handle) l.error = dlerror();
    return l;
  }();
  return library;
}

}  // namespace attnscale::cli
