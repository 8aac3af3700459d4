// The saved search's JSON text with NaN and infinities (state_json.h).
#include "tune/state_json.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "dtrain/error.h"

namespace dtrain::tune::detail {

namespace {

void write(std::string& out, const Config& v, int depth) {
  const auto pad = [&out](int d) {
    out += '\n';
    out.append(static_cast<std::size_t>(d), ' ');
  };
  if (v.is_object() && !v.empty()) {
    out += '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += ',';
      first = false;
      pad(depth + 1);
      out += Config(it.key()).dump();
      out += ": ";
      write(out, it.value(), depth + 1);
    }
    pad(depth);
    out += '}';
  } else if (v.is_array() && !v.empty()) {
    out += '[';
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out += ',';
      pad(depth + 1);
      write(out, v[i], depth + 1);
    }
    pad(depth);
    out += ']';
  } else if (v.is_number_float() && !std::isfinite(v.get<double>())) {
    const double d = v.get<double>();
    out += std::isnan(d) ? "NaN" : (d > 0 ? "Infinity" : "-Infinity");
  } else {
    out += v.dump();  // {}, [], strings, integers, finite floats (shortest round trip), ...
  }
}

// Replaces the value of every null, in document order, whose ordinal `nonfinite` names.
void restore(Config& v, std::size_t& ordinal, const std::map<std::size_t, double>& nonfinite) {
  if (v.is_object() || v.is_array()) {
    for (auto& child : v) restore(child, ordinal, nonfinite);
  } else if (v.is_null()) {
    const auto it = nonfinite.find(ordinal++);
    if (it != nonfinite.end()) v = it->second;
  }
}

bool starts(const std::string& text, std::size_t i, const char* token) {
  return text.compare(i, std::strlen(token), token) == 0;
}

}  // namespace

std::string dump_state_json(const Config& value) {
  std::string out;
  write(out, value, 0);
  return out;
}

Config parse_state_json(const std::string& text, const std::string& where) {
  // Outside strings, each NaN / Infinity / -Infinity becomes null and is remembered by its
  // ordinal among the text's nulls; after parsing, the nulls are walked in the same (document)
  // order and those get their numbers back. A key given twice in one object would make the two
  // orders differ (the parsed object keeps the first place and the last value), so it is refused.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::string strict;
  strict.reserve(text.size());
  std::map<std::size_t, double> nonfinite;
  std::size_t nulls = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      strict += c;
      if (c == '\\' && i + 1 < text.size()) {
        strict += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      strict += c;
    } else if (starts(text, i, "null")) {
      ++nulls;
      strict += "null";
      i += 3;
    } else if (starts(text, i, "NaN")) {
      nonfinite[nulls++] = std::numeric_limits<double>::quiet_NaN();
      strict += "null";
      i += 2;
    } else if (starts(text, i, "Infinity")) {
      nonfinite[nulls++] = kInf;
      strict += "null";
      i += 7;
    } else if (starts(text, i, "-Infinity")) {
      nonfinite[nulls++] = -kInf;
      strict += "null";
      i += 8;
    } else {
      strict += c;
    }
  }
  Config value;
  std::vector<std::set<std::string>> keys;  // of each object being parsed
  std::string twice;
  const Config::parser_callback_t check = [&](int, Config::parse_event_t event, Config& parsed) {
    if (event == Config::parse_event_t::object_start) keys.emplace_back();
    if (event == Config::parse_event_t::object_end) keys.pop_back();
    if (event == Config::parse_event_t::key &&
        !keys.back().insert(parsed.get<std::string>()).second)
      twice = parsed.get<std::string>();
    return true;
  };
  try {
    value = Config::parse(strict, check);
  } catch (const std::exception& e) {
    throw UsageError("tune: " + where + " is not the JSON a dtrain::tune search saves (" +
                     e.what() + "); restore the file or start the search anew");
  }
  if (!twice.empty()) {
    throw UsageError("tune: " + where + " has the key \"" + twice +
                     "\" twice in one object; dtrain::tune never writes that: restore the file "
                     "or start the search anew");
  }
  std::size_t ordinal = 0;
  restore(value, ordinal, nonfinite);
  if (ordinal != nulls) {
    throw InternalError("tune: parse_state_json counted " + std::to_string(nulls) +
                        " nulls in the text of " + where + " and " + std::to_string(ordinal) +
                        " after parsing");
  }
  return value;
}

}  // namespace dtrain::tune::detail
