// Giving a path new contents so that a failure never damages what the path held.
//
// The path is followed through symbolic links to the file it names: the link stays, its target
// gets the contents (as `cat > link` would). A regular or missing target gets a temporary file
// beside it (same directory, so rename(2) is atomic), written, synced and closed when the
// OutputFile is made, and renamed onto the target by place(): until then the old file is
// untouched, and a failure leaves no temporary behind. An existing device, FIFO or socket cannot
// be renamed over (that would replace the node by a regular file), so place() writes it in place,
// checking every write and the close. A directory, a missing parent directory or a loop of links
// is an Error naming the path as given.
//
// Several outputs of one command are made first (all temporaries written), then placed:
//   OutputFile out("o.npy", bytes), lse("lse.npy", more);  // a failure here changes no file
//   out.place(); lse.place();
#pragma once
#include <string>

namespace attnscale::detail {

// Where writing `path` puts the bytes.
struct OutputTarget {
  std::string path;        // `path` with every symbolic link followed
  bool exists = false;     // something is there now
  bool in_place = false;   // an existing device, FIFO or socket: written in place, never replaced
};

// Follows `path`'s links and checks that the result can be written: not a directory, its parent
// an existing directory this process may write in (an existing non-regular file: writable).
// Throws Error("<path>: ...") otherwise. Nothing is created.
OutputTarget output_target(const std::string& path);

class OutputFile {
 public:
  // Checks the path (output_target) and, unless the target is written in place, writes `bytes`
  // to a temporary file next to the target.
  OutputFile(const std::string& path, std::string bytes);
  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&&) = delete;
  ~OutputFile();  // removes a temporary that was not placed

  bool in_place() const { return target_.in_place; }
  bool replaces_a_file() const { return target_.exists && !target_.in_place; }
  const std::string& path() const { return path_; }

  // Renames the temporary onto the target, or writes an in-place target now. Throws Error.
  void place();
  // Removes the file place() put at a target that did not exist before (a command undoing its
  // outputs); a replaced file or an in-place target is left as it is.
  void remove_if_new();

 private:
  std::string path_;  // as given, for messages
  OutputTarget target_;
  std::string tmp_;    // the temporary, until placed
  std::string bytes_;  // in-place targets only: written by place()
  bool placed_ = false;
};

}  // namespace attnscale::detail
