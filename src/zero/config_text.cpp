// DeepSpeed's config text (hjson's JSON superset as DeepSpeed's configs use it) to JSON.
#include "zero/config_text.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dtrain/zero_config.h"

namespace dtrain::zero {
namespace {

using json = nlohmann::json;

// Comments and commas before a closing bracket blanked out (newlines kept, so nlohmann's line
// and column still point into the user's text); strings untouched.
std::string blank_hjson_extras(std::string s) {
  const size_t n = s.size();
  auto blank = [&](size_t from, size_t to) {
    for (size_t k = from; k < to && k < n; ++k)
      if (s[k] != '\n') s[k] = ' ';
  };
  // The end of the comment starting at k, or k when none starts there.
  auto comment_end = [&](size_t k) -> size_t {
    if (s[k] == '#' || (s[k] == '/' && k + 1 < n && s[k + 1] == '/')) {
      const size_t nl = s.find('\n', k);
      return nl == std::string::npos ? n : nl;
    }
    if (s[k] == '/' && k + 1 < n && s[k + 1] == '*') {
      const size_t close = s.find("*/", k + 2);
      return close == std::string::npos ? k : close + 2;  // unclosed: nlohmann says where
    }
    return k;
  };
  // hjson reads a comma as the end of a value: one right after '[', '{' or another comma (past
  // blanks and comments, already blanked here) ends none, and hjson refuses it ("[,]", "{,}",
  // "[1,,]"); it is left for nlohmann to refuse with its place.
  auto after_opening_or_comma = [&](size_t k) {
    size_t j = k;
    while (j > 0 && std::isspace(static_cast<unsigned char>(s[j - 1]))) --j;
    return j == 0 || s[j - 1] == '[' || s[j - 1] == '{' || s[j - 1] == ',';
  };
  for (size_t k = 0; k < n;) {
    const char c = s[k];
    if (c == '"') {  // a string: to its closing quote, past escapes
      for (++k; k < n && s[k] != '"'; ++k)
        if (s[k] == '\\') ++k;
      ++k;
      continue;
    }
    if (const size_t end = comment_end(k); end != k) {
      blank(k, end);
      k = end;
      continue;
    }
    if (c == ',' && !after_opening_or_comma(k)) {  // followed (past blanks, comments) by } or ]?
      size_t j = k + 1;
      while (j < n) {
        if (std::isspace(static_cast<unsigned char>(s[j]))) {
          ++j;
        } else if (const size_t end = comment_end(j); end != j) {
          j = end;
        } else {
          break;
        }
      }
      if (j < n && (s[j] == '}' || s[j] == ']')) s[k] = ' ';
    }
    ++k;
  }
  return s;
}

// hjson's numbers (hjson 3.1's decoder, scantfnns): a number written with a fraction or an
// exponent is a float, made an int when it is integral and below 1e10 in magnitude
// (`int(res) == res and abs(res) < 1e10`): 1e3 and 100.0 are ints, 1e10 and 2.5e12 stay floats.
constexpr double kHjsonIntBound = 1e10;

void integral_floats_to_integers(json& j) {
  if (j.is_structured()) {
    for (auto& v : j) integral_floats_to_integers(v);
    return;
  }
  if (!j.is_number_float()) return;
  const double d = j.get<double>();
  if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < kHjsonIntBound)
    j = static_cast<int64_t>(d);
}

}  // namespace

json read_config_text(const std::string& text, const std::string& what) {
  json j;
  try {
    // A key given twice in one object: DeepSpeed refuses it ("Duplicate keys in DeepSpeed
    // config"); nlohmann would keep the last one silently. `open` holds each open object's keys.
    struct Open {
      std::string name;  // the key path of this object
      std::vector<std::string> keys;
    };
    std::vector<Open> open;
    std::string last_key;
    json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::object_start) {
        std::string name = open.empty() ? "" : open.back().name;
        if (!open.empty()) name += (name.empty() ? "" : ".") + last_key;
        open.push_back({name, {}});
      } else if (event == json::parse_event_t::object_end) {
        if (!open.empty()) open.pop_back();
      } else if (event == json::parse_event_t::key && !open.empty()) {
        last_key = parsed.get<std::string>();
        auto& o = open.back();
        if (std::find(o.keys.begin(), o.keys.end(), last_key) != o.keys.end())
          throw ConfigError((o.name.empty() ? "" : o.name + ".") + last_key +
                            ": duplicate key (given twice in one object; DeepSpeed refuses "
                            "duplicate keys too): keep one of them");
        o.keys.push_back(last_key);
      }
      return true;
    };
    j = json::parse(blank_hjson_extras(text), check, /*allow_exceptions=*/true,
                    /*ignore_comments=*/true);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 5e400
    // nlohmann's text starts with its own tag ("[json.exception.parse_error.101] "): dropped.
    std::string why = e.what();
    if (why.rfind("[json.exception.", 0) == 0 && why.find("] ") != std::string::npos)
      why = why.substr(why.find("] ") + 2);
    throw ConfigError(what + ": not valid JSON: " + why +
                      " (dtrain reads JSON with the hjson that DeepSpeed's configs use: comments "
                      "and a comma before a closing bracket; quote every key and string)");
  }
  integral_floats_to_integers(j);
  return j;
}

}  // namespace dtrain::zero
