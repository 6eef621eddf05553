// The report as a list of blocks, written out twice: as one self-contained HTML page (figures
// inlined as SVG, styles embedded, nothing fetched) and as Markdown (figures linked).
//
// Text uses a small inline markup, the same in every block:
//   *em*  **strong**  `code`  _{sub}  ^{sup}
// Everything else is literal (HTML special characters are escaped).
//
// Example:
//   Document doc;
//   doc.title = "The scaling factor in self-attention";
//   doc.heading(2, "3 Experiments", "experiments");
//   doc.para("Var(q·k) grows as d_{k}.");
//   doc.figure("variance", svg_text, "Var(q·k) against d.");
//   write_file("index.html", doc.html());
#pragma once
#include <string>
#include <vector>

namespace attnscale::report {

struct Block {
  enum class Kind { heading, para, note, figure, table, code, bullets };
  Kind kind = Kind::para;
  int level = 2;                                  // heading
  std::string id;                                 // heading anchor; figure file stem
  std::string text;                               // heading, para, note, code; figure caption; table caption
  std::string svg;                                // figure
  std::vector<std::string> header;                // table
  std::vector<std::vector<std::string>> rows;     // table; bullets use rows[i][0]
  std::vector<std::string> row_class;             // table: CSS class per row (e.g. verdict)
};

struct Document {
  std::string title, subtitle;
  std::vector<std::string> abstract;  // paragraphs
  std::vector<Block> blocks;

  void heading(int level, const std::string& text, const std::string& id = "");
  void para(const std::string& text);
  void note(const std::string& text);  // a boxed aside (e.g. what a claim's evidence cannot show)
  // Figures are numbered in order; the caption is prefixed with "Figure N." in both outputs.
  void figure(const std::string& name, const std::string& svg, const std::string& caption);
  void table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
             const std::string& caption, const std::vector<std::string>& row_class = {});
  void code(const std::string& text);
  void bullets(const std::vector<std::string>& items);

  std::string html() const;
  std::string markdown() const;  // figures linked as figures/<name>.svg
};

// The inline markup rendered to HTML (escaped) — exposed for tests.
std::string inline_html(const std::string& text);

}  // namespace attnscale::report
