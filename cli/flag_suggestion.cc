#include "flag_suggestion.h"

#include <algorithm>
#include <vector>

namespace attnscale::cli {
namespace {

// Optimal string alignment distance: Levenshtein plus the swap of two neighbours, by dynamic
// programming over d[i][j] = distance between a[0, i) and b[0, j).
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::string closest_flag(const CLI::App& app, const std::string& given) {
  const std::string name = given.substr(given.find_first_not_of('-') == std::string::npos
                                            ? given.size()
                                            : given.find_first_not_of('-'));
  std::string best;
  std::size_t best_distance = std::min<std::size_t>(2, std::max<std::size_t>(1, name.size() / 3)) + 1;
  for (const CLI::Option* option : app.get_options())
    for (const std::string& candidate : option->get_lnames()) {
      const std::size_t d = edit_distance(name, candidate);
      if (d < best_distance) {
        best_distance = d;
        best = "--" + candidate;
      }
    }
  return best;
}

}  // namespace attnscale::cli
