// OutputFile: see output_file.h.
#include "io/output_file.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>
#include <utility>

#include "attnscale/error.h"

namespace attnscale::detail {
namespace {

constexpr int kMaxLinks = 40;  // as the kernel's own limit (ELOOP)

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw Error(path + ": " + what); }
std::string system_error(int err) { return std::strerror(err); }

std::string parent_of(const std::string& p) {
  const std::size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

// Writes all of `bytes` to `fd`; returns 0 or the errno of the first failed write.
int write_all(int fd, const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

// A FIFO whose reader has gone raises SIGPIPE, which would end the process without a word: it is
// blocked on this thread while writing, so the write fails with EPIPE instead, and a SIGPIPE it
// left pending is taken before the old mask is restored.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~NoSigpipe() {
    if (!sigismember(&old_, SIGPIPE)) {
      const timespec now{};
      while (sigtimedwait(&pipe_, nullptr, &now) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_{}, old_{};
};

}  // namespace

OutputTarget output_target(const std::string& path) {
  if (path.empty()) fail("''", "empty output path");
  OutputTarget t{path};
  struct stat st {};
  for (int links = 0;; ++links) {
    if (::lstat(t.path.c_str(), &st) != 0) {
      if (errno != ENOENT) fail(path, "cannot write (" + system_error(errno) + ")");
      break;
    }
    t.exists = true;
    if (!S_ISLNK(st.st_mode)) break;
    if (links == kMaxLinks) fail(path, "cannot write (" + system_error(ELOOP) + ")");
    std::string to(4096, '\0');
    const ssize_t n = ::readlink(t.path.c_str(), to.data(), to.size());
    if (n < 0 || static_cast<std::size_t>(n) >= to.size()) fail(path, "cannot read the symbolic link " + t.path);
    to.resize(static_cast<std::size_t>(n));
    t.path = to[0] == '/' ? to : parent_of(t.path) + "/" + to;
    t.exists = false;  // known again once the link's target is looked at
  }
  const std::string shown = t.path == path ? "" : " (the link's target " + t.path + ")";
  if (t.exists && S_ISDIR(st.st_mode)) fail(path, "is a directory" + shown + ", not a file");
  if (t.exists && !S_ISREG(st.st_mode)) {
    t.in_place = true;
    if (::access(t.path.c_str(), W_OK) != 0) fail(path, "cannot write" + shown + " (" + system_error(errno) + ")");
    return t;
  }
  // The temporary is created beside the target, so its directory must exist and be writable.
  const std::string dir = parent_of(t.path);
  struct stat ds {};
  if (::stat(dir.c_str(), &ds) != 0)
    fail(path, "cannot write" + shown + ": no directory " + dir + " (" + system_error(errno) + ")");
  if (!S_ISDIR(ds.st_mode)) fail(path, "cannot write" + shown + ": " + dir + " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    fail(path, "cannot write" + shown + " in directory " + dir + " (" + system_error(errno) + ")");
  return t;
}

OutputFile::OutputFile(const std::string& path, std::string bytes) : path_(path), target_(output_target(path)) {
  if (target_.in_place) {
    bytes_ = std::move(bytes);
    return;
  }
  static std::atomic<unsigned> serial{0};
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp_ = target_.path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(serial++);
    fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == 100)) {
      const int err = errno;
      tmp_.clear();
      fail(path_, "cannot write (" + system_error(err) + ")");
    }
  }
  // A replaced file keeps its permission bits.
  struct stat st {};
  if (target_.exists && ::stat(target_.path.c_str(), &st) == 0) ::fchmod(fd, st.st_mode & 07777);
  int err = write_all(fd, bytes);
  // Synced before the rename, so that after a crash the path holds the old or the new contents.
  if (err == 0 && ::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp_.c_str());
    tmp_.clear();
    fail(path_, "cannot write (" + system_error(err) + ")");
  }
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : path_(std::move(other.path_)),
      target_(std::move(other.target_)),
      tmp_(std::exchange(other.tmp_, {})),
      bytes_(std::move(other.bytes_)),
      placed_(other.placed_) {}

OutputFile::~OutputFile() {
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutputFile::place() {
  if (placed_) return;
  if (target_.in_place) {
    const NoSigpipe no_sigpipe;
    const int fd = ::open(target_.path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail(path_, "cannot write (" + system_error(errno) + ")");
    int err = write_all(fd, bytes_);
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err != 0) fail(path_, "write failed (" + system_error(err) + ")");
  } else if (::rename(tmp_.c_str(), target_.path.c_str()) != 0) {
    fail(path_, "cannot rename the temporary file into place (" + system_error(errno) + ")");
  } else {
    tmp_.clear();
  }
  placed_ = true;
}

void OutputFile::remove_if_new() {
  if (placed_ && !target_.exists && !target_.in_place) ::unlink(target_.path.c_str());
}

}  // namespace attnscale::detail
