// Fuzz target: the .npy reader on arbitrary bytes (the in-memory entry point shares every parsing
// step with read_npy on files). Any input must either give a tensor whose data are exactly the
// input's last bytes, or throw attnscale::Error naming the file.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "attnscale/error.h"
#include "io/npy_header.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnscale;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Tensor t;
  try {
    t = detail::read_npy_bytes("fuzz.npy", bytes);
  } catch (const Error& e) {
    if (std::strncmp(e.what(), "fuzz.npy: ", 10) != 0) {
      std::fprintf(stderr, "npy_fuzz: error does not name the file: %s\n", e.what());
      std::abort();
    }
    return 0;
  }
  if (t.rank() < 1 || t.rank() > 4 || t.nbytes() > size) {
    std::fprintf(stderr, "npy_fuzz: accepted a tensor of rank %d and %zu bytes from %zu input bytes\n", t.rank(),
                 t.nbytes(), size);
    std::abort();
  }
  if (t.nbytes() > 0 && std::memcmp(t.data(), data + size - t.nbytes(), t.nbytes()) != 0) {
    std::fprintf(stderr, "npy_fuzz: data bytes differ from the file's tail\n");
    std::abort();
  }
  return 0;
}
