// See templates.h.
#include "report/templates.h"

#include <fmt/format.h>

#include "attnscale/error.h"

namespace attnscale::report {
namespace {

bool truthy(const std::map<std::string, std::string>& slots, const std::string& name) {
  const auto it = slots.find(name);
  return it != slots.end() && !it->second.empty() && it->second != "false";
}

// Renders text[pos, end) and returns the output; `open` is the section being rendered (for errors).
std::string render_range(const std::string& text, std::size_t pos, std::size_t end,
                         const std::map<std::string, std::string>& slots, const std::string& where) {
  std::string out;
  while (pos < end) {
    const std::size_t a = text.find("{{", pos);
    if (a == std::string::npos || a >= end) {
      out.append(text, pos, end - pos);
      break;
    }
    out.append(text, pos, a - pos);
    const std::size_t b = text.find("}}", a + 2);
    if (b == std::string::npos || b >= end) throw Error(fmt::format("{}: unclosed {{{{ at offset {}", where, a));
    const std::string tag = text.substr(a + 2, b - a - 2);
    if (tag.empty()) throw Error(fmt::format("{}: empty {{{{}}}} at offset {}", where, a));
    if (tag[0] == '#' || tag[0] == '^') {
      // Find the matching {{/name}}, skipping nested sections of the same name.
      const std::string name = tag.substr(1), open1 = "{{#" + name + "}}", open2 = "{{^" + name + "}}",
                        close = "{{/" + name + "}}";
      std::size_t depth = 1, scan = b + 2, close_at = std::string::npos;
      while (depth > 0) {
        const std::size_t c = text.find(close, scan);
        if (c == std::string::npos || c >= end)
          throw Error(fmt::format("{}: {{{{{}}}}} has no {}", where, tag, close));
        std::size_t o = std::min(text.find(open1, scan), text.find(open2, scan));
        if (o < c) {
          ++depth;
          scan = o + open1.size();
        } else {
          --depth;
          close_at = c;
          scan = c + close.size();
        }
      }
      if (truthy(slots, name) == (tag[0] == '#')) out += render_range(text, b + 2, close_at, slots, where);
      pos = close_at + close.size();
    } else if (tag[0] == '/') {
      throw Error(fmt::format("{}: {{{{{}}}}} closes a section that is not open", where, tag));
    } else {
      const auto it = slots.find(tag);
      if (it == slots.end()) throw Error(fmt::format("{}: no value for slot {{{{{}}}}}", where, tag));
      out += it->second;
      pos = b + 2;
    }
  }
  return out;
}

}  // namespace

const std::string& template_text(const std::string& path) {
  const auto& all = embedded_templates();
  const auto it = all.find(path);
  if (it == all.end()) throw Error(fmt::format("report: no template {} (is it under src/ with a .md name?)", path));
  return it->second;
}

std::string render_template(const std::string& text, const std::map<std::string, std::string>& slots,
                            const std::string& where) {
  return render_range(text, 0, text.size(), slots, where);
}

}  // namespace attnscale::report
