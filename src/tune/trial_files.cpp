// Ray Tune's per-trial files (trial_files.h): params.json, result.json, progress.csv.
#include "tune/trial_files.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dtrain/error.h"
#include "dtrain/mlflow.h"

namespace fs = std::filesystem;

namespace dtrain::tune::detail {

namespace {

std::string python_number(const Config& v) {
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
    return mlflow::param_value(d);  // Python's repr of a float, as json.dumps writes it
  }
  return v.dump();
}

}  // namespace

Config flatten(const Config& value) {
  if (!value.is_object()) return value;
  // Ray's loop, pass by pass: a nested object's key is removed and its children appended
  // as "key/child" (an empty object just goes); repeated while any value is an object.
  Config out = value;
  for (;;) {
    Config next = Config::object(), added = Config::object();
    bool nested = false;
    for (auto it = out.begin(); it != out.end(); ++it) {
      if (!it.value().is_object()) {
        next[it.key()] = it.value();
        continue;
      }
      nested = true;
      for (auto c = it.value().begin(); c != it.value().end(); ++c)
        added[it.key() + "/" + c.key()] = c.value();
    }
    if (!nested) return out;
    for (auto it = added.begin(); it != added.end(); ++it) next[it.key()] = it.value();
    out = std::move(next);
  }
}

std::string python_json(const Config& v) {
  if (v.is_object()) {
    std::string s = "{";
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it != v.begin()) s += ", ";
      s += Config(it.key()).dump(-1, ' ', true) + ": " + python_json(it.value());
    }
    return s + "}";
  }
  if (v.is_array()) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + python_json(v[i]);
    return s + "]";
  }
  if (v.is_number()) return python_number(v);
  if (v.is_null()) return "null";
  return v.dump(-1, ' ', true);  // ensure_ascii, as json.dumps
}

std::string csv_quote(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) {
    if (c == '"') o += '"';
    o += c;
  }
  return o + "\"";
}

std::string csv_field(const Config& v) {
  if (v.is_null()) return "";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_string()) return csv_quote(v.get<std::string>());
  if (v.is_number()) return python_number(v);
  return csv_quote(python_json(v));
}

std::vector<std::string> csv_split(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        out.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else if (c != '\r' && c != '\n') {
      out.back() += c;
    }
  }
  return out;
}

void write_params(const std::string& trial_dir, const Config& config) {
  const fs::path path = fs::path(trial_dir) / "params.json";
  std::ofstream out(path, std::ios::trunc);
  // sort_keys=True, indent=2, no newline at the end: nlohmann::json (not ordered_json) sorts.
  out << nlohmann::json(config).dump(2, ' ', true);
  if (!out) throw Error("tune: cannot write " + path.string());
}

void append_result(const std::string& trial_dir, const Config& result) {
  const fs::path json_path = fs::path(trial_dir) / "result.json";
  {
    std::ofstream out(json_path, std::ios::app);
    out << python_json(result) << "\n";
    if (!out) throw Error("tune: cannot write " + json_path.string());
  }
  Config row = result;
  row.erase("config");
  row = flatten(row);
  const fs::path csv_path = fs::path(trial_dir) / "progress.csv";
  // The header the file already has (a later run of the trial, a resumed search) names the
  // columns; Ray's CSVLoggerCallback keeps a new run's first keys without writing them again,
  // which is the same as long as a trial reports the same keys.
  std::vector<std::string> columns;
  {
    std::ifstream in(csv_path);
    std::string header;
    if (in && std::getline(in, header) && !header.empty()) columns = csv_split(header);
  }
  std::ofstream out(csv_path, std::ios::app);
  if (columns.empty()) {
    for (auto it = row.begin(); it != row.end(); ++it) columns.push_back(it.key());
    for (std::size_t i = 0; i < columns.size(); ++i) out << (i ? "," : "") << csv_quote(columns[i]);
    out << "\r\n";
  }
  for (std::size_t i = 0; i < columns.size(); ++i) {
    out << (i ? "," : "") << (row.contains(columns[i]) ? csv_field(row.at(columns[i])) : "");
  }
  out << "\r\n";
  if (!out) throw Error("tune: cannot write " + csv_path.string());
}

}  // namespace dtrain::tune::detail
