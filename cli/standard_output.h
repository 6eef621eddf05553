// Writing to stdout as an output like any other: a failed write (a full disk, an I/O error) is
// an error, exit code 2, not a success with the results lost. stdout is buffered, so what
// printf() wrote is checked once, at the exit (stdout_error, cli/main.cc); a whole result
// written at once is checked where it is written (write_stdout), with the system's reason.
#pragma once
#include <string>
#include <string_view>

namespace attnscale::cli {

// Writes `text` to stdout and flushes it; throws Error("stdout: write failed (<reason>)").
void write_stdout(std::string_view text);

// Flushes stdout (and std::cout); empty if everything printed arrived, else the error line's text.
std::string stdout_error();

}  // namespace attnscale::cli
