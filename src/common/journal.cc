// Journal: see journal.h. FNV-1a is written out here (a dozen lines) because the checksum only
// has to catch torn and garbled tails, not adversaries, and it keeps the library free of zlib.
#include "common/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "attnscale/error.h"
#include "io/output_file.h"

namespace attnscale {
namespace {

// Version 2 checksums a record's key with its payload; version 1 (the payload alone) is still read.
constexpr std::string_view kMagic = "attnscale-journal 2\n";
constexpr std::string_view kMagicV1 = "attnscale-journal 1\n";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(path + ": " + what + " (" + std::strerror(errno) + ")");
}

// A record's checksum: of "<key> <payload>" (key in decimal), or of the payload alone in a
// version 1 journal and for the header, which has no key.
std::uint64_t checksum(const std::string* key, std::string_view payload) {
  std::uint64_t h = kFnvOffset;
  if (key != nullptr) h = fnv1a64(*key + " ", h);
  return fnv1a64(payload, h);
}

std::string frame(char kind, const std::string& key, const std::string& payload) {
  char buf[96];
  const std::uint64_t sum = checksum(key.empty() ? nullptr : &key, payload);
  std::snprintf(buf, sizeof buf, "%zu %016" PRIx64 "\n", payload.size(), sum);
  return std::string(1, kind) + " " + (key.empty() ? "" : key + " ") + buf + payload + "\n";
}

// Reads one framed record at `pos`: kind ('H' or 'R'), key (records only), payload; `keyed`: the
// checksum covers the key (version 2). Returns false when the bytes from `pos` do not hold one
// whole, intact record.
bool read_record(std::string_view s, std::size_t& pos, char kind, bool keyed, std::int64_t& key,
                 std::string& payload) {
  const std::size_t eol = s.find('\n', pos);
  if (eol == std::string_view::npos || eol - pos > 80 || s[pos] != kind) return false;
  const std::string line(s.substr(pos, eol - pos));
  long long k = 0;
  unsigned long long len = 0, sum = 0;
  int used = 0;
  if (kind == 'R') {
    if (std::sscanf(line.c_str(), "R %lld %llu %llx%n", &k, &len, &sum, &used) != 3) return false;
  } else if (std::sscanf(line.c_str(), "H %llu %llx%n", &len, &sum, &used) != 2) {
    return false;
  }
  if (static_cast<std::size_t>(used) != line.size()) return false;
  const std::size_t start = eol + 1;
  if (len > s.size() || start + len + 1 > s.size() || s[start + len] != '\n') return false;
  const std::string_view bytes = s.substr(start, len);
  const std::string key_text = kind == 'R' && keyed ? std::to_string(k) : std::string();
  if (checksum(key_text.empty() ? nullptr : &key_text, bytes) != sum) return false;
  payload.assign(bytes);
  key = k;
  pos = start + len + 1;
  return true;
}

// Whether the bytes at `pos` hold a whole record's frame: a record line and as many bytes as it
// announces, then '\n', whatever its checksum says. A record torn by a kill never does.
bool complete_record(std::string_view s, std::size_t pos) {
  const std::size_t eol = s.find('\n', pos);
  if (eol == std::string_view::npos || eol - pos > 80) return false;
  const std::string line(s.substr(pos, eol - pos));
  long long k = 0;
  unsigned long long len = 0, sum = 0;
  if (std::sscanf(line.c_str(), "R %lld %llu %llx", &k, &len, &sum) != 3) return false;
  return len <= s.size() && eol + 1 + len < s.size() && s[eol + 1 + len] == '\n';
}

std::string read_file(const std::string& path, int fd) {
  std::string data;
  char buf[1 << 16];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, "cannot read journal");
    }
    data.append(buf, static_cast<std::size_t>(n));
  }
  return data;
}

// Makes the file's directory entry durable too (a new file is otherwise lost on power failure).
void sync_parent_dir(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace

std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

Journal Journal::open(const std::string& path, const std::string& header, bool resume) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "cannot open journal");
  Journal j(path, fd);
  const std::string data = resume ? read_file(path, fd) : std::string();
  std::size_t good = 0;  // bytes of intact journal at the start of the file
  bool keyed = true;     // version 2: a record's checksum covers its key
  if (!data.empty()) {
    std::size_t pos = kMagic.size();
    std::int64_t key = 0;
    std::string text;
    keyed = data.compare(0, kMagicV1.size(), kMagicV1) != 0;
    if ((keyed && data.compare(0, kMagic.size(), kMagic) != 0) || !read_record(data, pos, 'H', keyed, key, text))
      throw Error(path + ": not a journal of this tool; remove it or run without --resume");
    if (text != header)
      throw Error(path + ": belongs to a different run (" + text + "); rerun with the same flags, or without --resume");
    good = pos;
    // Every intact record is kept, wherever it lies. Bytes that do not read as one (a garbled
    // record) are skipped to the next line that starts a record ("\nR "); any record accepted
    // there passes its own checksum. What follows the last intact record is cut off below: a
    // record torn by a kill is always incomplete, so a complete one there was damaged, not torn.
    std::string payload;
    std::size_t failed = 0;  // record starts that did not read since the last intact record
    while (pos < data.size()) {
      if (read_record(data, pos, 'R', keyed, key, payload)) {
        j.records_[key] = payload;
        good = pos;
        j.damaged_ += failed;
        failed = 0;
        continue;
      }
      ++failed;
      const std::size_t next = data.find("\nR ", pos);
      if (next == std::string::npos) break;
      pos = next + 1;
    }
    if (failed > 0 && complete_record(data, good)) j.damaged_ += failed;
    j.recovered_ = j.records_.size();
  }
  if (j.damaged_ > 0 || !keyed) {
    // Damaged records would be met (and warned about) again by every later resume, and a
    // version 1 journal cannot take version 2 records: the intact records are written anew.
    j.rewrite(header);
    return j;
  }
  // Cut off whatever follows the last intact record (a torn append), or everything when starting over.
  if (::ftruncate(fd, static_cast<off_t>(good)) != 0 || ::lseek(fd, 0, SEEK_END) < 0) fail(path, "cannot truncate journal");
  if (good == 0) {
    try {
      j.write_all(std::string(kMagic) + frame('H', "", header));
    } catch (const Error&) {
      ::unlink(path.c_str());  // a journal without its header (a full disk) holds nothing to resume
      throw;
    }
    sync_parent_dir(path);
  }
  return j;
}

void Journal::rewrite(const std::string& header) {
  std::string bytes = std::string(kMagic) + frame('H', "", header);
  for (const auto& [key, payload] : records_) bytes += frame('R', std::to_string(key), payload);
  detail::OutputFile file(path_, std::move(bytes));  // a temporary beside the journal, synced
  file.place();                                      // renamed onto it: the old or the new, never half
  sync_parent_dir(path_);
  ::close(fd_);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
  if (fd_ < 0 || ::lseek(fd_, 0, SEEK_END) < 0) fail(path_, "cannot open journal");
}

Journal::Journal(Journal&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(other.fd_),
      records_(std::move(other.records_)),
      recovered_(other.recovered_),
      damaged_(other.damaged_) {
  other.fd_ = -1;
}

Journal::~Journal() {
  if (fd_ >= 0) ::close(fd_);
}

void Journal::write_all(const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path_, "cannot write journal");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd_) != 0) fail(path_, "cannot sync journal");
}

void Journal::append(std::int64_t key, const std::string& payload) {
  write_all(frame('R', std::to_string(key), payload));
  records_[key] = payload;
}

void Journal::remove() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(path_.c_str());
}

}  // namespace attnscale
