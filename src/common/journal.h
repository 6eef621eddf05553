// Journal: an append-only file of completed work, so that a long run killed at any moment can
// resume where it stopped.
//
// Each record is durable once append() returns (write, then fsync). A kill during an append can
// leave at most one torn record at the end; it is recognised (length and checksum) and cut off
// when the journal is opened again. A record damaged elsewhere (a garbled byte) is skipped and
// counted (damaged()); every intact record, before or after it, is kept, and the journal is
// rewritten without the damaged ones (a temporary renamed onto it), so a later resume does not
// meet them again. A journal starts with a header naming the run (for the lab: experiment, seed,
// trials, every flag); resuming with a different header is an Error, so the work of one run is
// never mixed into another.
//
//   Journal j = Journal::open("out.csv.partial", "saturation seed=1 ...", /*resume=*/true);
//   if (!j.records().count(7)) j.append(7, rows_as_text);
//   ... write the final file atomically, then j.remove();
//
// File layout (text framing, binary-safe payloads):
//   "attnscale-journal 2\n" "H <len> <fnv64>\n" <header> "\n"   then per record
//   "R <key> <len> <fnv64>\n" <payload> "\n"
// A header's checksum covers its text; a record's covers "<key> <payload>" (the key in decimal),
// so a garbled key is damage, not another record. Version 1 journals (their records' checksums
// cover the payload alone) are still resumed: opening one rewrites it as version 2.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace attnscale {

class Journal {
 public:
  // Opens `path`. With `resume`, an existing journal's intact records are kept (its header must
  // equal `header`); without, or when there is no file, a new journal is started. A new journal
  // whose header cannot be written (a full disk) is removed again before the Error is thrown.
  static Journal open(const std::string& path, const std::string& header, bool resume);

  Journal(Journal&& other) noexcept;
  Journal& operator=(Journal&&) = delete;
  ~Journal();

  // Completed records by key (the last one wins if a key was appended twice).
  const std::map<std::int64_t, std::string>& records() const { return records_; }
  // Records recovered from the file when it was opened (the rest were appended since).
  std::size_t recovered() const { return recovered_; }
  // Records found damaged when the file was opened and skipped (not counting a torn last record,
  // which a kill leaves): their keys are missing from records(), and the file no longer holds
  // them.
  std::size_t damaged() const { return damaged_; }

  // Appends and fsyncs one record. Throws Error if the write fails.
  void append(std::int64_t key, const std::string& payload);

  // Closes and deletes the file (after the final result is safely in place).
  void remove();

  const std::string& path() const { return path_; }

 private:
  Journal(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  void write_all(const std::string& bytes);
  // Replaces the file by the header and records() (atomically), and appends from there.
  void rewrite(const std::string& header);

  std::string path_;
  int fd_ = -1;
  std::map<std::int64_t, std::string> records_;
  std::size_t recovered_ = 0;
  std::size_t damaged_ = 0;
};

// 64-bit FNV-1a of `bytes` (the record checksum; a torn or garbled record fails it), continuing
// from `h` (the hash of the bytes before them; by default none).
inline constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ull;
std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t h = kFnvOffset);

}  // namespace attnscale
