// Reading an artifact back: an MLflow artifact URI resolved as MLflow's
// `_download_artifact_from_uri` resolves it, for the formats dtrain writes and reads. Internal to
// src/tracking; no libtorch.
#pragma once

#include <chrono>
#include <string>

namespace dtrain::mlflow::detail {

// The bytes of the file `name` in the artifact directory `uri` names:
//   runs:/<run id>/<path>              the run's artifact location (runs/get at `tracking_uri`)
//                                      joined with <path>, then resolved as below;
//   mlflow-artifacts:/<path>           the artifact proxy of the server at `tracking_uri`;
//   mlflow-artifacts://host:port/<path> the proxy of that server (the tracking URI's scheme,
//                                      else http);
//   file:///<path>, file:<path>, <path> a local directory (relative: to the working directory).
// REQUIRES: `name` is a plain file name. `tracking_uri` (http(s)://, file: or a path) is needed
// for runs:/ and for mlflow-artifacts: without a host. Every request gives up after `timeout`.
// Throws UsageError (one line, naming the URI and the remedy) for an unsupported scheme, a run
// or file that is not there, or a missing tracking URI; NetworkError when the server cannot be
// reached or fails.
std::string read_artifact_file(const std::string& uri, const std::string& name,
                               const std::string& tracking_uri, std::chrono::milliseconds timeout);

}  // namespace dtrain::mlflow::detail
