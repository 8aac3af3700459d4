// Starting and stopping one worker process.
//
// Workers are fork+exec'd (never a bare fork of a process that may run libtorch threads:
// between fork and exec the child only makes async-signal-safe calls). Each worker leads its
// own session (setsid, as torchrun 2.x starts its workers), hence its own process group:
// signalling -pgid reaches the worker and everything it started that stayed in its group;
// PR_SET_PDEATHSIG makes the kernel SIGKILL it if the agent dies first.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace dtrain::launch {

struct SpawnSpec {
  std::vector<std::string> argv;  // argv[0] is the path executed (absolute or relative to cwd)
  std::vector<std::string> env;   // the complete environment, "KEY=VALUE"
  std::vector<int> inherit_fds;   // these stay open (same numbers) in the new process
  // If >= 0: env[own_pid_env] is "NAME=" followed by 10 characters, which the new process
  // overwrites with its own pid (zero-padded) before exec.
  int own_pid_env = -1;
  // Non-empty: the new process runs on these logical CPUs only (sched_setaffinity before exec).
  std::vector<int> cpus;
  // The new process reads this one's stdin (torchrun's workers inherit it); else /dev/null.
  bool inherit_stdin = false;
};

struct SpawnedProcess {
  pid_t pid = -1;      // also its session and process group id
  int stdout_fd = -1;  // read ends of its stdout/stderr pipes (non-blocking, CLOEXEC); caller owns
  int stderr_fd = -1;
};

// Starts the process. Throws dtrain::Error when fork fails or the program cannot be
// executed (the message carries exec's errno text).
SpawnedProcess spawn_process(const SpawnSpec& spec);

// The environment of this process as "KEY=VALUE" strings.
std::vector<std::string> current_environment();

// Replaces this process with argv (execvp: argv[0] looked up on PATH), for the launchers' worker
// shims (`dtrain deepspeed-exec`, `dtrain horovod-exec`). Returns only when exec failed: after
// "<who>: cannot run '<argv[0]>': <why>" on stderr, with 127, the shell's exit code for that.
int exec_program(std::vector<std::string> argv, const std::string& who);

}  // namespace dtrain::launch
