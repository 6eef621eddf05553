// The report's prose: Markdown templates with named slots, kept as files (src/report/templates/*.md
// and each unit's src/lab/experiments/<name>/section.md) and compiled into the library
// (report/embed.cmake), so the binary needs nothing at run time.
//
// Template syntax (a small subset of Mustache):
//   {{name}}                 the slot's value; a slot the template names but no one filled is an Error
//   {{#name}} ... {{/name}}  kept when the slot is set and neither "" nor "false", else dropped
//   {{^name}} ... {{/name}}  the opposite: kept when the slot is unset, "" or "false"
//   ![caption](figure:NAME)  on a line of its own: figure NAME of the unit, with this caption
// Sections may nest. Words that the data must choose ("holds", "fails") are slots or sections,
// never fixed text.
//
// Example:
//   render_template("The slope is {{slope}}{{#fits}}, as predicted{{/fits}}.", {{"slope", "1.00"}, {"fits", "true"}}, "t")
//     == "The slope is 1.00, as predicted."
#pragma once
#include <map>
#include <string>

namespace attnscale::report {

// Every embedded template by its path under src/, e.g. "report/templates/abstract.md" or
// "lab/experiments/variance/section.md". Defined in the generated report_templates.cc.
const std::map<std::string, std::string>& embedded_templates();

// The embedded template at `path`; Error naming it when there is none.
const std::string& template_text(const std::string& path);

// Fills the slots of `text`; `where` names the template in errors ("report/templates/abstract.md:
// no value for slot {{slope}}").
std::string render_template(const std::string& text, const std::map<std::string, std::string>& slots,
                            const std::string& where);

}  // namespace attnscale::report
