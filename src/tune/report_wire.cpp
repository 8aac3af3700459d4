#include "tune/report_wire.h"

#include <cmath>
#include <limits>
#include <string>

namespace dtrain::tune::detail {

Config with_nonfinite_as_null(const Config& metrics, Config* nonfinite) {
  Config sent = metrics;
  *nonfinite = Config::object();
  const Config leaves = metrics.flatten();  // {JSON pointer: value} of every leaf
  for (auto it = leaves.begin(); it != leaves.end(); ++it) {
    if (!it.value().is_number_float()) continue;
    const double d = it.value().get<double>();
    if (std::isfinite(d)) continue;
    (*nonfinite)[it.key()] = std::isnan(d) ? "nan" : (d > 0 ? "inf" : "-inf");
    sent[Config::json_pointer(it.key())] = nullptr;
  }
  return sent;
}

Config metrics_of(const Config& msg) {
  Config metrics = msg.at("metrics");
  if (!msg.contains("nonfinite")) return metrics;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (auto it = msg.at("nonfinite").begin(); it != msg.at("nonfinite").end(); ++it) {
    const std::string how = it.value().is_string() ? it.value().get<std::string>() : "nan";
    const double x = how == "inf"    ? kInf
                     : how == "-inf" ? -kInf
                                     : std::numeric_limits<double>::quiet_NaN();
    // A pointer; a plain key is a top-level one (a report written before pointers were used).
    if (!it.key().empty() && it.key()[0] == '/') {
      metrics[Config::json_pointer(it.key())] = x;
    } else {
      metrics[it.key()] = x;
    }
  }
  return metrics;
}

}  // namespace dtrain::tune::detail
