#include "tune/report_wire.h"

#include <cmath>
#include <limits>
#include <string>

namespace dtrain::tune::detail {

Config with_nonfinite_as_null(const Config& metrics, Config* nonfinite) {
  Config sent = metrics;
  *nonfinite = Config::object();
  for (auto it = sent.begin(); it != sent.end(); ++it) {
    if (!it.value().is_number_float()) continue;
    const double d = it.value().get<double>();
    if (std::isfinite(d)) continue;
    (*nonfinite)[it.key()] = std::isnan(d) ? "nan" : (d > 0 ? "inf" : "-inf");
    it.value() = nullptr;
  }
  return sent;
}

Config metrics_of(const Config& msg) {
  Config metrics = msg.at("metrics");
  if (!msg.contains("nonfinite")) return metrics;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (auto it = msg.at("nonfinite").begin(); it != msg.at("nonfinite").end(); ++it) {
    const std::string how = it.value().is_string() ? it.value().get<std::string>() : "nan";
    metrics[it.key()] = how == "inf"    ? kInf
                        : how == "-inf" ? -kInf
                                        : std::numeric_limits<double>::quiet_NaN();
  }
  return metrics;
}

}  // namespace dtrain::tune::detail
