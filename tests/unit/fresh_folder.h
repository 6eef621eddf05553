#pragma once
// A fresh, empty folder of a test's own under the system's temporary folder, named by the test
// file (`owner`), the process and `name`, so that tests running side by side never share one.
#include <unistd.h>

#include <filesystem>
#include <string>

namespace attnscale::testing {

inline std::filesystem::path fresh_folder(const std::string& owner, const std::string& name) {
  const std::filesystem::path p =
      std::filesystem::temp_directory_path() / ("attnscale_" + owner + "_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace attnscale::testing
