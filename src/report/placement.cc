// The report's files put in place all or none. See placement.h.
#include "report/placement.h"

#include <fmt/format.h>

#include "attnscale/error.h"

namespace attnscale::report {
namespace fs = std::filesystem;
namespace {

// One step of the placing and what undoes it: a rename from → to (undone by to → from), or a
// folder created at `to` (from empty; undone by removing it while still empty).
struct Step {
  fs::path from, to;
};

class Placing {
 public:
  // Creates the missing folders of dir/rel's parent, outermost first; false with `ec` on failure.
  bool make_parents(const fs::path& dir, const fs::path& rel, std::error_code& ec) {
    fs::path folder = dir;
    for (const fs::path& part : rel.parent_path()) {
      folder /= part;
      if (fs::create_directory(folder, ec)) steps_.push_back({{}, folder});
      if (ec) return false;
    }
    return true;
  }
  bool move(const fs::path& from, const fs::path& to, std::error_code& ec) {
    fs::rename(from, to, ec);
    if (!ec) steps_.push_back({from, to});
    return !ec;
  }
  void undo() noexcept {
    std::error_code ignored;
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) {
      if (it->from.empty())
        fs::remove(it->to, ignored);  // rmdir: only while empty
      else
        fs::rename(it->to, it->from, ignored);
    }
    steps_.clear();
  }

 private:
  std::vector<Step> steps_;
};

}  // namespace

void place_files(const fs::path& staging, const fs::path& dir, const std::vector<fs::path>& files) {
  const fs::path aside = staging / ".replaced";
  Placing placing;
  for (const fs::path& f : files) {
    const fs::path target = dir / f;
    std::error_code ec;
    auto place = [&] {
      if (!placing.make_parents(dir, f, ec)) return false;
      std::error_code absent;
      const fs::file_status old = fs::symlink_status(target, absent);
      if (fs::exists(old) && !fs::is_directory(old)) {  // an earlier file at the path: aside first
        fs::create_directories((aside / f).parent_path(), ec);
        if (ec || !placing.move(target, aside / f, ec)) return false;
      }
      return placing.move(staging / f, target, ec);
    };
    if (!place()) {
      placing.undo();
      throw Error(fmt::format("{}: {}", target.string(), ec.message()));
    }
  }
}

}  // namespace attnscale::report
