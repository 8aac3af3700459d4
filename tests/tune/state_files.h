// What the tune tests that kill and resume a search read from its files and output: a file's
// text, the saved search state, a program's last JSON line. Header-only, for the tests.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "dtrain/tune.h"
#include "tune/state_json.h"

namespace dtrain::test {

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The saved state, or null while there is none yet (or it is half replaced).
inline tune::Config read_state(const std::filesystem::path& p) {
  const std::string text = read_text(p);
  if (text.empty()) return nullptr;
  try {
    return tune::detail::parse_state_json(text, p.string());
  } catch (const std::exception&) {
    return nullptr;
  }
}

// The last non-empty line of `out`, parsed as JSON.
inline tune::Config last_line_json(const std::string& out) {
  std::istringstream in(out);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return tune::Config::parse(last);
}

}  // namespace dtrain::test
