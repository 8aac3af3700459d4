// Running real processes from tests: fork/exec with stdout and stderr captured separately,
// a hard timeout, and checks that processes are really gone.
//
// Every child is started in a process group of its own (so a timeout can take down the
// child and anything it forked into its group) with PR_SET_PDEATHSIG, so a test binary
// that crashes or is killed never leaves a launcher running behind it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace dtrain::test {

struct RunOptions {
  std::vector<std::string> env;    // "KEY=VALUE" added to (or replacing in) our environment
  std::vector<std::string> unset;  // names removed from the child's environment
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

struct RunResult {
  int exit_code = -1;  // 128 + N when killed by signal N
  std::string out;
  std::string err;
  double elapsed = 0;  // seconds from start to exit
  bool timed_out = false;
};

// A started child whose output is collected as it comes. Not copyable; the destructor
// SIGKILLs the child's process group if it is still running, and reaps it.
class Process;
std::vector<RunResult> finish_all(const std::vector<Process*>& processes,
                                  std::chrono::milliseconds timeout);

class Process {
 public:
  static Process start(const std::vector<std::string>& argv, const RunOptions& options = {});
  Process(Process&& other) noexcept;
  Process& operator=(Process&&) = delete;
  Process(const Process&) = delete;
  ~Process();

  pid_t pid() const { return pid_; }         // also its process group id
  int stdout_fd() const { return out_fd_; }  // read ends; -1 once at EOF
  int stderr_fd() const { return err_fd_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  bool exited() const { return exited_; }
  std::string command_line() const;

  // Reads whatever output is ready (waiting up to `wait`) and notices the child's exit.
  void pump(std::chrono::milliseconds wait);
  // Pumps until `pred(out, err)` holds; false at the deadline or when the child exited
  // without it holding.
  bool wait_for(const std::function<bool(const std::string&, const std::string&)>& pred,
                std::chrono::milliseconds timeout);
  // Waits for the exit and the end of output. At the timeout the group is SIGKILLed and
  // the test fails (ADD_FAILURE), with whatever output was seen.
  RunResult finish(std::chrono::milliseconds timeout);
  // Sends `sig` to the child only (not its group).
  void signal(int sig) const;
  // SIGKILLs the child's process group and reaps the child.
  void kill_group();

 private:
  friend std::vector<RunResult> finish_all(const std::vector<Process*>&, std::chrono::milliseconds);
  Process() = default;
  void reap(int flags);
  void close_output();
  RunResult result() const;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_;
  std::string err_;
  bool exited_ = false;
  int exit_code_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point end_;
  std::vector<std::string> argv_;
};

// finish_all (declared above Process): pumps several processes at once until every one
// has exited and closed its output (so agents of one multi-node job never stall on a full
// pipe while we wait on another). Returns their results in order; at the timeout the ones
// still running are killed and the test fails.

// Runs argv to completion: start() + finish().
RunResult run_command(const std::vector<std::string>& argv, const RunOptions& options = {});

// True when /proc/PID is gone or the process is a zombie (state Z or X): it no longer runs,
// whether or not its parent has reaped it yet.
bool process_dead(pid_t pid);
// Polls until every pid is dead; false if one is still alive at the deadline.
bool wait_dead(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout);

}  // namespace dtrain::test
