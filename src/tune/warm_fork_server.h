// One fork server kept warm for all the trials of a search (Tuner::fit, local mode).
//
// Each trial is a Distributor job: a `dtrain run` agent whose workers re-execute this
// program. Started cold, every trial's fork server loads libtorch again (0.5-1.4 s on this
// project's loaded 2-core machines, most of a short trial's start). The warm server is this
// program started once with libdtrain_forkserver.so preloaded and DTRAIN_FORKSERVER_WARM set:
// its libraries load and initialise, and it waits before the program's constructors and
// main() for launches on a unix socket. Each trial's agent (told by
// DTRAIN_FORKSERVER_WARM_SOCKET) sends its workers' spec there; the server forks a launch
// server for it, which forks the workers and stays their parent to report how each ended
// (src/launch/forkserver/protocol.h). A crashing trial takes down only its own launch server
// and workers; the warm server itself runs no user code. When it cannot be reached the agent
// starts its workers the usual way.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>

namespace dtrain::tune::detail {

class WarmForkServer {
 public:
  // nullptr when it does not apply or cannot start (no libdtrain_forkserver.so, a program
  // the fork server cannot start, DTRAIN_TUNE_WARM_FORKSERVER=0); `env` is what every trial's
  // processes get on top of this process's environment (TuneOptions::env). `program`: what
  // the trials' workers run ("": this program); `dir`: the socket's directory, created here
  // (mode 0700; nullptr when it exists), "" for a new /tmp/dtrain-warm-PID-XXXXXX. The server
  // ends with this process (it is its parent).
  static std::unique_ptr<WarmForkServer> start(const std::map<std::string, std::string>& env,
                                               const std::string& program = "",
                                               const std::string& dir = "");
  ~WarmForkServer();  // SIGKILL, reaped (bounded), socket removed
  WarmForkServer(const WarmForkServer&) = delete;
  WarmForkServer& operator=(const WarmForkServer&) = delete;

  // The value of DTRAIN_FORKSERVER_WARM_SOCKET for the trials' agents.
  std::string agent_env() const { return socket_ + ":" + program_; }
  const std::string& socket() const { return socket_; }
  pid_t pid() const { return pid_; }

 private:
  WarmForkServer() = default;
  pid_t pid_ = -1;
  std::string dir_, socket_, program_;
};

}  // namespace dtrain::tune::detail
