// The root cause of a failed job attempt, as every agent reports it and every reader reads it:
// one typed record with one JSON codec. The agents agree on it through the job's store
// ("failed", compare_set), `dtrain run --failure-file` writes it, `--failure-store` stores it
// for a driver on another host, the Distributor turns it into a WorkerError, and
// `dtrain run`'s MLflow hook (tracking/job_outcome.cpp) tags a run with it.
//
// JSON fields (LaunchOptions::failure_file documents them for users): time, host, node_rank,
// rank (-1: not a worker), local_rank, pid, exit_code, signal, reason, stderr_tail (lines),
// error_file, error_file_contents, final, collectives, membership. from_json() takes what a
// record holds and defaults the rest, so a reader never fails on an older or partial record.
#pragma once

#include <nlohmann/json.hpp>

#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::launch {

struct Failure {
  std::string time;  // UTC, ISO 8601 with milliseconds
  std::string host;
  int node_rank = 0;
  int rank = -1;  // -1: not a worker (an agent was signalled or lost)
  int local_rank = -1;
  int pid = 0;
  int exit_code = 1;   // what dtrain exits with
  int signal = 0;      // the worker died of this signal (exit_code = 128 + signal)
  std::string reason;  // for failures that are not a worker's exit
  std::vector<std::string> stderr_tail;
  std::string error_file;
  std::string error_file_contents;
  bool final = false;  // no restart: the agent itself was told to stop
  // Not a failure: an elastic job restarts its workers to admit a waiting node.
  bool membership = false;
  // What the ranks last published from their collective flight recorders (diagnosis/records.h).
  std::vector<std::string> collectives;

  nlohmann::json to_json() const;
  static Failure from_json(const nlohmann::json& j);
  // The record in `text`; nullopt when it is not a JSON object.
  static std::optional<Failure> parse(const std::string& text);
  // The record in the file at `path`; nullopt when there is none or it is not one.
  static std::optional<Failure> read_file(const std::string& path);

  // "rank 3 on n2 (node 1) died of SIGKILL, exit code 137".
  std::string one_line() const;
  // The console's root-cause report (`stderr_lines`: --tail-lines, for the header).
  std::string summary(int stderr_lines) const;
};

// "SIGKILL" (or "signal N").
std::string signal_name(int sig);
// TORCHELASTIC_ERROR_FILE as PyTorch's @record writes it, shown as the message and the
// traceback; anything else as it is.
std::string readable_error_file(const std::string& contents);
// The launcher's own failure (an error of its options, its rendezvous or its store; not a
// worker's) written to TORCHELASTIC_ERROR_FILE when whoever started it set one, as torchrun's
// @record writes the exception that ends it: {"message": {"message": "<Type>: <what>",
// "extraInfo": {"py_callstack": ..., "timestamp": "<unix seconds>"}}}. Never throws.
void record_launcher_error(const std::exception& e);

}  // namespace dtrain::launch
