// The guard: a tiny process that outlives a SIGKILLed agent by a moment, to take its
// workers' process groups down with it.
//
// PR_SET_PDEATHSIG already kills each worker when the agent dies, but not what a worker
// started (its children). The agent forks the guard first thing, before it starts any
// thread, and tells it each worker's process group as it spawns and reaps them. When the
// guard's pipe reaches EOF - the agent exited, however it exited - the guard SIGKILLs every
// group still registered and exits. It ignores SIGINT/SIGTERM/SIGHUP and sits in a session
// of its own, so signals aimed at the agent's group do not take it first.
#pragma once

#include <sys/types.h>

namespace dtrain::launch {

class Guard {
 public:
  // Forks the guard. Between fork and _exit the child only makes async-signal-safe calls
  // (read, kill, close, sigaction, setsid), so this is safe in a multithreaded process.
  Guard();
  ~Guard();  // closes the pipe: the guard kills what is still registered, then exits
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

  void watch(pid_t pgid);   // kill this group if the agent dies
  void forget(pid_t pgid);  // the agent has cleaned this group up itself
  pid_t pid() const { return pid_; }

 private:
  void send(int op, pid_t pgid);
  int fd_ = -1;
  pid_t pid_ = -1;
};

}  // namespace dtrain::launch
