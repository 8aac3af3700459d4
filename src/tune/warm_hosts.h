// Warm fork servers on the hosts of a cluster search (Tuner::fit with an engine that gives
// host commands: ssh).
//
// For each host the driver runs `dtrain tune-warm-host` there (over ssh, as the engine reaches
// its hosts) and keeps that connection for the whole search. The keeper starts a warm fork
// server (warm_fork_server.h: the trials' program with its libraries loaded once, waiting
// before main()) on a Unix socket in /tmp/dtrain-warmhost-ID-HOSTNAME/, says "READY SOCKET"
// and waits for its stdin to end. Every trial's agents get DTRAIN_FORKSERVER_WARM_SOCKET with
// the socket path's host name as "%h", which each agent fills in with its own host name
// (hosts may share /tmp); an agent on a host whose server is not up starts its workers cold.
// The workers of every trial on that host are forked from its server, each launch under a
// launch server of its own, so a crashed worker ends only its own trial. When the search ends
// (or the driver dies: its ssh connections close) each keeper's stdin ends: it asks its server
// to quit, reaps it and removes its directory, and nothing is left on the host.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engines/engine.h"

namespace dtrain::tune::detail {

class WarmHosts {
 public:
  // Starts a keeper on every host at once and waits (at most 30 s) until each says READY or
  // NONE; a host that does not is told to stop. nullptr when no host has a server (or
  // DTRAIN_TUNE_WARM_FORKSERVER=0, or this program cannot be served). `env`: what the trials'
  // processes get on top of the hosts' environment (TuneOptions::env). verbose: one line per
  // host on stderr.
  static std::unique_ptr<WarmHosts> start(const std::vector<engines::HostCommand>& hosts,
                                          const std::map<std::string, std::string>& env,
                                          bool verbose);
  // Ends every keeper (stdin closed), waits for them (bounded: 20 s, then SIGKILL).
  ~WarmHosts();
  WarmHosts(const WarmHosts&) = delete;
  WarmHosts& operator=(const WarmHosts&) = delete;

  // The value of DTRAIN_FORKSERVER_WARM_SOCKET for the trials' agents ("%h" in the path).
  std::string agent_env() const { return socket_template_ + ":" + program_; }
  // Hosts whose server is up.
  const std::vector<std::string>& ready_hosts() const { return ready_; }

 private:
  WarmHosts() = default;
  struct Keeper {
    std::string host;
    pid_t pid = -1;
    int in_fd = -1;
    int out_fd = -1;
  };
  std::vector<Keeper> keepers_;
  std::vector<std::string> ready_;
  std::string socket_template_, program_;
};

// `dtrain tune-warm-host` (a keeper, above): reads {"program", "socket", "env"} as one JSON
// line on stdin, starts the server, prints "READY SOCKET" or "NONE WHY", and waits for stdin
// to end. Returns the exit code.
int warm_host_main();

}  // namespace dtrain::tune::detail
