// The report as one Markdown text, written out twice: as report.md (figures linked as
// figures/<name>.svg) and as one self-contained HTML page (figures inlined as SVG, styles embedded,
// nothing fetched), the Markdown rendered by cmark-gfm (GitHub's CommonMark, with tables).
//
// Beyond CommonMark the text may hold:
//   ![caption](figure:NAME)   on a line of its own: figure NAME, numbered in order ("Figure 3.")
//   **Table #.**              numbered in order ("**Table 2.**")
//   d_{k}, x^{2}              sub- and superscripts (written out as <sub>, <sup>)
//
// Example:
//   Page page;
//   page.title = "The scaling factor in self-attention";
//   page.body = "## 3 Experiments\n\nVar(q·k) grows as d_{k}.\n\n![Var(q·k) against d.](figure:variance)\n";
//   page.figures["variance"] = svg_text;
//   write_file("index.html", page.html());
#pragma once
#include <map>
#include <string>

namespace attnscale::report {

struct Page {
  std::string title, subtitle;               // plain text; the subtitle may hold line breaks
  std::string abstract;                      // Markdown
  std::string body;                          // Markdown
  std::map<std::string, std::string> figures;  // figure name → SVG text (HTML only)

  std::string html() const;
  std::string markdown() const;
};

// CommonMark + GitHub tables to HTML (cmark-gfm; raw HTML kept).
std::string markdown_to_html(const std::string& markdown);

// _{x} and ^{x} as <sub>x</sub> and <sup>x</sup>, outside fenced code blocks.
std::string sub_sup(const std::string& text);

}  // namespace attnscale::report
