// dtrain::mlflow: log a run to MLflow from C++ (there is no official C++ client).
//
// A client of MLflow's REST API (`http://host:port` of an `mlflow server`) and a writer of
// MLflow's local file-store layout (`file:/path/mlruns` or a plain path) for offline runs.
// Honours MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME, MLFLOW_EXPERIMENT_ID, MLFLOW_RUN_ID
// (continue that run), and DTRAIN_MLFLOW_PARENT_RUN_ID (nest the run under it; the
// Distributor sets it).
//
//   auto run = dtrain::mlflow::Run::start({.run_name = "fashion-mnist"});  // no-op off rank 0
//   run.log_params({{"world_size", "2"}, {"effective_batch_size", "128"}});
//   run.log_metric("loss", 0.42, step);           // queued; never blocks the step
//   run.log_artifact("model.pt");
//   run.end(dtrain::mlflow::RunStatus::Finished);  // flushes, sets the status
//
// Only rank 0 (the RANK environment variable, 0 when unset) logs unless `all_ranks` is set:
// the same code runs on every rank without duplicate runs. A background thread sends what
// was logged in `runs/log-batch` requests (at most 1000 metrics, 100 params, 100 tags each),
// retries with backoff while the server is down, and keeps what it could not send yet in a
// spool file on disk; what is still unsent when the run ends (after `flush_timeout`) is
// written to a local file store and a warning says where. An unreachable server at start is a
// warning, and the run is logged to the local file store instead. Params and tags are sent at
// once; a process stopped by SIGTERM/SIGINT first sends what is queued (`signal_flush`).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace torch::nn {
class Module;
}

namespace dtrain::mlflow {

enum class RunStatus { Running, Finished, Failed, Killed };
const char* to_string(RunStatus s);

struct StartOptions {
  std::string tracking_uri;  // default: MLFLOW_TRACKING_URI; no URI and no env: no run (inactive)
  // The experiment, as mlflow.start_run() picks it: by name (created when missing), else by the
  // id of an existing one; with neither set here, MLFLOW_EXPERIMENT_NAME and
  // MLFLOW_EXPERIMENT_ID (the name wins; both set and naming different experiments, or an id
  // naming none, is a UsageError); with none of them, "Default".
  std::string experiment;
  std::string experiment_id;
  std::string run_name;
  std::map<std::string, std::string> tags;
  std::string parent_run_id;  // default: DTRAIN_MLFLOW_PARENT_RUN_ID (sets mlflow.parentRunId)
  std::string run_id;         // continue this run; default: MLFLOW_RUN_ID
  bool all_ranks = false;     // log from every rank, not only rank 0
  // Where a run goes when the server cannot be reached (file store layout).
  // Default: DTRAIN_MLFLOW_FALLBACK_DIR, else ./mlruns.
  std::string fallback_dir;
  std::chrono::milliseconds flush_interval{500};
  std::chrono::milliseconds flush_timeout{std::chrono::seconds(60)};  // end(): wait for delivery
  std::chrono::milliseconds request_timeout{std::chrono::seconds(10)};
  // SIGTERM or SIGINT (when the program left them at their default action, as `dtrain run`
  // stops a failed job's other workers): send what is queued for up to this long, keep the
  // rest in the spool file, then die of the signal as before. 0: leave the signals alone.
  std::chrono::milliseconds signal_flush{std::chrono::seconds(3)};
  // System metrics (CPU, memory, disk, network, NVIDIA GPUs) as MLflow's
  // `start_run(log_system_metrics=True)` logs them ("system/..." every 10 s; see
  // docs/tracking.md). Default: MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING (off when unset).
  std::optional<bool> log_system_metrics;
};

// Counters a test or a log line can read.
struct RunStats {
  int64_t metrics_sent = 0;
  int64_t failed_requests = 0;  // requests that failed and were retried
  int64_t spooled = 0;          // entries that went through the disk spool
  int64_t rejected = 0;         // entries the server refused (4xx), dropped alone
  int64_t pending = 0;          // queued and not sent yet
};

class Run {
 public:
  // Starts (or continues) a run. Inactive (every call a no-op) off rank 0, or when no
  // tracking URI is given or set.
  static Run start(StartOptions options = {});
  Run();  // inactive
  Run(Run&&) noexcept;
  Run& operator=(Run&&) noexcept;
  ~Run();  // ends a run still open as FINISHED

  bool active() const;
  std::string id() const;
  std::string experiment_id() const;
  std::string tracking_uri()
      const;  // where it is really logged (the fallback store after a warning)

  void log_param(const std::string& key, const std::string& value);
  void log_params(const std::map<std::string, std::string>& params);
  // timestamp_ms 0: now.
  void log_metric(const std::string& key, double value, int64_t step = 0, int64_t timestamp_ms = 0);
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step = 0);
  void set_tag(const std::string& key, const std::string& value);
  // Uploads a file (or every file under a directory) to the run's artifacts under
  // `artifact_path` (empty: the top). Synchronous after a flush of what was logged before.
  void log_artifact(const std::string& local_path, const std::string& artifact_path = "");
  // Waits up to `timeout` for everything logged so far to be sent; true when it was.
  bool flush(std::chrono::milliseconds timeout);
  RunStats stats() const;
  // Flushes and sets the final status; what could not be delivered goes to the fallback store.
  void end(RunStatus status = RunStatus::Finished);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// A float param's text as MLflow's Python client logs it (str(), i.e. repr(), of the float): the
// shortest text that reads back as the same double, in Python's layout ("0.001", "5.0",
// "1e+30", "1e-05", "nan", "inf"), where std::to_string gives "0.001000".
std::string param_value(double value);

// Sets the status of an existing run and tags on it (the launcher's view of a job's outcome).
// Synchronous; throws dtrain::Error when the server answers with an error or cannot be reached.
void set_run_outcome(const std::string& tracking_uri, const std::string& run_id, RunStatus status,
                     const std::map<std::string, std::string>& tags);

// Logs a libtorch module as an MLflow model under `artifact_path`: its parameters and buffers
// (torch::save, data/model.pt) and an `MLmodel` file describing them (flavor
// `dtrain_libtorch`). Pass the unwrapped module (not the DDP wrapper). Needs dtrain::dtrain.
void log_model(Run& run, const torch::nn::Module& module,
               const std::string& artifact_path = "model");

}  // namespace dtrain::mlflow
