// A report as it travels from a trial's rank 0 to the Tuner's driver through the job's store:
// JSON text, which has no NaN or infinity (nlohmann writes them as null). A diverging trial
// reports a NaN loss, and Ray's schedulers, stoppers, loggers and MLflow callback all see that
// NaN (ASHA records it in its rung, nanpercentile skips it; result.json says NaN). So the
// non-finite metrics travel by name beside the metrics and come back as numbers.
//
//   sender:  msg["metrics"] = with_nonfinite_as_null(metrics, &names); msg["nonfinite"] = names
//   driver:  Result metrics = metrics_of(msg)
#pragma once

#include "dtrain/tune_search_space.h"

namespace dtrain::tune::detail {

// `metrics` (an object, nested objects and lists in it too) with every NaN or infinite number
// replaced by null; `nonfinite` gets {JSON pointer ("/loss", "/acc/top1"): "nan" | "inf" |
// "-inf"} for each (an empty object when there is none).
Config with_nonfinite_as_null(const Config& metrics, Config* nonfinite);

// msg["metrics"] with the values msg["nonfinite"] names restored as numbers. A message without
// "nonfinite" (all finite) is returned as it is.
Config metrics_of(const Config& msg);

}  // namespace dtrain::tune::detail
