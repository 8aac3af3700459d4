// `dtrain run` and MLflow: when MLFLOW_TRACKING_URI and MLFLOW_RUN_ID are set (or
// --mlflow-run-id is given), the launcher sets that run's final status from the job's
// outcome and tags the root cause of a failure (rank, exit code, signal, stderr tail).
// The workers inherit MLFLOW_RUN_ID, so rank 0's dtrain::mlflow::Run logs into the same run.
#pragma once

#include <string>

#include "dtrain/launch.h"

namespace dtrain::tracking {

class JobOutcome {
 public:
  // Arranges for a failure file when the job reports to MLflow.
  JobOutcome(LaunchOptions& options, std::string run_id_flag);
  ~JobOutcome();
  // Sets the run's status and tags from the launcher's exit code; warns when it cannot.
  void report(int exit_code);

 private:
  std::string uri_, run_id_, failure_file_;
  bool own_file_ = false;
};

}  // namespace dtrain::tracking
