// The Distributor's parts, one concern each (distributor.h is the public side):
//   distributor.cpp   the driver: options, devices, the call's store, run() in both modes
//   code.cpp          finding a function in the loaded objects by offset and build id
//   launcher_job.cpp  the job's command (with its engine, src/engines/) and running it
//   root_cause.cpp    what a failed job reports: the agents' record, the first exception
//   worker.cpp        the worker side: dtrain::init, running the function, its result
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/distributor.h"
#include "dtrain/store.h"
#include "engines/engine.h"
#include "launch/failure.h"

namespace dtrain::distributor {

using json = nlohmann::json;

// The variable a worker finds its call in.
inline constexpr const char* kTaskVariable = engines::kDistributorTaskVariable;

// DTRAIN_DISTRIBUTOR_TASK = HOST:PORT:RUN_ID, split from the right (HOST may be IPv6).
struct TaskSpec {
  std::string host;
  int port = 0;
  std::string id;
  std::string prefix() const { return "/distributor/" + id + "/"; }
};
inline std::optional<TaskSpec> parse_task(const std::string& spec) {
  auto last = spec.rfind(':');
  if (last == std::string::npos || last == 0) return std::nullopt;
  auto mid = spec.rfind(':', last - 1);
  if (mid == std::string::npos || mid == 0) return std::nullopt;
  TaskSpec t;
  t.host = spec.substr(0, mid);
  t.id = spec.substr(last + 1);
  try {
    t.port = std::stoi(spec.substr(mid + 1, last - mid - 1));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (t.port <= 0 || t.port > 65535 || t.id.empty()) return std::nullopt;
  return t;
}

// The store keys of one attempt (restart) of a call.
inline std::string attempt_prefix(const std::string& prefix, int attempt) {
  return prefix + "attempt_" + std::to_string(attempt) + "/";
}

// ---- worker.cpp ----
// argv as init() recorded it; empty when init() was never called.
std::vector<std::string> init_argv();
// True while a worker runs the user's function.
bool in_worker();
// In a worker whose main() did not call init(): tell the driver why, and stop.
[[noreturn]] void fail_uninitialised_worker(const char* task);

// ---- code.cpp ----
json to_json(const detail::CodeRef& r);
detail::CodeRef code_ref_from_json(const json& j);
// The address of `ref` in this process; UsageError when it is not loaded or another build.
void* resolve_code(const detail::CodeRef& ref);
std::string demangle(const char* name);

// ---- launcher_job.cpp ----
struct Job {
  std::vector<std::string> argv;           // the launcher's command line
  std::map<std::string, std::string> env;  // set
  std::vector<std::string> unset;          // variables the launcher must not inherit
};

struct Outcome {
  bool timed_out = false;
  int exit_code = 0;                       // the launcher's
  std::optional<launch::Failure> failure;  // the root cause the agents agreed on
};

// The driver's temporary directory (/tmp/dtrain-distributor-<pid>-XXXXXX, core/owned_dir.h).
inline constexpr char kTempDirStem[] = "dtrain-distributor-";

// The `dtrain` launcher: `configured` (DistributorOptions::launcher) when set, else
// $DTRAIN_LAUNCHER, where it was built or installed, PATH; UsageError when there is none.
std::string find_launcher(const std::string& configured);
// This program's binary (what workers re-execute); UsageError when it was replaced.
std::string self_executable();
std::string unique_id();
std::string format_seconds(std::chrono::milliseconds d);
// The command of a job on its engine; `task`: function mode's task variable, "" for a program.
Job make_job(const DistributorOptions& o, const engines::Placement& placement,
             const std::string& run_id, const std::string& failure_file,
             const std::string& cuda_visible_devices, const std::string& task);
// Runs the job to its end (or the timeout) and reads the failure file.
Outcome run_launcher(const Job& job, const std::string& failure_file, const DistributorOptions& o);

// ---- root_cause.cpp ----
// Throws the error that `out` describes (never returns).
[[noreturn]] void throw_failure(const Outcome& out, const DistributorOptions& o,
                                const std::optional<json>& exception);
// A failed function call: the root cause from the launcher's record, the call store's
// (`prefix` + "failure", from agents on other hosts) and the attempts' first exceptions
// (attempts 0..last_attempt), thrown as WorkerError or TimeoutError. REQUIRES: `out` failed
// (timed out or a non-zero exit code).
[[noreturn]] void throw_call_failure(Outcome out, store::StoreClient& client,
                                     const std::string& prefix, int last_attempt,
                                     const DistributorOptions& o);

}  // namespace dtrain::distributor
