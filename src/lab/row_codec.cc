#include "lab/row_codec.h"

#include <cstdio>
#include <cstdlib>

#include "attnscale/error.h"

namespace attnscale::lab {
namespace {

// Length-prefixed strings ("<len>:<bytes>") survive any byte a flag value may hold.
void put_string(std::string& out, const std::string& s) { out += std::to_string(s.size()) + ":" + s; }

void put_double(std::string& out, double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%a;", x);  // exact: every bit of the double
  out += buf;
}

struct Reader {
  const std::string& t;
  std::size_t pos = 0;

  [[noreturn]] void bad() { throw Error("journal: malformed rows record at byte " + std::to_string(pos)); }
  std::size_t count(char end) {
    const std::size_t stop = t.find(end, pos);
    if (stop == std::string::npos || stop == pos || stop - pos > 12) bad();
    const std::size_t v = std::stoull(t.substr(pos, stop - pos));
    pos = stop + 1;
    return v;
  }
  std::string string() {
    const std::size_t n = count(':');
    if (n > t.size() - pos) bad();
    std::string s = t.substr(pos, n);
    pos += n;
    return s;
  }
  double number() {
    const std::size_t stop = t.find(';', pos);
    if (stop == std::string::npos) bad();
    const std::string text = t.substr(pos, stop - pos);
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0') bad();
    pos = stop + 1;
    return v;
  }
};

}  // namespace

std::string encode_rows(const std::vector<Row>& rows) {
  std::string out = std::to_string(rows.size()) + "\n";
  for (const auto& r : rows) {
    out += std::to_string(r.params.size()) + ";";
    for (const auto& p : r.params) put_string(out, p);
    put_string(out, r.metric);
    put_double(out, r.mean);
    put_double(out, r.ci_low);
    put_double(out, r.ci_high);
    out += r.theory ? "T" : "N";
    if (r.theory) put_double(out, *r.theory);
    out += "\n";
  }
  return out;
}

std::vector<Row> decode_rows(const std::string& text) {
  Reader in{text};
  const std::size_t n = in.count('\n');
  std::vector<Row> rows;
  for (std::size_t i = 0; i < n; ++i) {
    Row r;
    const std::size_t np = in.count(';');
    for (std::size_t k = 0; k < np; ++k) r.params.push_back(in.string());
    r.metric = in.string();
    r.mean = in.number();
    r.ci_low = in.number();
    r.ci_high = in.number();
    if (in.pos >= text.size()) in.bad();
    const char has = text[in.pos++];
    if (has == 'T') r.theory = in.number();
    else if (has != 'N') in.bad();
    if (in.pos >= text.size() || text[in.pos++] != '\n') in.bad();
    rows.push_back(std::move(r));
  }
  if (in.pos != text.size()) in.bad();
  return rows;
}

}  // namespace attnscale::lab
