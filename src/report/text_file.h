// A text file of the report written whole, or an Error: the stream is closed (its buffer flushed)
// before it is checked, so that a full disk meeting the last buffered bytes is an error too, not
// a file cut short.
//
//   write_text_file(tmp / "report.md", text, dir / "report.md");  // errors name the latter
#pragma once
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "attnscale/error.h"

namespace attnscale::report {

// Writes `text` to `path`; an Error names `shown` (where the file is going; by default `path`)
// and the system's reason ("report.md: cannot write (No space left on device)").
inline void write_text_file(const std::filesystem::path& path, const std::string& text,
                            const std::filesystem::path& shown = {}) {
  errno = 0;
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out)
    throw Error(fmt::format("{}: cannot write ({})", (shown.empty() ? path : shown).string(),
                            errno != 0 ? std::strerror(errno) : "the stream failed"));
}

}  // namespace attnscale::report
