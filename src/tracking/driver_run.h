// The Distributor's driver-side MLflow run: with MLFLOW_TRACKING_URI set, the driver opens a
// run before the job and passes its id to the workers (DTRAIN_MLFLOW_PARENT_RUN_ID), so the
// run rank 0 opens nests under it; the driver's run ends with the job's outcome. With
// MLFLOW_RUN_ID set too (a run the user chose) it opens none: the job logs into that run.
#pragma once

#include <map>
#include <string>

#include "dtrain/mlflow.h"

namespace dtrain::tracking {

class DriverRun {
 public:
  // `worker_env`: the environment the job will get; gains DTRAIN_MLFLOW_PARENT_RUN_ID when a
  // driver run is opened (not when it holds MLFLOW_RUN_ID).
  explicit DriverRun(std::map<std::string, std::string>& worker_env);
  ~DriverRun();  // a job left without end() (an exception) ends KILLED
  void end(int exit_code, bool timed_out);

 private:
  mlflow::Run run_;
};

}  // namespace dtrain::tracking
