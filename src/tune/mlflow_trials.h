// dtrain::tune's MLflow logging (the role of Ray's MLflowLoggerCallback): the search is a
// parent run, every trial a child run of it (tag mlflow.parentRunId) with its config as
// params and every reported metric as history (step = training_iteration). The driver logs
// (it sees every report); the trials' own processes are not given the tracking URI, so no
// extra runs appear per trial.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "dtrain/mlflow.h"
#include "dtrain/tune.h"

namespace dtrain::tune::detail {

class MlflowTrials {
 public:
  // Inactive when neither `tracking_uri` nor MLFLOW_TRACKING_URI is set. `parent_run_id`:
  // a resumed search's parent run, continued (empty: a new one named `search_name`).
  MlflowTrials(std::string tracking_uri, std::string experiment, const std::string& search_name,
               const std::string& parent_run_id, const Config& param_space);
  bool active() const { return parent_.active(); }
  std::string parent_run_id() const { return parent_.id(); }
  std::string tracking_uri() const { return uri_; }

  // Opens the trial's run on its first start (or continues `run_id`, saved by an earlier
  // driver); logs the config as params once, and as a tag on every start (PBT changes it).
  // Returns the run's id ("" when inactive).
  // `name`: the run's name and "trial_name" tag, Ray's str(trial) (trial_names.h trial_name).
  std::string trial_started(const std::string& trial_id, const std::string& name,
                            const Config& config, const std::string& run_id, bool first_start);
  // Logs every finite number of `result` (booleans as 0/1) as a metric at step
  // training_iteration; the Tuner passes it flattened, as Ray's MLflowLoggerCallback logs it.
  void trial_result(const std::string& trial_id, const Result& result);
  // The trial's run ends FINISHED (Terminated) or FAILED (Error).
  void trial_ended(const std::string& trial_id, TrialStatus status, const std::string& error);
  // Ends the parent run (FINISHED) and any trial run still open (KILLED: a paused trial).
  void end();
  ~MlflowTrials();

 private:
  std::string uri_, experiment_;
  mlflow::Run parent_;
  std::map<std::string, mlflow::Run> runs_;
};

// "a/b" keys for nested configs; strings as they are, other values as JSON.
std::map<std::string, std::string> flatten_config(const Config& config);

// Python's float(value) for a result's value: numbers (NaN and infinities too), booleans as
// 0/1, strings float() parses ("1_000", " 2e3 ", "nan", "-Infinity"); nullopt where float()
// raises (other strings, None, lists, objects).
std::optional<double> python_float(const Config& value);

}  // namespace dtrain::tune::detail
