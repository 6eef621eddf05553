// parse_align(): the names of the mask's diagonal alignments, read once for every front end.
#include <string>

#include "attnscale/attention.h"
#include "attnscale/error.h"

namespace attnscale {

Align parse_align(std::string_view text, std::string_view arg) {
  if (text == "top-left") return Align::top_left;
  if (text == "bottom-right") return Align::bottom_right;
  throw Error(std::string(arg) + ": expected 'top-left' or 'bottom-right', got '" + std::string(text) + "'");
}

}  // namespace attnscale
