#include "lab/experiments/training/fortunes_corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "attnscale/error.h"

namespace attnscale::lab::training {
namespace {

Corpus load(const std::string& folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> files;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file() && !it->is_symlink() && !it->path().has_extension()) files.push_back(it->path());
  if (ec) throw Error("--corpus: cannot read the folder '" + folder + "': " + ec.message());
  std::sort(files.begin(), files.end());
  Corpus c;
  for (const auto& path : files) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream text;
    text << f.rdbuf();
    std::istringstream lines(text.str());
    std::string line, fortune;
    auto flush = [&] {
      if (fortune.empty()) return;
      (c.fortunes % 10 == 9 ? c.validation : c.train) += fortune + "%\n";
      ++c.fortunes;
      fortune.clear();
    };
    while (std::getline(lines, line)) {
      if (line == "%") flush();
      else fortune += line + "\n";
    }
    flush();
  }
  if (c.fortunes < 10) throw Error("--corpus: no fortune files in '" + folder + "' (Debian package fortunes)");
  return c;
}

}  // namespace

const Corpus& fortunes_corpus(const std::string& folder) {
  static std::mutex mutex;
  static std::map<std::string, Corpus> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded.find(folder);
  if (it == loaded.end()) it = loaded.emplace(folder, load(folder)).first;
  return it->second;
}

}  // namespace attnscale::lab::training
