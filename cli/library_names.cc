#include "library_names.h"

#include <algorithm>
#include <map>
#include <string_view>

namespace attnscale::cli {
namespace {

const std::map<std::string_view, std::string_view>& flags() {
  static const std::map<std::string_view, std::string_view> table{
      {"q", "--q"},
      {"k", "--k"},
      {"v", "--v"},
      {"out", "--out"},
      {"lse", "--lse"},
      {"probs", "--probs"},
      {"mask", "--mask"},
      {"scale", "--scale"},
      {"window", "--window"},
      {"threads", "--threads"},
      {"softcap", "--softcap"},
      {"dropout", "--dropout"},
      {"alibi_slopes", "--alibi-slopes"},
      {"sinks", "--sinks"},
      {"cu_seqlens_q", "--cu-seqlens-q"},
      {"cu_seqlens_k", "--cu-seqlens-k"},
  };
  return table;
}

}  // namespace

std::string with_flag_names(const std::string& message) {
  const std::size_t colon = message.find(':');
  if (colon == std::string::npos) return message;
  std::string names;
  for (std::size_t at = 0; at < colon;) {
    const std::size_t comma = std::min(message.find(", ", at), colon);
    const auto found = flags().find(std::string_view(message).substr(at, comma - at));
    if (found == flags().end()) return message;
    names += (names.empty() ? "" : ", ") + std::string(found->second);
    at = comma == colon ? colon : comma + 2;
  }
  return names + message.substr(colon);
}

}  // namespace attnscale::cli
