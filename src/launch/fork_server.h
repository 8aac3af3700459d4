// The agent's side of the fork server (--start-method forkserver; see forkserver/preload.cpp).
//
// A libtorch program spends ~0.6 s (and ~0.9 CPU-s) loading and initialising its shared
// libraries before main(). With N workers per node that is paid N times on the same cores.
// The fork server pays it once: the agent starts the program with libdtrain_forkserver.so
// preloaded, the program's libraries load and initialise, and just before the program's own
// constructors and main() the process forks one worker per local rank. Each worker gets its
// rank's environment and stdout/stderr pipes, leads its own session (so process group), and becomes
// the agent's child (the agent is a child subreaper) once the server exits - from there on the
// agent watches, signals and reaps it exactly like a fork+exec'd worker.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::launch {

// What the launcher needs to know about a program file.
struct ProgramInfo {
  bool dynamic_elf = false;         // an ELF executable with an interpreter (ld.so)
  bool set_id = false;              // set-user/group-ID: LD_PRELOAD is ignored for it
  std::vector<std::string> needed;  // its DT_NEEDED libraries, in order
};
ProgramInfo inspect_program(const std::string& path);

// Whether the fork server can start `path` (a dynamic, non-set-ID ELF without a sanitizer
// runtime), and whether it pays off there: the program links libtorch, libc10 or libdtrain
// directly.
bool fork_server_can_start(const ProgramInfo& info);
bool fork_server_pays_off(const ProgramInfo& info);

// libdtrain_forkserver.so: $DTRAIN_FORKSERVER_LIB, else the one built beside this dtrain (when
// it runs from its build tree), else the one installed with it (found from its own path, so
// an install moved by --prefix works), else the install prefix's; "" when there is none.
std::string fork_server_library();

// One worker of a launch: what it runs with (the spec's entry, forkserver/protocol.h).
struct ForkServerWorker {
  std::vector<std::string> env;   // its whole environment
  std::vector<std::string> argv;  // its own command line; empty: the launch's (argv below)
  std::vector<int> cpus;          // the logical CPUs it runs on; empty: not bound
  int mem_policy = 0;             // 0, or set_mempolicy's MPOL_BIND / MPOL_PREFERRED
  std::vector<int> mem_nodes;     // the policy's NUMA nodes (numactl -m / -p)
};

struct ForkServerLaunch {
  std::vector<std::string> argv;          // the program and its arguments (argv[0]: its path)
  std::vector<std::string> common_env;    // what every worker has in common
  std::vector<ForkServerWorker> workers;  // one per worker
  std::string library;                    // fork_server_library()
  // Non-empty: a warm server's socket (DTRAIN_FORKSERVER_WARM_SOCKET, set by a Tuner that
  // keeps one server for all its trials). The workers are forked from that server's loaded
  // program instead of a new one; they stay the children of a launch server it forks for
  // this launch, which reports their wait statuses (exit_status()).
  std::string warm_socket;
  // The server, so the workers it forks, reads the agent's stdin (else /dev/null).
  bool inherit_stdin = false;
};

// DTRAIN_FORKSERVER_WARM_SOCKET="<socket path>:<program path>": the warm server to use when
// the workers run that program; "" when unset or for another program. `value`: the variable's
// value (a remote agent gets it through --env), nullptr for this process's. A "%h" in the
// path is this host's name (a cluster search keeps a server per host: src/tune/warm_hosts.h).
std::string warm_fork_server_socket(const std::string& program, const char* value = nullptr);

class ForkServer {
 public:
  // Starts the server. out_fds/err_fds get each worker's read ends (non-blocking, CLOEXEC;
  // the caller owns them). Throws dtrain::Error when the program cannot be executed.
  ForkServer(const ForkServerLaunch& launch, std::vector<int>& out_fds, std::vector<int>& err_fds);
  // A standby server for a later attempt: it loads the program's libraries now and then
  // waits, before forking, until start() hands it the workers (launch.workers gives only their
  // number; their contents are ignored). Dropped unstarted, it exits 0 without running any of
  // the program's own code.
  struct Standby {};
  ForkServer(const ForkServerLaunch& launch, std::vector<int>& out_fds, std::vector<int>& err_fds,
             Standby);
  // A standby's go-ahead: the workers, as many as it was made for. Throws dtrain::Error when
  // the server cannot be told (it is gone).
  void start(const std::vector<ForkServerWorker>& workers);
  bool waiting() const { return go_fd_ >= 0; }  // a standby not started yet
  ~ForkServer();
  ForkServer(const ForkServer&) = delete;
  ForkServer& operator=(const ForkServer&) = delete;

  pid_t pid() const { return pid_; }
  int reply_fd() const { return reply_fd_; }  // -1 once the server has said all it will
  bool exec_mode() const { return mode_ != 0; }
  // Why the workers are fork+exec'd (protocol.h): kModeExec, kModeExecCuda; 0 when forked.
  int mode() const { return mode_; }
  bool done() const { return done_; }      // it reported every worker (and exits now)
  bool failed() const { return failed_; }  // it reported an error (and exits now)
  bool warm() const { return warm_; }
  // Warm: the wait status of worker `index` once its launch server reported it.
  bool exit_status(int index, int* status) const {
    auto it = exits_.find(index);
    if (it == exits_.end()) return false;
    *status = it->second;
    return true;
  }

  // Reads what the server has written so far: the (worker index, pid) pairs it forked.
  std::vector<std::pair<int, pid_t>> read_reply();

  // Reaps the server if it has exited (or, with block, waits for it). True once reaped;
  // status() is then its wait status.
  bool reap(bool block);
  bool reaped() const { return reaped_; }
  int status() const { return status_; }

 private:
  void start_warm(const ForkServerLaunch& launch, std::vector<int>& out_fds,
                  std::vector<int>& err_fds);
  pid_t pid_ = -1;
  int reply_fd_ = -1;
  int mode_ = 0;  // dtrain_forkserver::kModeFork
  bool done_ = false;
  bool failed_ = false;
  bool reaped_ = false;
  int status_ = 0;
  int spec_fd_ = -1;                             // a standby's spec memfd, written by start()
  int go_fd_ = -1;                               // a standby's go-ahead pipe (write end)
  std::vector<std::pair<int, int>> write_ends_;  // each worker's stdout/stderr fds in the server
  void launch(const ForkServerLaunch& l, std::vector<int>& out_fds, std::vector<int>& err_fds,
              bool standby);
  std::string pending_;  // a partial record
  bool warm_ = false;
  std::map<int, int> exits_;                  // warm: worker index -> wait status
  std::vector<std::pair<int, pid_t>> early_;  // warm: workers reported while starting
};

}  // namespace dtrain::launch
