// The result line of an example run under `dtrain run`: the last "[<prefix>]:{json}" line of
// its output (the examples print one JSON object when they finish).
#pragma once

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace dtrain::test {

inline nlohmann::json last_json_line(const std::string& out) {
  std::istringstream in(out);
  nlohmann::json last;
  for (std::string line; std::getline(in, line);) {
    auto brace = line.find("]:{");
    if (brace != std::string::npos) last = nlohmann::json::parse(line.substr(brace + 2));
  }
  return last;
}

}  // namespace dtrain::test
