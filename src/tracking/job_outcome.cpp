#include "tracking/job_outcome.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "dtrain/mlflow.h"
#include "launch/failure.h"

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
  std::error_code ec;
  if (std::filesystem::exists(failure_file_, ec))
    old_record_time_ = std::filesystem::last_write_time(failure_file_, ec);
}

JobOutcome::~JobOutcome() {
  if (own_file_) {
    std::error_code ec;
    std::filesystem::remove(failure_file_, ec);
  }
}

namespace {

// MLflow's KILLED is a run its user stopped; a crash is FAILED. The job was stopped when the
// launcher itself got SIGINT, SIGTERM, SIGHUP or SIGQUIT (it exits 128 + N and writes no failure
// record) or an agent on another node did (its record: no rank, that exit code). A worker that died
// of a signal, SIGKILL and SIGTERM included, failed.
bool stopped_by_signal(int exit_code) {
  return exit_code == 128 + SIGINT || exit_code == 128 + SIGTERM || exit_code == 128 + SIGHUP ||
         exit_code == 128 + SIGQUIT;
}

}  // namespace

void JobOutcome::report(int exit_code) {
  if (uri_.empty()) return;
  std::map<std::string, std::string> tags{{"dtrain.job_exit_code", std::to_string(exit_code)}};
  std::optional<launch::Failure> failure;
  // A record this job did not write (a --failure-file left by an earlier one) is not its outcome.
  std::error_code ec;
  if (exit_code != 0 && std::filesystem::exists(failure_file_, ec) &&
      (!old_record_time_ ||
       std::filesystem::last_write_time(failure_file_, ec) != *old_record_time_)) {
    failure = launch::Failure::read_file(failure_file_);
    if (!failure) {
      std::cerr << "dtrain run: warning: cannot read the failure file " << failure_file_
                << ": not a failure record" << std::endl;
    }
  }
  const bool killed = stopped_by_signal(exit_code) &&
                      (!failure || (failure->rank < 0 && failure->exit_code == exit_code));
  auto status = exit_code == 0 ? mlflow::RunStatus::Finished
                : killed       ? mlflow::RunStatus::Killed
                               : mlflow::RunStatus::Failed;
  if (const auto& f = failure) {
    tags["dtrain.failed_rank"] = std::to_string(f->rank);
    tags["dtrain.failed_host"] = f->host;
    tags["dtrain.failed_exit_code"] = std::to_string(f->exit_code);
    tags["dtrain.failed_signal"] = std::to_string(f->signal);
    tags["dtrain.failure_reason"] = f->reason;
    std::string tail;
    for (const auto& line : f->stderr_tail) {
      tail += line;
      tail += '\n';
    }
    if (tail.size() > 4000) tail = tail.substr(tail.size() - 4000);
    tags["dtrain.stderr_tail"] = tail;
  }
  try {
    mlflow::set_run_outcome(uri_, run_id_, status, tags);
  } catch (const std::exception& e) {
    std::cerr << "dtrain run: warning: could not set MLflow run " << run_id_ << " to "
              << mlflow::to_string(status) << " at " << uri_ << ": " << e.what() << std::endl;
  }
}

}  // namespace dtrain::tracking
