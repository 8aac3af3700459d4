// The reader of one section of a DeepSpeed config (zero/config_sections.h parses each section
// with it): typed, range-checked access that records every key read, "auto" and null as
// DeepSpeed's pydantic models or its .get() calls take them, and the unknown keys refused or
// noted at the end.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dtrain/zero_config.h"

namespace dtrain::zero::config_parse {

using nlohmann::json;

// One section's reader: every access records the key as known; finish() rejects the rest.
//
// `validated`: a section DeepSpeed reads through pydantic (zero_optimization, offload_*, fp16,
// bf16): there DeepSpeed forbids unknown keys too, and drops "auto" values so the default
// applies; the reader does the same. Elsewhere DeepSpeed reads with .get() and "auto" is only
// the Hugging Face convention; an unknown key there is what DeepSpeed ignores (the top level,
// optimizer, scheduler, data_types, timers: ignores_unknown_keys) - accepted with a note unless
// it is a near-miss of a known key or the parse is strict (ParseOptions::strict) - or what a
// constructor refuses (refused_by).
class Section {
 public:
  Section(const json& j, std::string path, std::vector<std::string>* notes = nullptr,
          bool validated = false)
      : j_(j), path_(std::move(path)), notes_(notes), validated_(validated) {
    if (!j_.is_object()) fail("", "must be an object, got " + std::string(j_.type_name()));
  }
  std::vector<std::string>* notes() const { return notes_; }
  void note(const std::string& key, const std::string& what) const {
    if (notes_) notes_->push_back(where(key) + ": " + what);
  }
  std::string where(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    std::string p = key.empty() ? path_ : where(key);
    throw ConfigError((p.empty() ? std::string("config") : p) + ": " + what);
  }
  const json* get(const std::string& key) {
    known_.push_back(key);
    auto it = j_.find(key);
    if (it == j_.end()) return nullptr;
    if (it->is_null()) {
      // pydantic takes null only for the fields DeepSpeed declares Optional.
      static const std::vector<std::string> optional = {
          "overlap_comm", "offload_param",     "offload_optimizer",          "zenflow",
          "cpu_offload",  "cpu_offload_param", "cpu_offload_use_pin_memory", "nvme_path"};
      if (validated_ && std::find(optional.begin(), optional.end(), key) == optional.end())
        fail(key,
             "null is not a value for this key (DeepSpeed 0.19.8 refuses it too); give a value "
             "or leave the key out");
      return nullptr;
    }
    if (validated_ && is_auto(&*it)) {
      if (std::find(auto_noted_.begin(), auto_noted_.end(), key) == auto_noted_.end()) {
        auto_noted_.push_back(key);
        const bool own = key == "stage3_prefetch_bucket_size" || key == "stage3_max_reuse_distance";
        note(key, own ? "\"auto\": dtrain's default (DeepSpeed drops \"auto\" in this section "
                        "and uses its own; the two differ for this key: docs/zero.md)"
                  : key == "overlap_comm"
                      ? "\"auto\": dtrain's default, false (DeepSpeed drops \"auto\" in this "
                        "section and uses its own: true at stage 3, false below)"
                      : "\"auto\": DeepSpeed's default (DeepSpeed drops \"auto\" in this section)");
      }
      return nullptr;
    }
    return &*it;
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  static bool is_auto(const json* v) {
    return v && v->is_string() && v->get<std::string>() == "auto";
  }
  // In a validated section a value is read as pydantic's lax mode reads it (DeepSpeed 0.19.8
  // accepts "enabled": "true" and "stage": "2"), with a note; elsewhere only its JSON type.
  void boolean(const std::string& key, bool& out) {
    if (auto v = get(key)) {
      std::optional<bool> b = v->is_boolean() ? std::optional<bool>(v->get<bool>())
                              : validated_    ? lax_bool(*v)
                                              : std::nullopt;
      if (!b) fail(key, "expected true or false, got " + v->dump());
      if (!v->is_boolean()) coerced(key, *v, *b ? "true" : "false");
      out = *b;
    }
  }
  void number(const std::string& key, double& out, double lo = -INFINITY, double hi = INFINITY,
              bool allow_auto = false, bool allow_bool = true) {
    if (auto v = get(key)) {
      if (allow_auto && is_auto(v)) return;
      std::optional<double> d = v->is_number() ? std::optional<double>(v->get<double>())
                                : validated_ && (allow_bool || !v->is_boolean()) ? lax_float(*v)
                                                                                 : std::nullopt;
      if (!d) fail(key, "expected a number, got " + v->dump());
      if (!(*d >= lo && *d <= hi))
        fail(key, "out of range: " + v->dump() + " (allowed: " + range(lo, hi) + ")");
      if (!v->is_number()) coerced(key, *v, json(*d).dump());
      out = *d;
    }
  }
  // Integers; JSON numbers like 5e8 (DeepSpeed's own examples) are accepted when integral.
  // `exact`: only a JSON integer (DeepSpeed's schedulers check isinstance(value, int), so 1e3,
  // read by Python as the float 1000.0, is refused there).
  bool integer(const std::string& key, int64_t& out, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX,
               bool allow_auto = false, bool allow_bool = true, bool exact = false) {
    if (auto v = get(key)) {
      if (allow_auto && is_auto(v)) return false;
      std::optional<int64_t> i;
      if (v->is_number_integer())
        i = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)
                ? std::nullopt
                : std::optional<int64_t>(v->get<int64_t>());
      else if (v->is_number_float() && !exact)
        i = integral(v->get<double>());
      else if (validated_ && !v->is_number() && (allow_bool || !v->is_boolean()))
        i = lax_int(*v);
      if (!i)
        fail(key, "expected an integer, got " + v->dump() +
                      (exact && v->is_number_float()
                           ? " (DeepSpeed 0.19.8 refuses it too: it is a float to Python - "
                             "always in a config given as an object, its dict, and in a config "
                             "file or text from 1e10 on, where hjson stops reading integral "
                             "floats as ints): write it as an integer, e.g. " +
                                 (integral(v->get<double>())
                                      ? std::to_string(*integral(v->get<double>()))
                                      : std::string("1000")) +
                                 ")"
                           : std::string()));
      if (*i < lo || *i > hi)
        fail(key, "out of range: " + v->dump() + " (allowed: " + range(lo, hi) + ")");
      if (!v->is_number()) coerced(key, *v, std::to_string(*i));
      out = *i;
      return true;
    }
    return false;
  }
  void integer(const std::string& key, int& out, int64_t lo, int64_t hi) {
    int64_t v = out;
    integer(key, v, lo, hi);
    out = static_cast<int>(v);
  }
  // `allowed` values match exactly, as DeepSpeed compares them (its enums, getattr on a class
  // name); `what_deepspeed_does` is added to the refusal of any other value.
  void string(const std::string& key, std::string& out,
              const std::vector<std::string>& allowed = {},
              const std::string& what_deepspeed_does = "") {
    if (auto v = get(key)) {
      if (!v->is_string()) fail(key, "expected a string, got " + v->dump());
      std::string s = v->get<std::string>();
      if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
        std::string list;
        for (auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        std::string near = closest_key(s, allowed);
        fail(key, "unknown value \"" + s + "\" (allowed: " + list + ")" + what_deepspeed_does +
                      (near.empty() ? "" : "; did you mean " + near + "?"));
      }
      out = s;
    }
  }
  // Keys this section accepts without acting on them: only their type is checked (in a
  // validated section DeepSpeed's pydantic checks it too).
  void accept(const std::string& key) { get(key); }
  void accept_bool(const std::string& key) {
    bool b = false;
    boolean(key, b);
  }
  void accept_int(const std::string& key, int64_t lo = INT64_MIN) {
    int64_t i = 0;
    integer(key, i, lo);
  }
  // The class whose constructor DeepSpeed passes this section's keys to (optimizer and
  // scheduler params): an unknown key fails there, so the message says DeepSpeed refuses it.
  void refused_by(const std::string& who) { refused_by_ = who; }
  // A section DeepSpeed reads key by key with .get(), so that it ignores a key it does not know:
  // finish() accepts such a key with a note, unless it is a near-miss of a known key (a typo:
  // refused with "did you mean") or `strict` (every unknown key refused).
  void ignores_unknown_keys(bool strict) {
    ignores_unknown_ = true;
    strict_ = strict;
  }
  // As `parent` (the strictness of the whole parse).
  void ignores_unknown_keys_like(const Section& parent) { ignores_unknown_keys(parent.strict_); }
  // Keys DeepSpeed reads here that change nothing in dtrain: accepted with a note when set.
  void ignore(const std::string& key, const std::string& why) {
    if (get(key)) note(key, why);
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
      std::string near = closest_key(it.key(), known_);
      if (ignores_unknown_ && !strict_ && near.empty() && !validated_ && refused_by_.empty()) {
        note(it.key(),
             "unknown key, not read by DeepSpeed 0.19.8 (it ignores it) and ignored by dtrain "
             "too; `dtrain zero check --strict` (InitOptions::strict_config) refuses it");
        continue;
      }
      fail(it.key(),
           std::string(validated_ ? "unknown key (DeepSpeed 0.19.8 refuses it too)"
                       : !refused_by_.empty()
                           ? "unknown key (DeepSpeed 0.19.8 refuses it too: it passes the key to " +
                                 refused_by_ + ", which has no such argument)"
                       : !near.empty()
                           ? "unknown key (DeepSpeed 0.19.8 would silently ignore it; dtrain "
                             "refuses it as a likely typo of a known key: correct it)"
                           : "unknown key (DeepSpeed 0.19.8 would silently ignore it; "
                             "dtrain refuses it in strict mode so that a typo cannot go "
                             "unnoticed: remove it or correct it)") +
               (near.empty() ? std::string() : "; did you mean " + near + "?"));
    }
  }

 private:
  // pydantic 2's lax conversions (what DeepSpeed's validated sections accept).
  static std::optional<bool> lax_bool(const json& v) {
    if (v.is_number()) {
      double d = v.get<double>();
      if (d == 0 || d == 1) return d == 1;
      return std::nullopt;
    }
    if (!v.is_string()) return std::nullopt;
    std::string s = v.get<std::string>();
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    for (const char* t : {"1", "on", "t", "true", "y", "yes"})
      if (s == t) return true;
    for (const char* f : {"0", "off", "f", "false", "n", "no"})
      if (s == f) return false;
    return std::nullopt;
  }
  static std::optional<int64_t> integral(double d) {
    if (d != std::floor(d) || std::fabs(d) > 9e18) return std::nullopt;
    return static_cast<int64_t>(d);
  }
  // A string as Python's float() reads it, or an integer string ("5", " +5 ", "5_000", "5.0").
  static std::optional<double> parse_number(std::string s, bool integer) {
    auto b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
    if (b == std::string::npos) return std::nullopt;
    s = s.substr(b, e - b + 1);
    std::string t;  // underscores only between digits
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k] != '_') {
        t += s[k];
        continue;
      }
      if (k == 0 || k + 1 == s.size() || !std::isdigit(static_cast<unsigned char>(s[k - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[k + 1])))
        return std::nullopt;
    }
    if (integer) {
      size_t k = (t[0] == '+' || t[0] == '-') ? 1 : 0, digits = 0;
      while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) ++k, ++digits;
      if (k < t.size() && t[k] == '.') {
        ++k;
        while (k < t.size() && t[k] == '0') ++k;
      }
      if (digits == 0 || k != t.size()) return std::nullopt;
    }
    char* end = nullptr;
    double d = std::strtod(t.c_str(), &end);
    if (end != t.c_str() + t.size() || t.find_first_of("xX") != std::string::npos)
      return std::nullopt;
    return d;
  }
  static std::optional<int64_t> lax_int(const json& v) {
    if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
    if (!v.is_string()) return std::nullopt;
    auto d = parse_number(v.get<std::string>(), true);
    return d ? integral(*d) : std::nullopt;
  }
  static std::optional<double> lax_float(const json& v) {
    if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
    if (!v.is_string()) return std::nullopt;
    return parse_number(v.get<std::string>(), false);
  }
  void coerced(const std::string& key, const json& given, const std::string& as) const {
    note(key, given.dump() + " read as " + as + " (DeepSpeed's pydantic converts it the same way)");
  }
  static std::string range(double lo, double hi) {
    std::ostringstream s;
    if (std::isinf(lo))
      s << "<= " << hi;
    else if (std::isinf(hi))
      s << ">= " << lo;
    else
      s << lo << " .. " << hi;
    return s.str();
  }
  static std::string range(int64_t lo, int64_t hi) {
    if (lo == INT64_MIN) return "<= " + std::to_string(hi);
    if (hi == INT64_MAX) return ">= " + std::to_string(lo);
    return std::to_string(lo) + " .. " + std::to_string(hi);
  }
  const json& j_;
  std::string path_;
  std::vector<std::string>* notes_;
  bool validated_;
  std::string refused_by_;
  bool ignores_unknown_ = false, strict_ = true;
  std::vector<std::string> known_, auto_noted_;
};

// `s` in lower case (ASCII).
inline std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace dtrain::zero::config_parse
