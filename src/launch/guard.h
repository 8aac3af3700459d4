// The guard: a tiny process that outlives a SIGKILLed agent by a moment, to take its
// workers' process groups down with it.
//
// PR_SET_PDEATHSIG already kills each worker when the agent dies, but not what a worker
// started (its children). The agent forks the guard first thing, before it starts any
// thread, and tells it each worker's process group as it spawns and reaps them. When the
// guard's pipe reaches EOF - the agent exited, however it exited - the guard SIGKILLs every
// group still registered, removes the agent's run directory if the agent left it (its own
// temporary directory: a SIGKILLed agent cannot), and exits. It ignores SIGINT/SIGTERM/SIGHUP and
// sits in a session of its own, so signals aimed at the agent's group do not take it first.
#pragma once

#include <sys/types.h>

#include <string>

namespace dtrain::launch {

// The process groups a guard tracks, so the most workers one agent starts (--nproc-per-node).
inline constexpr int kMaxLocalWorkers = 8192;

class Guard {
 public:
  // Forks the guard. Between fork and _exit the child only makes async-signal-safe calls
  // (read, kill, close, sigaction, setsid, and openat, getdents64, lseek, unlinkat for the run
  // directory), so this is safe in a multithreaded process.
  Guard();
  ~Guard();  // closes the pipe: the guard kills what is still registered, then exits
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

  void watch(pid_t pgid);   // kill this group if the agent dies
  void forget(pid_t pgid);  // the agent has cleaned this group up itself
  // Remove the directory tree `dir` (an absolute path, < 4 KiB) when the agent is gone, unless
  // keep_dir() came first: the agent's own temporary directory, which it removes itself on every
  // exit but a SIGKILL.
  void remove_dir_on_exit(const std::string& dir);
  void keep_dir();  // the agent removed it itself (or it is not the guard's to remove)
  pid_t pid() const { return pid_; }

 private:
  void send(int op, pid_t pgid);
  int fd_ = -1;
  pid_t pid_ = -1;
};

}  // namespace dtrain::launch
