// See query.h.
#include "report/query.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include <fmt/format.h>

#include "attnscale/error.h"

namespace attnscale::report {
namespace {

std::size_t column(const lab::ResultTable& t, const std::string& name) {
  const auto it = std::find(t.param_names.begin(), t.param_names.end(), name);
  if (it == t.param_names.end())
    throw Error(fmt::format("report: experiment {} has no parameter '{}'", t.meta.experiment, name));
  return static_cast<std::size_t>(it - t.param_names.begin());
}

std::string describe(const std::string& metric, const Fixed& fixed) {
  std::string s = metric;
  for (const auto& [k, v] : fixed) s += " " + k + "=" + v;
  return s;
}

}  // namespace

std::vector<const lab::Row*> select(const lab::ResultTable& t, const std::string& metric, const Fixed& fixed) {
  std::vector<std::pair<std::size_t, std::string>> want;
  for (const auto& [k, v] : fixed) want.emplace_back(column(t, k), v);
  std::vector<const lab::Row*> out;
  for (const lab::Row& r : t.rows) {
    if (r.metric != metric) continue;
    bool ok = true;
    for (const auto& [c, v] : want) ok = ok && c < r.params.size() && r.params[c] == v;
    if (ok) out.push_back(&r);
  }
  return out;
}

const lab::Row& one(const lab::ResultTable& t, const std::string& metric, const Fixed& fixed) {
  const auto rows = select(t, metric, fixed);
  if (rows.empty())
    throw Error(fmt::format("report: experiment {} has no row {}", t.meta.experiment, describe(metric, fixed)));
  return *rows.front();
}

Series series(const lab::ResultTable& t, const std::string& x, const std::string& metric, const Fixed& fixed,
              const std::string& title) {
  const std::size_t cx = column(t, x);
  std::vector<std::pair<double, const lab::Row*>> pts;
  for (const lab::Row* r : select(t, metric, fixed)) {
    char* end = nullptr;
    const double v = std::strtod(r->params[cx].c_str(), &end);
    if (end != r->params[cx].c_str() && *end == '\0') pts.emplace_back(v, r);
  }
  if (pts.empty())
    throw Error(fmt::format("report: experiment {} has no rows {} against {}", t.meta.experiment,
                            describe(metric, fixed), x));
  std::stable_sort(pts.begin(), pts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  Series s;
  s.title = title;
  for (const auto& [v, r] : pts) {
    s.x.push_back(v);
    s.y.push_back(r->mean);
    s.lo.push_back(r->ci_low);
    s.hi.push_back(r->ci_high);
    s.theory.push_back(r->theory ? *r->theory : std::nan(""));
  }
  return s;
}

const std::string& param(const lab::ResultTable& t, const lab::Row& r, const std::string& name) {
  return r.params.at(column(t, name));
}

std::vector<std::string> values(const lab::ResultTable& t, const std::string& name) {
  const std::size_t c = column(t, name);
  std::vector<std::string> out;
  for (const lab::Row& r : t.rows)
    if (std::find(out.begin(), out.end(), r.params[c]) == out.end()) out.push_back(r.params[c]);
  return out;
}

bool is_number(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end != s.c_str() && *end == '\0';
}

std::string largest_value(const lab::ResultTable& t, const std::string& name) {
  std::string best;
  for (const auto& v : values(t, name))
    if (is_number(v) && (best.empty() || std::stod(v) > std::stod(best))) best = v;
  return best;
}

std::string smallest_value(const lab::ResultTable& t, const std::string& name) {
  std::string best;
  for (const auto& v : values(t, name))
    if (is_number(v) && (best.empty() || std::stod(v) < std::stod(best))) best = v;
  return best;
}

const std::string& flag(const lab::ResultTable& t, const std::string& name) {
  for (const auto& [k, v] : t.meta.flags)
    if (k == name) return v;
  throw Error(fmt::format("report: experiment {} was run without a flag --{}", t.meta.experiment, name));
}

bool covers(const lab::Row& r, double v) { return r.ci_low <= v && v <= r.ci_high; }

std::string change(const lab::Row& from, const lab::Row& to) {
  if (to.ci_high < from.ci_low) return "falls";
  if (to.ci_low > from.ci_high) return "rises";
  return "level";
}

std::map<std::string, std::string> change_slots(const std::string& name, const lab::Row& from, const lab::Row& to) {
  const std::string moved = change(from, to);
  std::map<std::string, std::string> s;
  for (const char* c : {"falls", "rises", "level"}) s[name + "_" + c] = moved == c ? "true" : "";
  return s;
}

std::string scaling_title(const std::string& s) {
  if (s == "none") return "unscaled";
  if (s == "sqrt") return "1/√d";
  if (s == "linear") return "1/d";
  if (s == "qk-norm") return "QK-LayerNorm";
  if (s == "log-n") return "√(ln N)/√d";
  return s;
}

std::string md_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  auto line = [](const std::vector<std::string>& cells) {
    std::string out = "|";
    for (const auto& c : cells) {
      out += " ";
      for (char ch : c) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
      out += " |";
    }
    return out + "\n";
  };
  std::string out = line(header) + "|";
  for (std::size_t i = 0; i < header.size(); ++i) out += "---|";
  out += "\n";
  for (const auto& r : rows) out += line(r);
  return out;
}

std::string fmt(double v, int digits) {
  if (std::isnan(v)) return "n/a";
  if (std::isinf(v)) return v > 0 ? "∞" : "−∞";
  if (v == 0) v = 0;  // −0.0 reads as 0, not "−0"
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  std::string s = buf;
  // Exponents as ×10^{n} for the page, a negative one with the same minus sign as the numbers.
  const auto e = s.find('e');
  if (e != std::string::npos) {
    const int ex = std::stoi(s.substr(e + 1));
    s = s.substr(0, e) + "×10^{" + (ex < 0 ? "−" : "") + std::to_string(std::abs(ex)) + "}";
  }
  if (!s.empty() && s[0] == '-') s = "−" + s.substr(1);
  return s;
}

std::string fmt_ci(const lab::Summary& s, int digits) {
  // No interval (too few values, or all the same with no bound to reach from): said, not "[n/a, n/a]".
  if (std::isnan(s.ci_low) || std::isnan(s.ci_high))
    return std::isnan(s.mean) ? fmt(s.mean, digits) : fmt(s.mean, digits) + " (no interval)";
  // An interval of some width never reads as zero-width: more digits until its ends differ.
  while (s.ci_low < s.ci_high && digits < 6 && fmt(s.ci_low, digits) == fmt(s.ci_high, digits)) ++digits;
  return fmt(s.mean, digits) + " [" + fmt(s.ci_low, digits) + ", " + fmt(s.ci_high, digits) + "]";
}

std::string fmt_ci(const lab::Row& r, int digits) { return fmt_ci(lab::Summary{r.mean, r.ci_low, r.ci_high}, digits); }

}  // namespace attnscale::report
