#include "mpi_job.h"

#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <unistd.h>

#ifdef ATTNSCALE_HAVE_MPI
#include <mpi.h>

#include "distributed/same_values.h"
#include "lab/mpi_points.h"
#endif

namespace attnscale::cli::mpi_job {
namespace {
bool started = false, command_line_agreed = false;
int my_rank = 0, my_size = 1;

// mpirun stops the other ranks with SIGTERM when one dies or calls MPI_Abort: each says so in one
// line (write() and _exit() are safe in a signal handler; the text is built beforehand).
char stopped_line[160];
volatile std::sig_atomic_t stopped_code = 128 + SIGTERM;
extern "C" void on_stopped(int) {
  if (stopped_line[0] != '\0') {
    const ssize_t ignored = write(STDERR_FILENO, stopped_line, std::strlen(stopped_line));
    (void)ignored;
  }
  _exit(stopped_code);
}
}  // namespace

void start(int* argc, char*** argv) {
#ifdef ATTNSCALE_HAVE_MPI
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) return;
  // Serialized: the sweep scheduler calls MPI from whichever worker thread finished a point,
  // one call at a time.
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  started = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &my_size);
  std::snprintf(stopped_line, sizeof stopped_line,
                "attnscale: rank %d/%d: stopped: another rank of the job failed (see its message)\n", my_rank, my_size);
  if (my_size > 1) std::signal(SIGTERM, on_stopped);
  static const lab::MpiPoints world(MPI_COMM_WORLD);
  lab::set_point_scheduler(&world);
#else
  (void)argc;
  (void)argv;
#endif
}

void finish() {
#ifdef ATTNSCALE_HAVE_MPI
  if (started) MPI_Finalize();
  started = false;
#endif
}

bool active() { return started; }
int rank() { return my_rank; }
int size() { return my_size; }

std::string prefix() {
  return my_size > 1 ? fmt::format("rank {}/{}: ", my_rank, my_size) : std::string();
}

void said_why(int code) {
  stopped_code = code;
  stopped_line[0] = '\0';
}

void agree_on_command_line(const std::string& error, const std::string& asked) {
  if (command_line_agreed) return;
  command_line_agreed = true;
#ifdef ATTNSCALE_HAVE_MPI
  if (started && my_size > 1) {
    std::vector<distributed::NamedValue> flags;
    for (const char* flag : {"--help", "--version"}) flags.push_back({flag, asked == flag ? "given" : ""});
    distributed::agree_on_values(MPI_COMM_WORLD, "the command line", flags, error);
  }
#else
  (void)error;
  (void)asked;
#endif
}

void stop_others(int code) {
#ifdef ATTNSCALE_HAVE_MPI
  if (started && my_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#else
  (void)code;
#endif
}

}  // namespace attnscale::cli::mpi_job
