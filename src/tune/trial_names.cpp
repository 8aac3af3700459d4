// Ray Tune 2.60's trial ids, experiment tags and trial directory names (trial_names.h).
#include "tune/trial_names.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/python_repr.h"

namespace fs = std::filesystem;

namespace dtrain::tune::detail {

namespace {

std::string random_hex(std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device device;
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += kHex[device() % 16];
  return out;
}

// Python's repr() of a str, as str() of a list or dict writes its strings.
std::string python_repr(const std::string& s) {
  const bool double_quoted = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = double_quoted ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    if (c == '\\' || c == quote) {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  return out + quote;
}

// Python's str(value) (repr inside lists and dicts) of a JSON value as json.load gives it.
std::string python_str(const Config& v, bool nested = false) {
  if (v.is_string()) return nested ? python_repr(v.get<std::string>()) : v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  if (v.is_number_float()) return dtrain::detail::python_float_repr(v.get<double>());
  if (v.is_number()) return v.dump();
  std::string out;
  if (v.is_array()) {
    out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + python_str(v[i], true);
    return out + "]";
  }
  out = "{";
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it != v.begin()) out += ", ";
    out += python_repr(it.key()) + ": " + python_str(it.value(), true);
  }
  return out + "}";
}

// Ray's _clean_value: a float as "%.4f" (Python's nan, inf), anything else str() with every run
// of characters outside [a-zA-Z0-9_-] one "_", "_" stripped at both ends.
std::string clean_value(const Config& v) {
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isnan(d) || std::isinf(d)) return dtrain::detail::python_float_repr(d);
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.4f", d);
    return buf;
  }
  const std::string s = python_str(v);
  std::string out;
  bool in_run = false;
  for (unsigned char c : s) {
    if (std::isalnum(c) && c < 0x80) {
      out += static_cast<char>(c);
      in_run = false;
    } else if (c == '_' || c == '-') {
      out += static_cast<char>(c);
      in_run = false;
    } else if (!in_run) {
      out += '_';
      in_run = true;
    }
  }
  const auto first = out.find_first_not_of('_');
  if (first == std::string::npos) return "";
  return out.substr(first, out.find_last_not_of('_') - first + 1);
}

// A path into the space: object keys and list indices, compared as Python compares the tuples
// (an index before a key where they differ in kind; Python would not compare them at all).
using Step = std::variant<std::int64_t, std::string>;
using Path = std::vector<Step>;

void unresolved_paths(const Config& node, Path& at, std::vector<Path>& out) {
  if (is_grid(node) || is_domain(node)) {
    out.push_back(at);
    return;
  }
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      at.emplace_back(it.key());
      unresolved_paths(it.value(), at, out);
      at.pop_back();
    }
  } else if (node.is_array()) {
    for (std::size_t i = 0; i < node.size(); ++i) {
      at.emplace_back(static_cast<std::int64_t>(i));
      unresolved_paths(node[i], at, out);
      at.pop_back();
    }
  }
}

const Config* value_at(const Config& config, const Path& path) {
  const Config* v = &config;
  for (const Step& s : path) {
    if (const auto* key = std::get_if<std::string>(&s)) {
      if (!v->is_object() || !v->contains(*key)) return nullptr;
      v = &v->at(*key);
    } else {
      const auto i = static_cast<std::size_t>(std::get<std::int64_t>(s));
      if (!v->is_array() || i >= v->size()) return nullptr;
      v = &(*v)[i];
    }
  }
  return v;
}

// Python's s[:n] of a UTF-8 string: n code points.
std::string first_code_points(const std::string& s, std::size_t n) {
  std::size_t points = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;  // a continuation byte
    if (points++ == n) return s.substr(0, i);
  }
  return s;
}

}  // namespace

std::string new_experiment_id() { return random_hex(5); }

std::string trial_id(const std::string& experiment_id, std::size_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "_%05zu", index);
  return experiment_id + buf;
}

std::string format_vars(const Config& space, const Config& config) {
  std::vector<Path> paths;
  Path at;
  unresolved_paths(space, at, paths);
  std::sort(paths.begin(), paths.end());  // Python's sorted() over the path tuples
  std::string out;
  for (const Path& p : paths) {
    const Config* v = value_at(config, p);
    if (v == nullptr) continue;
    const Config key = std::holds_alternative<std::string>(p.back())
                           ? Config(std::get<std::string>(p.back()))
                           : Config(std::get<std::int64_t>(p.back()));
    if (!out.empty()) out += ',';
    out += clean_value(key);
    out += '=';
    out += clean_value(*v);
  }
  return out;
}

std::string experiment_tag(std::size_t index, const Config& space, const Config& config) {
  std::string tag = std::to_string(index);
  const std::string vars = format_vars(space, config);
  // Ray appends the vars when any were resolved, even if they format to "".
  std::vector<Path> paths;
  Path at;
  unresolved_paths(space, at, paths);
  if (!paths.empty()) tag += "_" + vars;
  return tag;
}

std::string sanitize_dirname(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    if (std::string_view("/()<>:\"\\|?*").find(c) != std::string_view::npos) c = '_';
  }
  return out;
}

std::string trial_name(const std::string& trainable, const std::string& id, const Config& config) {
  std::string identifier = trainable;
  if (config.is_object() && config.contains("env"))
    identifier += "_" + python_str(config.at("env"));
  identifier += "_" + id;
  std::replace(identifier.begin(), identifier.end(), '/', '_');
  return identifier;
}

std::string perturbed_tag(const std::string& orig_tag, const Config& config,
                          const Config& mutations) {
  // Ray's format_vars over {("config", k): config[k]}: sorted by k (Python compares str by code
  // point, as std::string's bytes compare UTF-8), each key and value cleaned.
  std::vector<std::string> keys;
  for (auto it = mutations.begin(); it != mutations.end(); ++it) keys.push_back(it.key());
  std::sort(keys.begin(), keys.end());
  std::string vars;
  for (const std::string& k : keys) {
    if (!vars.empty()) vars += ',';
    vars += clean_value(Config(k));
    vars += '=';
    vars += clean_value(config.at(k));
  }
  return orig_tag + "@perturbed[" + vars + "]";
}

std::string trial_dirname(const std::string& name, const std::string& tag, const std::string& date,
                          std::size_t max_len) {
  return sanitize_dirname(first_code_points(name + "_" + tag, max_len) + "_" + date);
}

std::string unique_dirname(const fs::path& root, const std::string& name) {
  std::error_code ec;
  if (!fs::exists(root / name, ec)) return name;
  return name + "_" + random_hex(4);
}

std::string date_str() {
  const std::time_t t = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&t, &local);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d_%H-%M-%S", &local);
  return date;
}

}  // namespace dtrain::tune::detail
