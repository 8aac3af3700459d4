#include "tracking/driver_run.h"

namespace dtrain::tracking {

DriverRun::DriverRun(std::map<std::string, std::string>& worker_env) {
  auto uri = worker_env.find("MLFLOW_TRACKING_URI");
  if (uri == worker_env.end() || uri->second.empty()) return;
  // A run the user chose (MLFLOW_RUN_ID): the job logs into it, as under `dtrain run`, whose
  // outcome tags and status it gets (tracking/job_outcome.h); no run of the driver's own.
  if (auto chosen = worker_env.find("MLFLOW_RUN_ID");
      chosen != worker_env.end() && !chosen->second.empty())
    return;
  run_ = mlflow::Run::start({.tracking_uri = uri->second,
                             .run_name = "distributor",
                             .tags = {{"dtrain.role", "driver"}}});
  if (!run_.active()) return;
  worker_env["DTRAIN_MLFLOW_PARENT_RUN_ID"] = run_.id();
  worker_env.erase("MLFLOW_RUN_ID");
}

DriverRun::~DriverRun() {
  if (run_.active()) run_.end(mlflow::RunStatus::Killed);
}

void DriverRun::end(int exit_code, bool timed_out) {
  if (!run_.active()) return;
  run_.set_tag("dtrain.job_exit_code", std::to_string(exit_code));
  if (timed_out) run_.set_tag("dtrain.timed_out", "true");
  run_.end(exit_code == 0 && !timed_out ? mlflow::RunStatus::Finished : mlflow::RunStatus::Failed);
  run_ = mlflow::Run();
}

}  // namespace dtrain::tracking
