#include "standard_output.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "attnscale/error.h"

namespace attnscale::cli {
namespace {

std::string failed(int err) {
  return err != 0 ? fmt::format("stdout: write failed ({})", std::strerror(err)) : "stdout: write failed";
}

}  // namespace

void write_stdout(std::string_view text) {
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
    throw Error(failed(errno));
}

std::string stdout_error() {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  std::cout.flush();
  if (flushed && !std::ferror(stdout) && std::cout.good()) return {};
  return failed(err);
}

}  // namespace attnscale::cli
