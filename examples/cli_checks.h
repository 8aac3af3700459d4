// The examples' command-line checks: a bad value is one line that names the flag, says what it
// takes and what it got (`--epochs: expected a whole number > 0, got '-1'`), and the program exits
// 2, as `dtrain run` does for bad arguments; --help exits 0.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

namespace examples {

// A number above `lo` (`strict`) or from `lo` on, a whole one where `whole`.
inline CLI::Validator number_from(double lo, bool strict, bool whole) {
  std::string bound = std::to_string(lo);
  bound.erase(bound.find_last_not_of('0') + 1);
  if (bound.back() == '.') bound.pop_back();
  const std::string what =
      std::string(whole ? "a whole number " : "a number ") + (strict ? "> " : ">= ") + bound;
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool ok = !text.empty() && *end == '\0' && std::isfinite(v) &&
                        (strict ? v > lo : v >= lo) && (!whole || v == std::floor(v));
        return ok ? std::string() : "expected " + what + ", got '" + text + "'";
      },
      what);
}

inline CLI::Validator positive_whole() { return number_from(0, true, true); }
inline CLI::Validator positive() { return number_from(0, true, false); }
inline CLI::Validator non_negative_whole() { return number_from(0, false, true); }

// Parses the command line: nullopt to go on, else the exit code (0 after --help, 2 after CLI11
// printed what was wrong).
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
}

}  // namespace examples
