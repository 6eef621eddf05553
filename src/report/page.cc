// The report's page: Markdown in, report.md and a self-contained index.html out. See page.h.
#include "report/page.h"

#include <cmark-gfm-core-extensions.h>
#include <cmark-gfm.h>
#include <fmt/format.h>

#include <cstdlib>
#include <memory>
#include <regex>
#include <sstream>

#include "attnscale/error.h"
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
pre code { background: none; padding: 0; font-size: 1em; }
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
.verdict { font-weight: 600; white-space: nowrap; }
.verdict.supported { color: #176b2c; }
.verdict.refuted { color: #b3261e; }
.verdict.mixed { color: #9a6700; }
.verdict.unmeasured { color: #555; font-weight: 400; }
blockquote { border: 1px solid var(--rule); background: #fafaf7; padding: .6rem .9rem; margin: .9rem 0;
             font-size: .93rem; }
blockquote p { margin: .3rem 0; }
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

const std::regex kFigureLine(R"(^!\[(.*)\]\(figure:([A-Za-z0-9_.-]+)\)[ \t]*$)");

// One piece of the page: Markdown text, or a figure with its number and caption.
struct Piece {
  std::string text;    // Markdown, or the figure's caption
  std::string figure;  // figure name; empty for text
  int number = 0;
};

// Splits the page at its figure lines and numbers the figures and tables ("**Table #.**").
std::vector<Piece> pieces(const std::string& markdown) {
  std::vector<Piece> out(1);
  std::istringstream in(sub_sup(markdown));
  std::string line;
  int figures = 0, tables = 0;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, kFigureLine)) {
      out.push_back({m[1].str(), m[2].str(), ++figures});
      out.emplace_back();
      continue;
    }
    for (std::size_t at = line.find("**Table #.**"); at != std::string::npos; at = line.find("**Table #.**"))
      line.replace(at, 12, fmt::format("**Table {}.**", ++tables));
    out.back().text += line + "\n";
  }
  return out;
}

}  // namespace

std::string sub_sup(const std::string& text) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  bool fenced = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) fenced = !fenced;
    if (!fenced) {
      line = std::regex_replace(line, std::regex(R"(_\{([^}]*)\})"), "<sub>$1</sub>");
      line = std::regex_replace(line, std::regex(R"(\^\{([^}]*)\})"), "<sup>$1</sup>");
    }
    out += line + "\n";
  }
  return out;
}

std::string markdown_to_html(const std::string& markdown) {
  cmark_gfm_core_extensions_ensure_registered();
  const int options = CMARK_OPT_UNSAFE;  // the templates' own <sub>, <span> pass through
  std::unique_ptr<cmark_parser, void (*)(cmark_parser*)> parser(cmark_parser_new(options), cmark_parser_free);
  if (!parser) throw Error("cmark-gfm: cannot create a parser");
  for (const char* name : {"table", "strikethrough", "autolink"})
    if (cmark_syntax_extension* ext = cmark_find_syntax_extension(name))
      cmark_parser_attach_syntax_extension(parser.get(), ext);
  cmark_parser_feed(parser.get(), markdown.data(), markdown.size());
  std::unique_ptr<cmark_node, void (*)(cmark_node*)> doc(cmark_parser_finish(parser.get()), cmark_node_free);
  char* html = cmark_render_html(doc.get(), options, cmark_parser_get_syntax_extensions(parser.get()));
  std::string out(html);
  std::free(html);
  return out;
}

std::string Page::markdown() const {
  std::string m = "# " + title + "\n\n";
  if (!subtitle.empty()) m += "*" + std::regex_replace(subtitle, std::regex("\n"), " · ") + "*\n\n";
  if (!abstract.empty()) m += "**Abstract.** " + abstract + "\n\n";
  for (const Piece& p : pieces(body)) {
    if (p.figure.empty()) m += p.text;
    else m += fmt::format("![Figure {0}](figures/{1}.svg)\n\n**Figure {0}.** {2}\n", p.number, p.figure, p.text);
  }
  return sub_sup(m);
}

std::string Page::html() const {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    << "<title>" << escape(title) << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n"
    << "<h1>" << escape(title) << "</h1>\n";
  if (!subtitle.empty())
    h << "<div class=\"subtitle\">" << std::regex_replace(escape(subtitle), std::regex("\n"), "<br>") << "</div>\n";
  if (!abstract.empty())
    h << "<div class=\"abstract\"><h2>Abstract</h2>\n" << markdown_to_html(sub_sup(abstract)) << "</div>\n";
  for (const Piece& p : pieces(body)) {
    if (p.figure.empty()) {
      h << markdown_to_html(p.text);
      continue;
    }
    const auto svg = figures.find(p.figure);
    if (svg == figures.end())
      throw Error(fmt::format("report: the text places figure '{}', which was not drawn", p.figure));
    // The caption is one paragraph: keep cmark's inline HTML without the <p> around it.
    std::string caption = markdown_to_html(p.text);
    caption = std::regex_replace(caption, std::regex(R"(^<p>|</p>\s*$)"), "");
    h << "<figure id=\"fig-" << escape(p.figure) << "\">\n" << inline_svg(svg->second, fmt::format("f{}_", p.number))
      << "\n<figcaption><b>Figure " << p.number << ".</b> " << caption << "</figcaption>\n</figure>\n";
  }
  h << "</body>\n</html>\n";
  return h.str();
}

}  // namespace attnscale::report
