// A kept driver service: the Python driver of a cluster engine (python/dtrain/_cluster.py's
// serve: Spark's `spark.py --serve`, Ray's `ray.py --serve`) started once per program and
// reused by every job, as a notebook keeps its SparkSession or its ray.init().
//
//     DriverService& s = ...;  // one per engine, a static
//     std::string sock = s.ensure(key, argv, extra, env, start_timeout, hints);
//     // run `python .../ray.py --client SOCK ...` per job; s.query("{...}") for the cluster's room
//
// Protocol (python/dtrain/_cluster.py): the service listens on a Unix socket in a private
// temporary directory; this process holds a control connection ("CONTROL\n", answered
// "READY ID\n") whose closing stops it, and the service also stops when this process is gone.
// Thread-safe. At exit (a static destructor) the service is stopped and waited for.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/owned_dir.h"
#include "core/thread_annotations.h"

namespace dtrain::param {
struct String;
}

namespace dtrain::detail {

class DriverService {
 public:
  // engine: the engine's name, for messages ("spark", "ray").
  explicit DriverService(std::string engine);
  ~DriverService();
  DriverService(const DriverService&) = delete;
  DriverService& operator=(const DriverService&) = delete;

  // What starting a service runs: `argv` + {"--serve", SOCKET, "--parent-pid", PID} + `extra`,
  // with `env` set (the rest inherited), in its own process group, stdin from /dev/null.
  struct Start {
    std::vector<std::string> argv;
    std::vector<std::string> extra;
    std::vector<std::pair<std::string, std::string>> env;
    std::chrono::seconds timeout{300};  // for the READY answer
    std::string what;  // the service in messages ("the PySpark driver (spark-submit ...)")
    std::string hint;  // what to check when it does not start
  };
  // The socket of the running service for `key`, starting one (after stopping a service of
  // another key, or one that has stopped). Throws Error when it exits before answering,
  // TimeoutError after start.timeout (the service is stopped then).
  std::string ensure(const std::string& key, const Start& start) DTRAIN_EXCLUDES(mu_);
  // The READY answer's id of the running service; "" when none runs.
  std::string id() DTRAIN_EXCLUDES(mu_);
  // One QUERY (a JSON object) to the running service: its answer line, nullopt when none runs
  // or it does not answer within `timeout`.
  std::optional<std::string> query(const std::string& json, std::chrono::milliseconds timeout)
      DTRAIN_EXCLUDES(mu_);
  // Stops the service (if any) and waits (bounded: 25 s, then SIGKILL) for it to exit.
  void stop() DTRAIN_EXCLUDES(mu_);

 private:
  bool alive_locked() DTRAIN_REQUIRES(mu_);
  void stop_locked() DTRAIN_REQUIRES(mu_);

  const std::string engine_;
  Mutex mu_;
  pid_t pid_ DTRAIN_GUARDED_BY(mu_) = -1;    // the service, leader of its own process group
  int control_ DTRAIN_GUARDED_BY(mu_) = -1;  // closing it stops the service
  pid_t owner_ DTRAIN_GUARDED_BY(mu_) = -1;  // the process that started it (a forked child
                                             // leaves it alone)
  // The socket's directory, /tmp/dtrain-<engine>-<pid>-XXXXXX: removed when the service stops,
  // or by the next one made on the host when this process was killed.
  std::unique_ptr<OwnedTempDir> dir_ DTRAIN_GUARDED_BY(mu_);
  std::string socket_ DTRAIN_GUARDED_BY(mu_), key_ DTRAIN_GUARDED_BY(mu_),
      id_ DTRAIN_GUARDED_BY(mu_);
};

// A file of dtrain's Python package (python/dtrain/NAME): $VARIABLE when set, else the source
// tree's, else the installed one beside the running program (PREFIX/bin ->
// PREFIX/share/dtrain/python/dtrain), else the configured install prefix's. Throws UsageError
// naming the variable when none is readable.
std::string python_script(const std::string& name, const param::String& variable);

// ---- `dtrain run --spark-master ...`, `dtrain run --ray-address ...` ----
// The engine flags of a `dtrain run` command line (argv[1] == "run"): each of `flags` takes a
// value ("--flag V" or "--flag=V"), may repeat, and is taken out up to PROGRAM (the first
// argument that is not an option of `dtrain run` or its value, or "--"): the program's own
// arguments are never taken; nullopt when `trigger` (one of them) is not there. rest: every
// other argument after "run", in order.
struct RunFlags {
  std::string command;  // "run", or "launch" (torch.distributed.launch's legacy arguments)
  std::map<std::string, std::vector<std::string>> given;  // flag -> its values
  std::vector<std::string> rest;
  // The last value of `flag`, else `def`.
  std::string value(const std::string& flag, const std::string& def = "") const;
};
// Throws UsageError when a flag has no value.
std::optional<RunFlags> scan_run_flags(int argc, char** argv, const std::vector<std::string>& flags,
                                       const std::string& trigger);
// This program's path (/proc/self/exe): the launcher that runs the agents.
std::string self_path();
// Replaces this process with argv (env set first). Throws UsageError naming `what` when exec
// fails.
[[noreturn]] void exec_driver(std::vector<std::string> argv,
                              const std::vector<std::pair<std::string, std::string>>& env,
                              const std::string& what);

}  // namespace dtrain::detail
