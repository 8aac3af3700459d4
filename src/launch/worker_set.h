// This node's workers, one attempt at a time: how they start, their output, their ends, and
// their teardown. The agent (agent.cpp) runs the job around it: rendezvous, the poll loop,
// the multi-node protocol, restarts.
//
// Starting (spawn): fork+exec per worker; or, with a fork-server library, one server that
// loads the program's libraries and forks the workers (fork_server.h) - after a restart the
// standby server, loaded while the previous attempt ran; or a Tuner's warm server
// (warm_socket). Every pid is watched by the agent's guard, so no worker outlives a killed
// agent.
// Output: each worker's stdout/stderr pipe is read as it comes (poll_fds/on_ready) into its
// OutputStreams (rank prefix, log file, filtered copy, stderr tail).
// Ends: reap() after SIGCHLD (or a warm launch server's report); first_failure() names the
// first worker that did not exit 0.
// Teardown: stop(sig) signals every worker's process group, SIGKILLs after term_timeout,
// then release() kills what the workers left in their groups and sweeps orphans re-parented
// to the agent (a subreaper).
// Not thread-safe: the agent's one thread drives it.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/launch.h"
#include "launch/cpu_binding.h"
#include "launch/deepspeed_worker.h"
#include "launch/failure.h"
#include "launch/fork_server.h"
#include "launch/guard.h"
#include "launch/output.h"
#include "launch/rendezvous.h"

namespace dtrain::launch {

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool alive = false;
  int wait_status = 0;
  int out_fd = -1;
  int err_fd = -1;
  std::optional<OutputStream> out;
  std::optional<OutputStream> err;
  std::string error_file;
  // The fork server ended before it had started every worker: this worker's end is the
  // server's (its status, its pid), whatever the worker itself did after.
  bool start_failed = false;
};

class WorkerSet {
 public:
  // fork_server_lib: non-empty to start workers from a fork server; warm_socket: non-empty to
  // ask a Tuner's warm server first. `guard` must outlive this.
  WorkerSet(const LaunchOptions& options, Guard& guard, std::string fork_server_lib,
            std::string warm_socket);
  ~WorkerSet();

  // Starts attempt `rdzv`'s workers; `dir` (the attempt's directory) holds their error files
  // in one directory per local rank, with the stdout.log and stderr.log of the streams
  // --redirects or --tee names when `write_logs`, and the filtered logs; master_addr/port is
  // the store they reach.
  void spawn(const RendezvousResult& rdzv, const std::string& dir, bool write_logs,
             const std::string& master_addr, int master_port);
  const std::vector<Worker>& workers() const { return workers_; }
  bool any_alive() const;

  // Whether a next attempt may come, so the fork server's standby is worth loading.
  void set_restart_possible(bool possible) { restart_possible_ = possible; }
  // The next attempt's fork server, loaded while this attempt runs (a restart forks its
  // workers at once); drop_standby() ends it.
  void drop_standby();

  // The fds the agent polls for this set (worker pipes, the fork server's reply pipe), and,
  // after poll(), the handling of those that became ready (same order, revents set).
  std::vector<pollfd> poll_fds() const;
  void on_ready(const std::vector<pollfd>& fds);
  // The earliest time a worker's partial line is due on the console (OutputStream's idle
  // flush): the agent's poll wakes by then and calls flush_idle_output().
  std::optional<OutputStream::Clock::time_point> output_flush_due() const;
  void flush_idle_output();
  // After SIGCHLD: collects the workers that exited (and orphans re-parented to the agent).
  void reap();

  // The first worker that ended other than exit 0, as a failure record of the worker's part
  // (rank, pid, exit code or signal, stderr tail, error file; the agent adds time and host);
  // its output is drained first.
  std::optional<Failure> first_failure();

  // Sends `sig` to every worker's group, SIGKILL after term_timeout, then release().
  // `poll(timeout, signals)` is the agent's loop step (its signals end the grace period).
  void stop(int sig, const std::function<void(std::chrono::milliseconds, std::vector<int>*)>& poll);
  // After every worker exited: close their output, SIGKILL what is left in their process
  // groups (their children), and reap orphans that came to the agent.
  void release();

 private:
  // The workers' command line, and what every worker's environment holds besides the
  // contract (inherited: the agent's own, less the contract; tail: ours, set last).
  void worker_command(std::vector<std::string>& argv, std::vector<std::string>& inherited,
                      std::vector<std::string>& tail) const;
  void start_standby();
  // Workers read the agent's stdin, as torchrun's do, unless the agent watches it (an agent
  // started over ssh: its EOF means the job is to stop).
  bool workers_read_stdin() const { return !o_.stop_on_stdin_eof; }
  // Learns the pids the fork server reports; once it has exited, the workers it never
  // started are marked dead with its wait status.
  void read_fork_server();
  void read_pipe(Worker& w, bool is_err);
  void drain_and_close(Worker& w);
  void sweep_orphans();

  const LaunchOptions& o_;
  Guard& guard_;
  std::string fork_server_lib_;  // non-empty: workers start from a fork server
  std::string warm_socket_;      // non-empty: from the warm fork server there (a Tuner's)
  std::vector<Worker> workers_;
  std::unique_ptr<ForkServer> fork_server_;  // this attempt's, until it is reaped
  pid_t fork_server_pid_ = -1;               // this attempt's server (kept for failure reports)
  int fork_server_status_ = 0;               // its wait status, once it failed
  bool said_exec_mode_ = false;
  CpuBinding binding_;  // --bind-cores-to-rank: each local rank's CPUs
  // A `dtrain deepspeed` job whose PROGRAM the fork server starts: the shim's flags, which this
  // agent applies to each worker instead (argv, environment, binding, log file).
  std::optional<DsExec> deepspeed_;
  std::unique_ptr<ForkServer> standby_;         // the next attempt's server, waiting
  std::vector<int> standby_out_, standby_err_;  // its workers' pipes (read ends)
  bool restart_possible_ = false;
  int stop_signal_ = 0;  // sent to workers whose pids arrive after stop() began
};

}  // namespace dtrain::launch
