// `dtrain run` and MLflow: when MLFLOW_TRACKING_URI and MLFLOW_RUN_ID are set (or
// --mlflow-run-id is given), the launcher sets that run's final status from the job's
// outcome and tags the root cause of a failure (rank, exit code, signal, stderr tail).
// The workers inherit MLFLOW_RUN_ID, so rank 0's dtrain::mlflow::Run logs into the same run.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "dtrain/launch.h"

namespace dtrain::tracking {

class JobOutcome {
 public:
  // Arranges for a failure file when the job reports to MLflow.
  JobOutcome(LaunchOptions& options, std::string run_id_flag);
  ~JobOutcome();
  // Sets the run's status and tags from the launcher's exit code and the failure record:
  // FINISHED (0), KILLED when the job was stopped (SIGINT, SIGTERM or SIGHUP to the launcher,
  // or to an agent of another node), FAILED otherwise (a worker that exited non-zero or died
  // of a signal; a lost store or peer). Warns when it cannot.
  void report(int exit_code);

 private:
  std::string uri_, run_id_, failure_file_;
  bool own_file_ = false;
  // The failure file's time when the job started, if one was there (an earlier job's).
  std::optional<std::filesystem::file_time_type> old_record_time_;
};

}  // namespace dtrain::tracking
