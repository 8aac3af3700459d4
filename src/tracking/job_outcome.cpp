#include "tracking/job_outcome.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dtrain/mlflow.h"

namespace dtrain::tracking {

JobOutcome::JobOutcome(LaunchOptions& options, std::string run_id_flag) {
  const char* uri = std::getenv("MLFLOW_TRACKING_URI");
  const char* id = std::getenv("MLFLOW_RUN_ID");
  run_id_ = !run_id_flag.empty() ? run_id_flag : id ? id : "";
  uri_ = uri ? uri : "";
  if (uri_.empty() || run_id_.empty()) {
    if (!run_id_flag.empty()) {
      std::cerr << "dtrain run: warning: --mlflow-run-id needs MLFLOW_TRACKING_URI; the job's "
                   "outcome is not logged"
                << std::endl;
    }
    uri_.clear();
    return;
  }
  // Workers (rank 0) log into the same run.
  setenv("MLFLOW_RUN_ID", run_id_.c_str(), 1);
  if (options.failure_file.empty()) {
    options.failure_file = (std::filesystem::temp_directory_path() /
                            ("dtrain-failure-" + std::to_string(getpid()) + ".json"))
                               .string();
    own_file_ = true;
  }
  failure_file_ = options.failure_file;
}

JobOutcome::~JobOutcome() {
  if (own_file_) {
    std::error_code ec;
    std::filesystem::remove(failure_file_, ec);
  }
}

void JobOutcome::report(int exit_code) {
  if (uri_.empty()) return;
  std::map<std::string, std::string> tags{{"dtrain.job_exit_code", std::to_string(exit_code)}};
  auto status = exit_code == 0 ? mlflow::RunStatus::Finished
                : exit_code >= 128
                    ? mlflow::RunStatus::Killed  // the launcher was stopped by a signal
                    : mlflow::RunStatus::Failed;
  std::ifstream f(failure_file_);
  if (exit_code != 0 && f) {
    try {
      auto j = nlohmann::json::parse(f);
      auto str = [&](const char* k) {
        if (!j.contains(k) || j[k].is_null()) return std::string();
        return j[k].is_string() ? j[k].get<std::string>() : j[k].dump();
      };
      tags["dtrain.failed_rank"] = str("rank");
      tags["dtrain.failed_host"] = str("host");
      tags["dtrain.failed_exit_code"] = str("exit_code");
      tags["dtrain.failed_signal"] = str("signal");
      tags["dtrain.failure_reason"] = str("reason");
      std::string tail;
      if (j.contains("stderr_tail") && j["stderr_tail"].is_array()) {
        for (const auto& line : j["stderr_tail"])
          tail += (line.is_string() ? line.get<std::string>() : line.dump()) + "\n";
      }
      if (tail.size() > 4000) tail = tail.substr(tail.size() - 4000);
      tags["dtrain.stderr_tail"] = tail;
    } catch (const std::exception& e) {
      std::cerr << "dtrain run: warning: cannot read the failure file " << failure_file_ << ": "
                << e.what() << std::endl;
    }
  }
  try {
    mlflow::set_run_outcome(uri_, run_id_, status, tags);
  } catch (const std::exception& e) {
    std::cerr << "dtrain run: warning: could not set MLflow run " << run_id_ << " to "
              << mlflow::to_string(status) << " at " << uri_ << ": " << e.what() << std::endl;
  }
}

}  // namespace dtrain::tracking
