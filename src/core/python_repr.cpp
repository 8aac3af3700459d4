#include "core/python_repr.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace dtrain::detail {

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // The shortest round-trip digits and the exponent (d.ddd x 10^exp), as repr() finds them.
  char buf[64];
  auto end = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific).ptr;
  std::string s(buf, end), sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const auto e_at = s.find('e');
  const int exp = std::stoi(s.substr(e_at + 1));
  std::string digits = s.substr(0, e_at);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int n = static_cast<int>(digits.size());
  // float_repr_style 'short': an exponent below 1e-4 and from 1e16 on, at least two digits.
  if (exp < -4 || exp >= 16) {
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    std::string out = sign;
    out += digits[0];
    if (n > 1) out.append(".").append(digits, 1);
    return out + e;
  }
  if (exp < 0) return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  if (n <= exp + 1)
    return sign + digits + std::string(static_cast<size_t>(exp + 1 - n), '0') + ".0";
  return sign + digits.substr(0, static_cast<size_t>(exp + 1)) + "." +
         digits.substr(static_cast<size_t>(exp + 1));
}

}  // namespace dtrain::detail
