// The report's pieces on tables built here: queries, verdicts computed from the numbers, the
// gnuplot pipeline, and the HTML/Markdown writers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "attnscale/error.h"
#include "report/claims.h"
#include "report/document.h"
#include "report/plot.h"
#include "report/query.h"

namespace attnscale::report {
namespace {

// A variance table shaped like the lab's: var for d × scaling, slopes, c_unit_var. `bias`
// multiplies the unscaled measurements (1: exactly the theory).
lab::ResultTable variance_table(double bias) {
  lab::ResultTable t;
  t.meta.experiment = "variance";
  t.meta.trials = 1000;
  t.param_names = {"d", "scaling", "dist"};
  for (int d : {256, 1, 64, 16, 4}) {  // out of order on purpose
    for (const char* s : {"none", "sqrt", "linear"}) {
      const double f = std::string(s) == "none" ? 1.0 : std::string(s) == "sqrt" ? 1.0 / d : 1.0 / (double(d) * d);
      const double th = d * f, m = (std::string(s) == "none" ? bias : 1.0) * th;
      t.rows.push_back({{std::to_string(d), s, "normal"}, "var", m, m * 0.95, m * 1.05, th});
    }
    const double c = 1 / std::sqrt(bias * d);
    t.rows.push_back({{std::to_string(d), "none", "normal"}, "c_unit_var", c, c * 0.98, c * 1.02, 1 / std::sqrt(d)});
  }
  t.rows.push_back({{"all", "none", "normal"}, "loglog_slope", bias == 1 ? 1.0 : 1.3, 0.99, bias == 1 ? 1.01 : 1.31, 1.0});
  t.rows.push_back({{"all", "sqrt", "normal"}, "loglog_slope", 0.0, -0.01, 0.01, 0.0});
  t.rows.push_back({{"all", "linear", "normal"}, "loglog_slope", -1.0, -1.01, -0.99, -1.0});
  return t;
}

TEST(ReportQuery, SeriesIsSortedAndSkipsNonNumericX) {
  const auto t = variance_table(1);
  const Series s = series(t, "d", "var", {{"scaling", "none"}, {"dist", "normal"}}, "unscaled");
  ASSERT_EQ(s.x.size(), 5u);
  EXPECT_EQ(s.x.front(), 1);
  EXPECT_EQ(s.x.back(), 256);
  EXPECT_DOUBLE_EQ(s.theory.back(), 256);
  EXPECT_EQ(one(t, "loglog_slope", {{"d", "all"}, {"scaling", "sqrt"}}).mean, 0.0);
  EXPECT_THROW(one(t, "var", {{"d", "3"}}), Error);
  EXPECT_THROW(select(t, "var", {{"nope", "1"}}), Error);
  EXPECT_EQ(values(t, "scaling"), (std::vector<std::string>{"none", "sqrt", "linear"}));
}

TEST(ReportClaims, VerdictsFollowTheNumbers) {
  Measurements m;
  m.tables["variance"] = variance_table(1);
  m.columns.n = 50;
  m.columns.d = 64;
  m.columns.output_rel_diff = {0.5, 0.45, 0.55};
  m.columns.causal_leak_colwise = {0.1, 0.08, 0.12};
  auto claims = evaluate_claims(m);
  auto find = [&](const std::string& part) {
    for (const auto& c : claims)
      if (c.claim.find(part) != std::string::npos) return c;
    ADD_FAILURE() << "no claim containing " << part;
    return Claim{};
  };
  EXPECT_EQ(find("Var(q·k) = d").css, "supported");
  EXPECT_EQ(find("standard deviation is equal").css, "refuted");
  EXPECT_EQ(find("each column").css, "refuted");
  EXPECT_EQ(find("empirically").css, "untestable");

  // The same claims on data that disagree with the theory flip their verdicts.
  m.tables["variance"] = variance_table(1.3);
  m.columns.output_rel_diff = {0, 0, 0};
  claims = evaluate_claims(m);
  EXPECT_EQ(find("Var(q·k) = d").css, "refuted");
  EXPECT_EQ(find("each column").css, "supported");
}

TEST(ReportDocument, InlineMarkupIsEscaped) {
  EXPECT_EQ(inline_html("a < b & *c* **d** `e` d_{k} 2^{x}"),
            "a &lt; b &amp; <em>c</em> <strong>d</strong> <code>e</code> d<sub>k</sub> 2<sup>x</sup>");
}

TEST(ReportPlot, RendersSvgAndPngAndInlinesWithUniqueIds) {
  Figure f{"unit_test_figure"};
  LinePanel& p = f.lines("Var", "d_{k}", "variance");
  p.logx = p.logy = true;
  p.series.push_back({"measured", {1, 4, 16}, {1.1, 3.9, 16.2}, {0.9, 3.5, 15}, {1.3, 4.3, 17}, {1, 4, 16}});
  HeatPanel& h = f.heat("P", "key", "query");
  h.rows = 3;
  h.cols = 4;
  h.values = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 0.0, 0.5};
  const std::string script = gnuplot_script(f, "svg", "x.svg");
  EXPECT_NE(script.find("$p0s0 << EOD"), std::string::npos);
  EXPECT_NE(script.find("filledcurves"), std::string::npos);
  EXPECT_NE(script.find("dt (6,4)"), std::string::npos);  // theory dashed
  EXPECT_NE(script.find("#440154"), std::string::npos);   // viridis

  const auto dir = std::filesystem::temp_directory_path() / "attnscale_report_unit";
  std::filesystem::remove_all(dir);
  const std::string svg = render(f, dir.string());
  EXPECT_TRUE(std::filesystem::file_size(dir / "unit_test_figure.png") > 1000);
  const std::string a = inline_svg(svg, "f1_"), b = inline_svg(svg, "f2_");
  EXPECT_EQ(a.rfind("<svg", 0), 0u);
  EXPECT_EQ(a.find("id='gp"), std::string::npos);
  EXPECT_NE(a.find("f1_"), std::string::npos);

  Document doc;
  doc.title = "T";
  doc.figure("unit_test_figure", svg, "caption with d_{k}");
  doc.table({"claim", "verdict"}, {{"x", "supported"}}, "claims", {"supported"});
  const std::string html = doc.html();
  EXPECT_NE(html.find("<figure id=\"fig-unit_test_figure\">\n<svg"), std::string::npos);
  EXPECT_NE(html.find("<b>Figure 1.</b> caption with d<sub>k</sub>"), std::string::npos);
  EXPECT_NE(html.find("<tr class=\"supported\">"), std::string::npos);
  EXPECT_NE(doc.markdown().find("![Figure 1](figures/unit_test_figure.svg)"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace attnscale::report
