// Where an MLflow run's data goes: the REST API of a tracking server, or MLflow's file-store
// layout on disk. Internal to src/tracking.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dtrain/error.h"
#include "dtrain/mlflow.h"

namespace dtrain::mlflow::detail {

// runs/log-batch limits of MLflow's REST API.
constexpr size_t kMaxMetrics = 1000;  // also the limit on entries of all kinds together
constexpr size_t kMaxParams = 100;
constexpr size_t kMaxTags = 100;

int64_t now_ms();

// `s` percent-encoded for a URL path or query (letters, digits, -_.~ and '/' kept).
std::string url_escape(const std::string& s);

// A metric value as protobuf's JSON mapping writes a double, and so MLflow's Python client
// (message_to_json in its REST store): a number, or the strings "NaN", "Infinity" and
// "-Infinity", which the server reads back as those values (JSON has no literal for them, and
// the `null` a JSON library writes instead makes the server reject the whole request).
nlohmann::json metric_value_json(double value);

struct Entry {
  enum Kind { Metric = 0, Param = 1, Tag = 2 } kind;
  std::string key;
  std::string text;   // param or tag value
  double number = 0;  // metric value
  int64_t timestamp = 0;
  int64_t step = 0;
};

struct RunInfo {
  std::string run_id;
  std::string experiment_id;
  std::string artifact_uri;
  std::string status;  // MLflow's name ("RUNNING", "FINISHED", ...); "" when not read
};

// The server answered with a client error (4xx): retrying the same request cannot help.
class RejectedError : public Error {
 public:
  using Error::Error;
};

// What the MLflow REST API answers, read into what dtrain needs. `response` is the body the
// server sent; a body that is not JSON, or lacks the field or has it with another type,
// throws NetworkError naming the endpoint and what was expected (never a json exception: the
// caller decides whether to fall back to the file store on that).
// experiments/create -> experiment_id
std::string experiment_id_of_created(const std::string& response);
// experiments/get-by-name -> experiment.experiment_id
std::string experiment_id_of_found(const std::string& response);
// runs/create and runs/get -> run.info (run_id; experiment_id, else `experiment_id`;
// artifact_uri, else ""; status, else "").
RunInfo run_info_of(const std::string& response, const std::string& endpoint,
                    const std::string& experiment_id);

class Store {
 public:
  virtual ~Store() = default;
  // The run goes to the experiment named `experiment` (created when missing; an
  // `experiment_id` that is not its id is a UsageError), else to the existing experiment
  // `experiment_id` (a UsageError when there is none), as mlflow.start_run() picks it from
  // MLFLOW_EXPERIMENT_NAME and MLFLOW_EXPERIMENT_ID; "Default" when both are empty.
  virtual RunInfo create_run(const std::string& experiment, const std::string& experiment_id,
                             const std::string& run_name,
                             const std::map<std::string, std::string>& tags) = 0;
  virtual RunInfo get_run(const std::string& run_id) = 0;
  // The largest step of the run's metrics whose key starts with `prefix`; -1 when none.
  virtual int64_t max_metric_step(const std::string& run_id, const std::string& prefix) = 0;
  virtual void log_batch(const std::string& run_id, const std::vector<Entry>& entries) = 0;
  virtual void update_run(const std::string& run_id, RunStatus status) = 0;
  virtual void upload_artifact(const RunInfo& run, const std::string& local_file,
                               const std::string& artifact_path) = 0;
};

class RestStore : public Store {
 public:
  RestStore(std::string base_url, std::chrono::milliseconds timeout);
  RunInfo create_run(const std::string& experiment, const std::string& experiment_id,
                     const std::string& run_name,
                     const std::map<std::string, std::string>& tags) override;
  RunInfo get_run(const std::string& run_id) override;
  int64_t max_metric_step(const std::string& run_id, const std::string& prefix) override;
  void log_batch(const std::string& run_id, const std::vector<Entry>& entries) override;
  void update_run(const std::string& run_id, RunStatus status) override;
  void upload_artifact(const RunInfo& run, const std::string& local_file,
                       const std::string& artifact_path) override;

 private:
  std::string call(const std::string& method, const std::string& endpoint, const std::string& body,
                   bool allow_not_found = false, long* status = nullptr);
  std::string experiment_id_by_name(const std::string& name, const std::string& expected_id);
  std::string base_;
  std::chrono::milliseconds timeout_;
};

// MLflow's file store: ROOT/<experiment id>/{meta.yaml, <run id>/{meta.yaml, metrics/, params/,
// tags/, artifacts/}}; readable by MLflow's own client and `mlflow ui --backend-store-uri ROOT`.
class FileStore : public Store {
 public:
  // `adopt_experiment_ids`: an experiment id that the store lacks is created (the fallback of
  // a run meant for a server keeps the server's id) rather than refused.
  explicit FileStore(std::string root, bool adopt_experiment_ids = false);
  RunInfo create_run(const std::string& experiment, const std::string& experiment_id,
                     const std::string& run_name,
                     const std::map<std::string, std::string>& tags) override;
  RunInfo get_run(const std::string& run_id) override;
  int64_t max_metric_step(const std::string& run_id, const std::string& prefix) override;
  void log_batch(const std::string& run_id, const std::vector<Entry>& entries) override;
  void update_run(const std::string& run_id, RunStatus status) override;
  void upload_artifact(const RunInfo& run, const std::string& local_file,
                       const std::string& artifact_path) override;
  // Writes the directory of a run that was started elsewhere (same ids) if it is missing.
  void adopt_run(const RunInfo& run, RunStatus status);

 private:
  std::string experiment_id_for(const std::string& experiment, const std::string& id = "");
  std::string run_dir(const std::string& run_id);
  void write_run_meta(const std::string& dir, const RunInfo& run, const std::string& run_name,
                      int status, int64_t start, int64_t end);
  std::string root_;
  bool adopt_experiment_ids_;
};

// "http(s)://..." -> RestStore; "file:/path", "file:///path" or a path -> FileStore.
std::unique_ptr<Store> make_store(const std::string& uri, std::chrono::milliseconds timeout);

}  // namespace dtrain::mlflow::detail
