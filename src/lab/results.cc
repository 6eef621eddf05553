#include "lab/results.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "attnscale/error.h"

namespace attnscale::lab {
namespace {

std::string number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

nlohmann::ordered_json json_number(double v) {
  if (!std::isfinite(v)) return nullptr;  // JSON has no NaN or infinity
  return v;
}

}  // namespace

std::string to_csv(const ResultTable& table) {
  std::string s;
  for (const auto& p : table.param_names) s += p + ",";
  s += "metric,mean,ci_low,ci_high,theory\n";
  for (const auto& r : table.rows) {
    for (const auto& p : r.params) s += p + ",";
    s += r.metric + "," + number(r.mean) + "," + number(r.ci_low) + "," + number(r.ci_high) + ",";
    if (r.theory) s += number(*r.theory);
    s += "\n";
  }
  return s;
}

std::string to_json(const ResultTable& table) {
  using json = nlohmann::ordered_json;
  const Metadata& m = table.meta;
  json flags = json::object();
  for (const auto& [k, v] : m.flags) flags[k] = v;
  json meta = {{"experiment", m.experiment}, {"seed", m.seed},          {"trials", m.trials},
               {"threads", m.threads},       {"version", m.version},    {"git_hash", m.git_hash},
               {"cpu_target", m.cpu_target}, {"seconds", m.seconds},    {"flags", flags}};
  json rows = json::array();
  for (const auto& r : table.rows) {
    json row = json::object();
    for (std::size_t i = 0; i < table.param_names.size() && i < r.params.size(); ++i)
      row[table.param_names[i]] = r.params[i];
    row["metric"] = r.metric;
    row["mean"] = json_number(r.mean);
    row["ci_low"] = json_number(r.ci_low);
    row["ci_high"] = json_number(r.ci_high);
    row["theory"] = r.theory ? json_number(*r.theory) : json(nullptr);
    rows.push_back(std::move(row));
  }
  json doc = {{"metadata", meta}, {"param_names", table.param_names}, {"rows", rows}};
  return doc.dump(1) + "\n";
}

ResultTable from_json(const std::string& text, const std::string& where) {
  using json = nlohmann::ordered_json;  // the flags keep their order
  const auto num = [](const json& v) { return v.is_null() ? std::nan("") : v.get<double>(); };
  try {
    const json doc = json::parse(text);
    ResultTable t;
    const json& m = doc.at("metadata");
    t.meta.experiment = m.at("experiment").get<std::string>();
    t.meta.seed = m.at("seed").get<std::uint64_t>();
    t.meta.trials = m.at("trials").get<std::int64_t>();
    t.meta.threads = m.at("threads").get<int>();
    t.meta.version = m.at("version").get<std::string>();
    t.meta.git_hash = m.at("git_hash").get<std::string>();
    t.meta.cpu_target = m.at("cpu_target").get<std::string>();
    t.meta.seconds = num(m.at("seconds"));
    for (const auto& [k, v] : m.at("flags").items()) t.meta.flags.emplace_back(k, v.get<std::string>());
    t.param_names = doc.at("param_names").get<std::vector<std::string>>();
    for (const json& r : doc.at("rows")) {
      Row row;
      for (const auto& p : t.param_names) row.params.push_back(r.at(p).get<std::string>());
      row.metric = r.at("metric").get<std::string>();
      row.mean = num(r.at("mean"));
      row.ci_low = num(r.at("ci_low"));
      row.ci_high = num(r.at("ci_high"));
      if (!r.at("theory").is_null()) row.theory = r.at("theory").get<double>();
      t.rows.push_back(std::move(row));
    }
    return t;
  } catch (const json::exception& e) {
    throw Error(where + ": not a result table of the lab (" + e.what() + ")");
  }
}

}  // namespace attnscale::lab
