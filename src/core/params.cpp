#include "core/params.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "dtrain/error.h"

namespace dtrain::param {
namespace {

const char* raw(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

[[noreturn]] void malformed(const char* name, const char* value, const std::string& expected) {
  throw UsageError(std::string(name) + "='" + value + "' is not " + expected + "; fix or unset it");
}

template <class P>
auto or_warn(const P& p) noexcept -> decltype(p.get()) {
  try {
    return p.get();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain: warning: %s (using the default)\n", e.what());
    return p.fallback;
  }
}

std::string number_text(double d) {
  std::string s = std::to_string(d);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

std::optional<std::string> String::get_if_set() const {
  const char* v = raw(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

std::string String::get() const { return get_if_set().value_or(fallback); }

std::optional<int64_t> Int::get_if_set() const {
  const char* v = raw(name);
  if (!v) return std::nullopt;
  const char* end = v + std::char_traits<char>::length(v);
  int64_t x = 0;
  const auto [ptr, ec] = std::from_chars(v, end, x);
  if (ec != std::errc() || ptr != end || x < min)
    malformed(name, v, "an integer >= " + std::to_string(min));
  return x;
}

int64_t Int::get() const { return get_if_set().value_or(fallback); }
int64_t Int::get_or_warn() const noexcept { return or_warn(*this); }

std::optional<double> Double::get_if_set() const {
  const char* v = raw(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(d) || d < min)
    malformed(name, v, "a number >= " + number_text(min));
  return d;
}

double Double::get() const { return get_if_set().value_or(fallback); }
double Double::get_or_warn() const noexcept { return or_warn(*this); }

std::optional<bool> Bool::get_if_set() const {
  const char* v = raw(name);
  if (!v) return std::nullopt;
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  malformed(name, v, "1 or 0 (true/false, yes/no, on/off)");
}

bool Bool::get() const { return get_if_set().value_or(fallback); }
bool Bool::get_or_warn() const noexcept { return or_warn(*this); }

}  // namespace dtrain::param
