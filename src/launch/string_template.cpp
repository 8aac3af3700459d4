// Python's string.Template safe_substitute (see string_template.h).
#include "launch/string_template.h"

namespace dtrain::launch {
namespace {

bool ident_start(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool ident_char(char c) { return ident_start(c) || (c >= '0' && c <= '9'); }

}  // namespace

std::string safe_substitute(const std::string& t, const std::map<std::string, std::string>& vars) {
  std::string out;
  size_t i = 0;
  while (i < t.size()) {
    if (t[i] != '$' || i + 1 >= t.size()) {
      out += t[i++];
      continue;
    }
    if (t[i + 1] == '$') {
      out += '$';
      i += 2;
      continue;
    }
    const bool braced = t[i + 1] == '{';
    size_t start = i + (braced ? 2 : 1), end = start;
    if (end < t.size() && ident_start(t[end]))
      while (end < t.size() && ident_char(t[end])) ++end;
    const bool closed = braced && end < t.size() && t[end] == '}';
    auto it = vars.find(t.substr(start, end - start));
    if (end > start && (!braced || closed) && it != vars.end()) {
      out += it->second;
      i = end + (braced ? 1 : 0);
    } else {
      out += t[i++];  // unknown or malformed: kept as written
    }
  }
  return out;
}

std::string escape_substitution(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '$') out += '$';
    out += c;
  }
  return out;
}

std::vector<std::string> substitute_local_rank(const std::vector<std::string>& argv,
                                               int local_rank) {
  std::vector<std::string> out = argv;
  const std::map<std::string, std::string> vars = {{"local_rank", std::to_string(local_rank)}};
  for (size_t i = 1; i < out.size(); ++i) out[i] = safe_substitute(out[i], vars);
  return out;
}

}  // namespace dtrain::launch
