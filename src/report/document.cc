// HTML and Markdown writers for the report. See document.h.
#include "report/document.h"

#include <regex>
#include <sstream>

#include "report/plot.h"

namespace attnscale::report {
namespace {

// A paper-like page: serif text in one column, figures full width, booktabs-style tables.
constexpr const char* kStyle = R"CSS(
:root { --ink: #1b1b1b; --muted: #5b5b5b; --rule: #d8d8d8; --accent: #0b5cad; }
html { background: #f4f3ef; }
body { font-family: Charter, "Bitstream Charter", "Source Serif Pro", Georgia, "DejaVu Serif", serif;
       font-size: 17px; line-height: 1.58; color: var(--ink); background: #fff; max-width: 56rem;
       margin: 1.5rem auto; padding: 2.5rem 3.2rem 3rem; box-shadow: 0 1px 6px rgba(0,0,0,.12); }
h1 { font-size: 2.05rem; line-height: 1.2; text-align: center; margin: .4rem 0 .3rem; font-weight: 600; }
.subtitle { text-align: center; color: var(--muted); margin-bottom: 1.6rem; font-size: .98rem; }
.abstract { margin: 0 2.2rem 2rem; font-size: .95rem; }
.abstract h2 { font-size: .95rem; text-align: center; text-transform: uppercase; letter-spacing: .08em;
               margin: 0 0 .4rem; border: 0; }
h2 { font-size: 1.42rem; margin: 2.4rem 0 .6rem; padding-bottom: .2rem; border-bottom: 1px solid var(--rule);
     font-weight: 600; }
h3 { font-size: 1.14rem; margin: 1.8rem 0 .4rem; font-weight: 600; }
p { margin: .55rem 0; text-align: justify; hyphens: auto; }
code, pre { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: .86em; }
code { background: #f3f3f3; padding: 0 .2em; border-radius: 3px; }
pre { background: #f7f7f5; border-left: 3px solid var(--accent); padding: .8rem 1rem; overflow-x: auto;
      line-height: 1.4; }
figure { margin: 1.4rem 0 1.8rem; }
figure svg { display: block; width: 100%; height: auto; }
figcaption { font-size: .9rem; color: #333; margin-top: .3rem; line-height: 1.45; }
figcaption b { color: var(--ink); }
table { border-collapse: collapse; width: 100%; margin: 1rem 0 .4rem; font-size: .84rem; line-height: 1.35;
        border-top: 2px solid var(--ink); border-bottom: 2px solid var(--ink); }
th { text-align: left; border-bottom: 1px solid var(--ink); padding: .35rem .45rem; font-weight: 600; }
td { padding: .32rem .45rem; vertical-align: top; border-bottom: 1px solid #eee; }
.tcaption { font-size: .9rem; color: #333; margin-bottom: 1.4rem; }
tr.supported td:last-child, tr.refuted td:last-child, tr.mixed td:last-child, tr.untestable td:last-child {
  font-weight: 600; white-space: nowrap; }
tr.supported td:last-child { color: #176b2c; }
tr.refuted td:last-child { color: #b3261e; }
tr.mixed td:last-child { color: #9a6700; }
tr.untestable td:last-child { color: #555; }
.note { border: 1px solid var(--rule); background: #fafaf7; padding: .6rem .9rem; margin: .9rem 0;
        font-size: .93rem; }
ul { margin: .4rem 0 .6rem 1.2rem; padding-left: .6rem; }
li { margin: .2rem 0; }
sub, sup { font-size: .72em; line-height: 0; }
a { color: var(--accent); }
@media (max-width: 700px) { body { padding: 1.2rem; } .abstract { margin: 0 0 1.5rem; } }
)CSS";

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// Markdown keeps the markup except sub/superscripts, which become inline HTML.
std::string inline_markdown(const std::string& text) {
  std::string s = std::regex_replace(text, std::regex(R"(_\{([^}]*)\})"), "<sub>$1</sub>");
  return std::regex_replace(s, std::regex(R"(\^\{([^}]*)\})"), "<sup>$1</sup>");
}

std::string md_cell(const std::string& text) {
  std::string s = inline_markdown(text);
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

}  // namespace

std::string inline_html(const std::string& text) {
  std::string s = escape(text);
  s = std::regex_replace(s, std::regex(R"(`([^`]*)`)"), "<code>$1</code>");
  s = std::regex_replace(s, std::regex(R"(\*\*([^*]+)\*\*)"), "<strong>$1</strong>");
  s = std::regex_replace(s, std::regex(R"(\*([^*\s][^*]*)\*)"), "<em>$1</em>");
  s = std::regex_replace(s, std::regex(R"(_\{([^}]*)\})"), "<sub>$1</sub>");
  s = std::regex_replace(s, std::regex(R"(\^\{([^}]*)\})"), "<sup>$1</sup>");
  return s;
}

void Document::heading(int level, const std::string& text, const std::string& id) {
  Block b;
  b.kind = Block::Kind::heading;
  b.level = level;
  b.text = text;
  b.id = id;
  blocks.push_back(std::move(b));
}

void Document::para(const std::string& text) {
  Block b;
  b.text = text;
  blocks.push_back(std::move(b));
}

void Document::note(const std::string& text) {
  Block b;
  b.kind = Block::Kind::note;
  b.text = text;
  blocks.push_back(std::move(b));
}

void Document::figure(const std::string& name, const std::string& svg, const std::string& caption) {
  Block b;
  b.kind = Block::Kind::figure;
  b.id = name;
  b.svg = svg;
  b.text = caption;
  blocks.push_back(std::move(b));
}

void Document::table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                     const std::string& caption, const std::vector<std::string>& row_class) {
  Block b;
  b.kind = Block::Kind::table;
  b.header = header;
  b.rows = rows;
  b.text = caption;
  b.row_class = row_class;
  blocks.push_back(std::move(b));
}

void Document::code(const std::string& text) {
  Block b;
  b.kind = Block::Kind::code;
  b.text = text;
  blocks.push_back(std::move(b));
}

void Document::bullets(const std::vector<std::string>& items) {
  Block b;
  b.kind = Block::Kind::bullets;
  for (const auto& i : items) b.rows.push_back({i});
  blocks.push_back(std::move(b));
}

std::string Document::html() const {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    << "<title>" << escape(title) << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n"
    << "<h1>" << inline_html(title) << "</h1>\n";
  if (!subtitle.empty())
    h << "<div class=\"subtitle\">" << std::regex_replace(inline_html(subtitle), std::regex("\n"), "<br>")
      << "</div>\n";
  if (!abstract.empty()) {
    h << "<div class=\"abstract\"><h2>Abstract</h2>\n";
    for (const auto& p : abstract) h << "<p>" << inline_html(p) << "</p>\n";
    h << "</div>\n";
  }
  int fig = 0, tab = 0;
  for (const Block& b : blocks) {
    switch (b.kind) {
      case Block::Kind::heading:
        h << "<h" << b.level << (b.id.empty() ? "" : " id=\"" + escape(b.id) + "\"") << ">" << inline_html(b.text)
          << "</h" << b.level << ">\n";
        break;
      case Block::Kind::para: h << "<p>" << inline_html(b.text) << "</p>\n"; break;
      case Block::Kind::note: h << "<div class=\"note\">" << inline_html(b.text) << "</div>\n"; break;
      case Block::Kind::code: h << "<pre>" << escape(b.text) << "</pre>\n"; break;
      case Block::Kind::bullets:
        h << "<ul>\n";
        for (const auto& r : b.rows) h << "<li>" << inline_html(r[0]) << "</li>\n";
        h << "</ul>\n";
        break;
      case Block::Kind::figure:
        ++fig;
        h << "<figure id=\"fig-" << escape(b.id) << "\">\n"
          << inline_svg(b.svg, "f" + std::to_string(fig) + "_") << "\n<figcaption><b>Figure " << fig
          << ".</b> " << inline_html(b.text) << "</figcaption>\n</figure>\n";
        break;
      case Block::Kind::table:
        ++tab;
        h << "<table>\n<thead><tr>";
        for (const auto& c : b.header) h << "<th>" << inline_html(c) << "</th>";
        h << "</tr></thead>\n<tbody>\n";
        for (std::size_t r = 0; r < b.rows.size(); ++r) {
          const std::string cls = r < b.row_class.size() ? b.row_class[r] : "";
          h << "<tr" << (cls.empty() ? "" : " class=\"" + escape(cls) + "\"") << ">";
          for (const auto& c : b.rows[r]) h << "<td>" << inline_html(c) << "</td>";
          h << "</tr>\n";
        }
        h << "</tbody>\n</table>\n<div class=\"tcaption\"><b>Table " << tab << ".</b> " << inline_html(b.text)
          << "</div>\n";
        break;
    }
  }
  h << "</body>\n</html>\n";
  return h.str();
}

std::string Document::markdown() const {
  std::ostringstream m;
  m << "# " << inline_markdown(title) << "\n\n";
  if (!subtitle.empty()) m << "*" << std::regex_replace(inline_markdown(subtitle), std::regex("\n"), " · ") << "*\n\n";
  if (!abstract.empty()) {
    m << "**Abstract.** ";
    for (const auto& p : abstract) m << inline_markdown(p) << "\n\n";
  }
  int fig = 0, tab = 0;
  for (const Block& b : blocks) {
    switch (b.kind) {
      case Block::Kind::heading:
        m << std::string(static_cast<std::size_t>(b.level), '#') << " " << inline_markdown(b.text) << "\n\n";
        break;
      case Block::Kind::para: m << inline_markdown(b.text) << "\n\n"; break;
      case Block::Kind::note: m << "> " << inline_markdown(b.text) << "\n\n"; break;
      case Block::Kind::code: m << "```\n" << b.text << (b.text.ends_with("\n") ? "" : "\n") << "```\n\n"; break;
      case Block::Kind::bullets:
        for (const auto& r : b.rows) m << "- " << inline_markdown(r[0]) << "\n";
        m << "\n";
        break;
      case Block::Kind::figure:
        ++fig;
        m << "![Figure " << fig << "](figures/" << b.id << ".svg)\n\n**Figure " << fig << ".** "
          << inline_markdown(b.text) << "\n\n";
        break;
      case Block::Kind::table:
        ++tab;
        m << "|";
        for (const auto& c : b.header) m << " " << md_cell(c) << " |";
        m << "\n|";
        for (std::size_t i = 0; i < b.header.size(); ++i) m << "---|";
        m << "\n";
        for (const auto& r : b.rows) {
          m << "|";
          for (const auto& c : r) m << " " << md_cell(c) << " |";
          m << "\n";
        }
        m << "\n**Table " << tab << ".** " << inline_markdown(b.text) << "\n\n";
        break;
    }
  }
  return m.str();
}

}  // namespace attnscale::report
