// The per-node agent: rendezvous, spawn, fan-in, monitor, tear down, restart.
//
// One thread does everything but serve the store: a poll() loop over a signalfd (SIGCHLD,
// SIGINT, SIGTERM, SIGHUP) and every worker's stdout/stderr pipe. A worker's death is seen
// the moment SIGCHLD arrives, not at the next monitor tick; the tick (--monitor-interval)
// only paces the multi-node checks (heartbeats, the job's failure record, completion).
//
// Multi-node protocol, per round R under round_prefix(run_id, R) (see rendezvous.h):
//   failed      JSON of the job's root cause. The first agent to see a failure writes it
//               with compare_set("failed", "", JSON); every agent then reads back the one
//               that won, so all of them report the same root cause and exit code.
//   done_K      node K's workers all exited 0.
//   hb_K        node K's heartbeat counter, bumped every tick; a counter that stops moving
//               for the heartbeat timeout means that agent is gone.
//   ack_K       node K has read the outcome; the agent hosting the store waits for every
//               ack before it exits, so no agent loses the store before it has the result.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "diagnosis/records.h"
#include "dtrain/env.h"
#include "dtrain/error.h"
#include "dtrain/launch.h"
#include "dtrain/store.h"
#include "launch/elastic_rendezvous.h"
#include "launch/fork_server.h"
#include "launch/guard.h"
#include "launch/options_internal.h"
#include "launch/output.h"
#include "launch/rendezvous.h"
#include "launch/worker_process.h"

namespace dtrain {

namespace {

using Clock = std::chrono::steady_clock;
using launch::OutputStream;
using nlohmann::json;

std::string hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

std::string utc_now() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof out, "%s.%03lldZ", buf, static_cast<long long>(ms));
  return out;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

void say(const std::string& msg) { launch::write_all(STDERR_FILENO, "dtrain: " + msg + "\n"); }

// TORCHELASTIC_ERROR_FILE as PyTorch's @record writes it:
//   {"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack": "...", ...}}}
// shown as the message and the traceback; anything else is shown as it is.
std::string readable_error_file(const std::string& contents) {
  try {
    json j = json::parse(contents);
    const json& m = j.at("message");
    if (m.is_string()) return m.get<std::string>();
    std::string out = m.at("message").get<std::string>();
    if (m.contains("extraInfo") && m["extraInfo"].contains("py_callstack")) {
      out += "\n" + m["extraInfo"]["py_callstack"].get<std::string>();
    }
    return out;
  } catch (const std::exception&) {
    return contents;
  }
}

// The root cause of a failed attempt, as every agent of the job reports it.
struct Failure {
  std::string time;
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

  json to_json() const {
    return {{"time", time},
            {"host", host},
            {"node_rank", node_rank},
            {"rank", rank},
            {"local_rank", local_rank},
            {"pid", pid},
            {"exit_code", exit_code},
            {"signal", signal},
            {"reason", reason},
            {"stderr_tail", stderr_tail},
            {"error_file", error_file},
            {"error_file_contents", error_file_contents},
            {"final", final},
            {"collectives", collectives},
            {"membership", membership}};
  }
  static Failure from_json(const json& j) {
    Failure f;
    f.time = j.value("time", "");
    f.host = j.value("host", "");
    f.node_rank = j.value("node_rank", 0);
    f.rank = j.value("rank", -1);
    f.local_rank = j.value("local_rank", -1);
    f.pid = j.value("pid", 0);
    f.exit_code = j.value("exit_code", 1);
    f.signal = j.value("signal", 0);
    f.reason = j.value("reason", "");
    f.stderr_tail = j.value("stderr_tail", std::vector<std::string>{});
    f.error_file = j.value("error_file", "");
    f.error_file_contents = j.value("error_file_contents", "");
    f.final = j.value("final", false);
    f.membership = j.value("membership", false);
    f.collectives = j.value("collectives", std::vector<std::string>{});
    return f;
  }

  std::string one_line() const {
    std::string s =
        rank >= 0 ? "rank " + std::to_string(rank) + " on " + host : "the agent on " + host;
    s += " (node " + std::to_string(node_rank) + ")";
    if (rank >= 0 && signal > 0) s += " died of " + signal_name(signal);
    if (rank >= 0 && signal == 0) s += " exited";
    if (!reason.empty()) s += ": " + reason;
    return s + ", exit code " + std::to_string(exit_code);
  }

  std::string summary(int stderr_lines) const {
    std::ostringstream s;
    s << "dtrain: job failed; root cause (first failure):\n";
    s << "  time       : " << time << "\n";
    s << "  host       : " << host << "\n";
    s << "  node rank  : " << node_rank << "\n";
    if (rank >= 0) {
      s << "  rank       : " << rank << " (local rank " << local_rank << ")\n";
      s << "  pid        : " << pid << "\n";
      if (signal > 0) {
        s << "  signal     : " << signal_name(signal) << " (" << signal << "), exit code "
          << exit_code << "\n";
      } else {
        s << "  exit code  : " << exit_code << "\n";
      }
    }
    if (!reason.empty()) s << "  reason     : " << reason << "\n";
    if (!error_file_contents.empty()) {
      s << "  error file : " << error_file << "\n";
      std::istringstream lines(readable_error_file(error_file_contents));
      for (std::string line; std::getline(lines, line);) s << "    " << line << "\n";
    }
    if (rank >= 0) {
      if (stderr_tail.empty()) {
        s << "  stderr     : (empty)\n";
      } else {
        s << "  last " << std::min<size_t>(stderr_tail.size(), stderr_lines) << " line(s) of rank "
          << rank << "'s stderr:\n";
        for (const auto& l : stderr_tail) s << "    " << l << "\n";
      }
    }
    if (!collectives.empty()) {
      s << "  recent collectives (each rank's flight recorder, as it last published it):\n";
      for (const auto& l : collectives) s << "    " << l << "\n";
    }
    return s.str();
  }
};

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

enum class Outcome { kSucceeded, kFailed, kInterrupted };

struct AttemptResult {
  Outcome outcome = Outcome::kSucceeded;
  Failure failure;  // kFailed
  int signal = 0;   // kInterrupted
};

bool mask_has(const std::map<int, int>& spec, int local_rank, int bit) {
  auto it = spec.find(local_rank);
  if (it == spec.end()) it = spec.find(-1);
  return it != spec.end() && (it->second & bit) != 0;
}

std::string read_file(const std::string& path, size_t limit = 64 * 1024) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::string s(limit, '\0');
  in.read(s.data(), static_cast<std::streamsize>(limit));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

class Agent {
 public:
  explicit Agent(LaunchOptions o) : o_(std::move(o)), host_(hostname()) {}
  int run();

 private:
  void setup_signals();
  void setup_store();
  AttemptResult run_attempt(const launch::RendezvousResult& rdzv);
  // The failure summary's "recent collectives": what the workers of attempt `round` published
  // to the job's store (empty when the store is not ours to read, or nothing was published).
  std::vector<std::string> published_collectives(int round, int world_size);
  void spawn_workers(const launch::RendezvousResult& rdzv);
  // The workers' command line, and what every worker's environment holds besides the
  // contract (inherited: the agent's own, less the contract; tail: ours, set last).
  void worker_command(std::vector<std::string>& argv, std::vector<std::string>& inherited,
                      std::vector<std::string>& tail) const;
  // The next attempt's fork server, started once this attempt's workers are forked: it loads
  // the program's libraries while the job runs, so a restart forks warm workers at once.
  void start_standby();
  void drop_standby();
  bool restart_possible(int failures) const { return elastic() || failures < o_.max_restarts; }
  // Learns the pids the fork server reports; once it has exited, the workers it never
  // started are marked dead with its wait status.
  void read_fork_server();
  void poll_once(std::chrono::milliseconds timeout, std::vector<int>* signals);
  void read_pipe(Worker& w, bool is_err);
  void drain_and_close(Worker& w);
  void reap();
  void stop_workers(int sig);
  // After every worker exited: close their output, SIGKILL what is left in their process
  // groups (their children), and reap orphans that came to us.
  void release_workers();
  void sweep_orphans();
  std::optional<Failure> first_local_failure();
  Failure worker_failure(Worker& w);
  Failure agent_failure(const std::string& reason, int exit_code, bool final);
  std::optional<Failure> publish_failure(const Failure& f);
  std::optional<Failure> remote_failure();
  void heartbeat_and_check(Clock::time_point now);
  void finish_job(int round);
  void write_failure_file(const Failure& f) const;
  void publish_to_failure_store(const Failure& f) const;
  bool multi_node() const { return o_.nnodes > 1; }
  bool elastic() const { return o_.min_nodes > 0; }
  // Every agent's output reaches one console (srun's, or the host-file launcher's).
  bool shared_console() const {
    return multi_node() && (o_.engine == "slurm" || o_.stop_on_stdin_eof);
  }
  std::string attempt_dir(int round) const;

  LaunchOptions o_;
  std::string host_;
  std::unique_ptr<launch::Guard> guard_;
  std::string fork_server_lib_;  // non-empty: workers start from a fork server
  std::string warm_socket_;      // non-empty: from the warm fork server there (a Tuner's)
  std::unique_ptr<launch::ForkServer> fork_server_;  // this attempt's, until it is reaped
  pid_t fork_server_pid_ = -1;  // this attempt's server (kept for failure reports)
  int fork_server_status_ = 0;  // its wait status, once it failed
  bool said_exec_mode_ = false;
  std::unique_ptr<launch::ForkServer> standby_;  // the next attempt's server, waiting
  std::vector<int> standby_out_, standby_err_;   // its workers' pipes (read ends)
  int failures_ = 0;     // attempts that failed so far (no standby once none is left)
  int stop_signal_ = 0;  // sent to workers whose pids arrive after stop_workers began
  int signal_fd_ = -1;
  bool stdin_closed_ = false;  // stop_on_stdin_eof: stdin reached EOF
  std::unique_ptr<store::StoreServer> server_;
  std::unique_ptr<store::StoreClient> store_;
  std::string store_host_;  // what workers get as MASTER_ADDR
  int store_port_ = 0;
  std::string run_dir_;  // error files (and logs when --log-dir is not given)
  bool own_run_dir_ = false;
  std::vector<Worker> workers_;
  int node_rank_ = -1;
  int nnodes_ = 1;
  std::string prefix_;  // round_prefix of the current round
  // Heartbeats of the other nodes: last value and when it last changed.
  std::map<int, std::pair<std::string, Clock::time_point>> heartbeats_;
  int64_t beat_ = 0;
  std::chrono::milliseconds heartbeat_timeout_{0};
};

void Agent::setup_signals() {
  // Block the signals we handle before any thread exists (the store's thread inherits the
  // mask), then read them from a signalfd in the poll loop.
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
  if (::sigprocmask(SIG_BLOCK, &set, nullptr) != 0) {
    throw Error(std::string("sigprocmask: ") + std::strerror(errno));
  }
  signal_fd_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) throw Error(std::string("signalfd: ") + std::strerror(errno));
  ::signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the agent
  // Orphaned grandchildren are re-parented to us, so the final sweep can find and reap them.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
}

void Agent::setup_store() {
  // c10d: the agents on the endpoint's machine race to host it (elastic_rendezvous.h).
  const bool try_host = o_.rdzv_backend == "c10d"
                            ? (o_.master_addr.empty() || launch::endpoint_is_local(o_.master_addr))
                            : o_.node_rank == 0;
  if (try_host) {
    try {
      server_ = store::StoreServer::start({"", static_cast<std::uint16_t>(o_.master_port)});
    } catch (const AddressInUseError& e) {
      // With c10d every agent tries to host the endpoint; the first one to bind does.
      if (!(o_.rdzv_backend == "c10d" && o_.nnodes > 1)) {
        throw UsageError("--master-port: port " + std::to_string(o_.master_port) +
                         " is already in use on this host; choose a free port (or omit "
                         "--master-port on a single node to get one)");
      }
    }
  }
  store_port_ = server_ ? server_->port() : o_.master_port;
  store_host_ = o_.master_addr;
  store::StoreClient::Options copts;
  copts.connect_timeout = o_.rdzv_timeout;
  copts.timeout = o_.rdzv_timeout;
  if (multi_node()) {
    // Our own server is reached over loopback; others at the master address.
    try {
      store_ = store::StoreClient::connect(server_ ? "127.0.0.1" : store_host_,
                                           static_cast<std::uint16_t>(store_port_), copts);
    } catch (const Error& e) {
      if (server_) throw;
      // Say which node could not reach which address, and what to do about it.
      throw NetworkError(
          "node " + std::to_string(o_.node_rank) + " (" + host_ +
          ") cannot reach the job's store at " + store_host_ + ":" + std::to_string(store_port_) +
          " on node 0: " + e.what() +
          ". The master address must be one every node can reach (never a "
          "loopback address across hosts): give node 0's address with --master-addr");
    }
  }
}

std::vector<std::string> Agent::published_collectives(int round, int world_size) {
  try {
    std::unique_ptr<store::StoreClient> own;
    store::StoreClient* client = store_.get();
    if (!client) {
      if (!server_) return {};
      store::StoreClient::Options copts;
      copts.connect_timeout = std::chrono::seconds(2);
      copts.timeout = std::chrono::seconds(2);
      own =
          store::StoreClient::connect("127.0.0.1", static_cast<std::uint16_t>(store_port_), copts);
      client = own.get();
    }
    WorkerEnv env;
    env.restart_count = round;
    auto get = [&](const std::string& key) -> std::optional<std::string> {
      if (!client->check({key})) return std::nullopt;
      return client->get(key);
    };
    return diagnosis::describe_published(get, env.store_prefix() + "/", world_size);
  } catch (const std::exception& e) {
    return {std::string("(could not read them from the job's store: ") + e.what() + ")"};
  }
}

std::string Agent::attempt_dir(int round) const {
  return run_dir_ + "/attempt_" + std::to_string(round);
}

void Agent::worker_command(std::vector<std::string>& argv, std::vector<std::string>& inherited,
                           std::vector<std::string>& tail) const {
  std::vector<std::string> base = launch::current_environment();
  // Drop what we set, so a parent launcher's contract never leaks into ours.
  WorkerEnv proto;
  auto contract = proto.to_variables();
  bool has_omp = false;
  bool has_arrow_malloc = false;
  bool has_tunables = false;
  inherited.clear();
  for (auto& e : base) {
    std::string name = e.substr(0, e.find('='));
    if (contract.count(name) || o_.extra_env.count(name)) continue;
    if (name == "DTRAIN_FORKSERVER_WARM_SOCKET") continue;  // for this agent only
    if (name == "OMP_NUM_THREADS") has_omp = true;
    if (name == "JE_ARROW_MALLOC_CONF") has_arrow_malloc = true;
    if (name == "GLIBC_TUNABLES" && o_.malloc_hugepages) {
      has_tunables = true;
      e += ":glibc.malloc.hugetlb=1";
    }
    inherited.push_back(e);
  }
  std::map<std::string, std::string> extra_env = o_.extra_env;
  if (!o_.ifname.empty()) extra_env["GLOO_SOCKET_IFNAME"] = o_.ifname;
  if (o_.malloc_hugepages && !has_tunables) {
    auto it = extra_env.find("GLIBC_TUNABLES");
    if (it == extra_env.end()) {
      inherited.push_back("GLIBC_TUNABLES=glibc.malloc.hugetlb=1");
    } else {
      it->second += ":glibc.malloc.hugetlb=1";
    }
  }
  argv.clear();
  if (runs_with_python(o_)) {
    argv = {o_.python, "-u"};
    if (o_.module) argv.push_back("-m");
  }
  argv.push_back(o_.program);
  argv.insert(argv.end(), o_.args.begin(), o_.args.end());

  tail.clear();
  for (auto& [k, v] : extra_env) tail.push_back(k + "=" + v);
  if (!has_omp && !o_.extra_env.count("OMP_NUM_THREADS")) tail.push_back("OMP_NUM_THREADS=1");
  // Arrow's bundled jemalloc (pyarrow's libarrow, which dtrain::data links) starts a purging
  // thread while the library loads, so a program linking it could not start from the fork
  // server; without it jemalloc purges inline. A value the user set wins.
  if (!has_arrow_malloc && !o_.extra_env.count("JE_ARROW_MALLOC_CONF"))
    tail.push_back("JE_ARROW_MALLOC_CONF=background_thread:false");
}

void Agent::spawn_workers(const launch::RendezvousResult& rdzv) {
  std::vector<std::string> argv, inherited, tail;
  worker_command(argv, inherited, tail);
  // A worker's environment: inherited, then the contract, then ours. The fork server gets
  // the same without the contract (what differs between workers).
  std::vector<std::string> common = inherited;
  common.insert(common.end(), tail.begin(), tail.end());

  const std::string dir = attempt_dir(rdzv.round);
  workers_.clear();
  workers_.resize(o_.nproc_per_node);
  std::vector<std::vector<std::string>> envs(workers_.size());
  for (int lr = 0; lr < o_.nproc_per_node; ++lr) {
    Worker& w = workers_[lr];
    w.local_rank = lr;
    w.rank = rdzv.rank_offset + lr;
    const std::string rank_dir = dir + "/rank_" + std::to_string(w.rank);
    std::filesystem::create_directories(rank_dir);
    w.error_file = rank_dir + "/error.json";
    WorkerEnv env;
    env.rank = w.rank;
    env.local_rank = lr;
    env.world_size = rdzv.world_size;
    env.local_world_size = o_.nproc_per_node;
    env.group_rank = rdzv.node_rank;
    env.group_world_size = rdzv.nnodes;
    env.role_rank = w.rank;
    env.role_world_size = rdzv.world_size;
    env.role_name = o_.role;
    env.master_addr = store_host_;
    env.master_port = store_port_;
    env.restart_count = rdzv.round;
    env.max_restarts = o_.max_restarts;
    env.run_id = o_.rdzv_id;
    env.use_agent_store = true;
    env.error_file = w.error_file;
    envs[lr] = inherited;
    for (auto& [k, v] : env.to_variables()) envs[lr].push_back(k + "=" + v);
    envs[lr].insert(envs[lr].end(), tail.begin(), tail.end());

    auto open_log = [&](const char* name) {
      if (o_.log_dir.empty()) return -1;
      std::string path = rank_dir + "/" + name;
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) throw Error("cannot create log file " + path + ": " + std::strerror(errno));
      return fd;
    };
    const std::string prefix = "[" + o_.role + std::to_string(w.rank) + "]:";
    w.out.emplace(prefix, mask_has(o_.redirects, lr, 1) ? -1 : STDOUT_FILENO,
                  open_log("stdout.log"), 0);
    w.err.emplace(prefix, mask_has(o_.redirects, lr, 2) ? -1 : STDERR_FILENO,
                  open_log("stderr.log"), o_.stderr_tail_lines);
  }
  stop_signal_ = 0;
  if (!warm_socket_.empty()) {
    // A warm server (a Tuner's, the program's libraries loaded once for all its trials)
    // forks the workers; when it cannot be reached, the workers start as below.
    std::vector<int> outs, errs;
    try {
      launch::ForkServerLaunch launch{argv, common, envs, fork_server_lib_};
      launch.warm_socket = warm_socket_;
      fork_server_ = std::make_unique<launch::ForkServer>(launch, outs, errs);
      fork_server_pid_ = -1;  // its launch server's, once it says (read_fork_server)
      for (size_t lr = 0; lr < workers_.size(); ++lr) {
        workers_[lr].out_fd = outs[lr];
        workers_[lr].err_fd = errs[lr];
        workers_[lr].alive = true;
      }
      return;
    } catch (const Error& e) {
      say(std::string("the warm fork server cannot start the workers (") + e.what() +
          "); they start from a fork server of their own");
      warm_socket_.clear();
    }
  }
  if (!fork_server_lib_.empty()) {
    // One process loads the program's libraries; the workers are forked from it. Their pids
    // arrive on the server's reply pipe (read_fork_server). After a restart that process is
    // usually the standby, loaded already.
    std::vector<int> outs, errs;
    if (standby_ && !standby_->reap(false)) {
      try {
        standby_->start(envs);
        fork_server_ = std::move(standby_);
        outs.swap(standby_out_);
        errs.swap(standby_err_);
      } catch (const Error& e) {
        say(std::string("the standby fork server is gone (") + e.what() + "); starting a new one");
      }
    }
    drop_standby();  // one that ended on its own, or failed to start: a fresh server instead
    if (!fork_server_) {
      fork_server_ = std::make_unique<launch::ForkServer>(
          launch::ForkServerLaunch{argv, common, envs, fork_server_lib_}, outs, errs);
      guard_->watch(fork_server_->pid());
    }
    fork_server_pid_ = fork_server_->pid();
    for (size_t lr = 0; lr < workers_.size(); ++lr) {
      workers_[lr].out_fd = outs[lr];
      workers_[lr].err_fd = errs[lr];
      workers_[lr].alive = true;
    }
    return;
  }
  for (size_t lr = 0; lr < workers_.size(); ++lr) {
    Worker& w = workers_[lr];
    auto p = launch::spawn_process({argv, envs[lr], {}});
    guard_->watch(p.pid);
    w.pid = p.pid;
    w.out_fd = p.stdout_fd;
    w.err_fd = p.stderr_fd;
    w.alive = true;
  }
}

void Agent::read_fork_server() {
  if (!fork_server_) return;
  auto learn = [&](const std::vector<std::pair<int, pid_t>>& forked) {
    for (auto [index, pid] : forked) {
      if (index < 0 || index >= static_cast<int>(workers_.size()) || workers_[index].pid > 0)
        continue;
      guard_->watch(pid);
      workers_[index].pid = pid;
      if (stop_signal_ != 0) ::kill(-pid, stop_signal_);  // stopping already: it missed the signal
    }
  };
  learn(fork_server_->read_reply());
  if (fork_server_->warm()) {
    fork_server_pid_ = fork_server_->pid();
    // The launch server stays while its workers run; reap() takes their statuses from it.
    if (!fork_server_->failed() && (fork_server_->done() || fork_server_->reply_fd() >= 0)) return;
    // It ended before it had started every worker: the attempt fails with status 127; the
    // workers it did start die with it (PR_SET_PDEATHSIG) or never got the go-ahead.
    fork_server_status_ = 127 << 8;
    for (auto& w : workers_) {
      w.start_failed = true;
      if (w.alive) {
        if (w.pid > 0) ::kill(-w.pid, SIGKILL);
        w.alive = false;
        w.wait_status = fork_server_status_;
        read_pipe(w, false);
        read_pipe(w, true);
      }
    }
    fork_server_.reset();
    return;
  }
  if (!fork_server_->done() && !fork_server_->failed() && fork_server_->reply_fd() >= 0) {
    // Still going - unless it has exited: a program it started may hold the pipe open, so
    // EOF is no proof. Once it has exited, all it wrote is in the pipe.
    if (!fork_server_->reap(false)) return;
    learn(fork_server_->read_reply());
  }
  if (fork_server_->exec_mode() && !said_exec_mode_) {
    said_exec_mode_ = true;
    say("a library of " + o_.program +
        " keeps a thread running after loading, so the fork server "
        "cannot fork it safely: each worker is fork+exec'd from it instead (--start-method spawn "
        "saves the server's own start)");
  }
  fork_server_->reap(true);  // it exits right after its last word
  if (!fork_server_->done()) {
    // The server ended before it had started every worker (it failed while the program's
    // libraries loaded, or was killed). Every worker of the attempt fails with its status:
    // the ones it did start stop on their own (they never get the go-ahead).
    int st = fork_server_->status();
    fork_server_status_ = (WIFEXITED(st) && WEXITSTATUS(st) == 0) ? (127 << 8) : st;
    for (auto& w : workers_) {
      w.start_failed = true;
      if (w.alive && w.pid < 0) {
        w.alive = false;
        w.wait_status = fork_server_status_;
        read_pipe(w, false);
        read_pipe(w, true);
      }
    }
  }
  const bool started_all = fork_server_->done();
  guard_->forget(fork_server_->pid());
  fork_server_.reset();
  if (started_all && restart_possible(failures_)) start_standby();
}

void Agent::start_standby() {
  if (standby_ || fork_server_lib_.empty()) return;
  std::vector<std::string> argv, inherited, tail;
  worker_command(argv, inherited, tail);
  inherited.insert(inherited.end(), tail.begin(), tail.end());
  try {
    standby_ = std::make_unique<launch::ForkServer>(
        launch::ForkServerLaunch{argv, inherited,
                                 std::vector<std::vector<std::string>>(o_.nproc_per_node),
                                 fork_server_lib_},
        standby_out_, standby_err_, launch::ForkServer::Standby{});
    guard_->watch(standby_->pid());
  } catch (const Error&) {
    // A restart starts a fresh server then, and says why if it cannot. The pipes are closed.
    standby_.reset();
    standby_out_.clear();
    standby_err_.clear();
  }
}

void Agent::drop_standby() {
  for (auto* fds : {&standby_out_, &standby_err_}) {
    for (int fd : *fds) {
      if (fd >= 0) ::close(fd);
    }
    fds->clear();
  }
  if (!standby_) return;
  guard_->forget(standby_->pid());
  standby_.reset();  // it reads EOF on its go pipe and exits (or is SIGKILLed and reaped)
}

void Agent::read_pipe(Worker& w, bool is_err) {
  int& fd = is_err ? w.err_fd : w.out_fd;
  auto& stream = is_err ? w.err : w.out;
  char buf[65536];
  while (fd >= 0) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      stream->write(std::string_view(buf, static_cast<size_t>(n)));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    ::close(fd);  // EOF or error
    fd = -1;
    stream->close();
  }
}

void Agent::drain_and_close(Worker& w) {
  // Everything the worker wrote before it exited is already in the pipe; what a surviving
  // grandchild writes later is not the worker's, and its group is killed at teardown.
  read_pipe(w, false);
  read_pipe(w, true);
  for (int* fd : {&w.out_fd, &w.err_fd}) {
    if (*fd >= 0) {
      ::close(*fd);
      *fd = -1;
    }
  }
  if (w.out) w.out->close();
  if (w.err) w.err->close();
}

void Agent::reap() {
  // Every pid the fork server reported is in its pipe before any of its workers can be ours.
  read_fork_server();
  for (auto& w : workers_) {
    if (!w.alive || w.pid < 0) continue;
    int st = 0;
    if (fork_server_ && fork_server_->warm()) {
      // Not our child: its launch server reports its status; a launch server gone without a
      // word for it was killed, and took it along (PR_SET_PDEATHSIG SIGKILL).
      if (!fork_server_->exit_status(w.local_rank, &st)) {
        if (fork_server_->reply_fd() >= 0) continue;
        ::kill(-w.pid, SIGKILL);
        st = SIGKILL;
      }
      w.alive = false;
      w.wait_status = st;
      read_pipe(w, false);
      read_pipe(w, true);
      continue;
    }
    pid_t r;
    do {
      r = ::waitpid(w.pid, &st, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == w.pid) {
      w.alive = false;
      w.wait_status = w.start_failed ? fork_server_status_ : st;
      read_pipe(w, false);
      read_pipe(w, true);
    }
  }
  if (standby_) standby_->reap(false);  // one that ended is replaced at the next restart
  // Orphans re-parented to us (we are a subreaper): reap them so no zombie piles up.
  int st;
  siginfo_t info{};
  while (true) {
    info.si_pid = 0;
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) break;
    auto known = [&] {
      bool ours = guard_ && info.si_pid == guard_->pid();
      ours = ours || (fork_server_ && info.si_pid == fork_server_->pid());
      ours = ours || (standby_ && info.si_pid == standby_->pid());
      for (auto& w : workers_) ours = ours || (w.alive && w.pid == info.si_pid);
      return ours;
    };
    bool ours = known();
    if (!ours && fork_server_) {
      // A worker adopted since the pipe was read: its pid is in the pipe by now (the server
      // reports every pid before it exits, and only then are its workers ours).
      read_fork_server();
      ours = known();
    }
    if (ours) break;  // a worker that exited between the loop above and now: next round
    ::waitpid(info.si_pid, &st, WNOHANG);
  }
}

void Agent::poll_once(std::chrono::milliseconds timeout, std::vector<int>* signals) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, bool>> owners;
  fds.push_back({signal_fd_, POLLIN, 0});
  owners.push_back({nullptr, false});
  const bool watch_stdin = o_.stop_on_stdin_eof && !stdin_closed_;
  if (watch_stdin) fds.push_back({STDIN_FILENO, POLLIN, 0}), owners.push_back({nullptr, true});
  for (auto& w : workers_) {
    if (w.out_fd >= 0) fds.push_back({w.out_fd, POLLIN, 0}), owners.push_back({&w, false});
    if (w.err_fd >= 0) fds.push_back({w.err_fd, POLLIN, 0}), owners.push_back({&w, true});
  }
  const size_t fork_server_slot = fds.size();
  if (fork_server_ && fork_server_->reply_fd() >= 0) {
    fds.push_back({fork_server_->reply_fd(), POLLIN, 0}), owners.push_back({nullptr, false});
  }
  int n = ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  if (n <= 0) return;
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    if (i == fork_server_slot) {
      read_fork_server();
      // A warm launch server reports its workers' ends here (no SIGCHLD for them).
      if (fork_server_ && fork_server_->warm()) reap();
      continue;
    }
    if (owners[i].first == nullptr) {
      // stdin of an agent started over ssh: EOF means the launching dtrain is gone or wants
      // the job stopped. Treat it as SIGHUP.
      char buf[256];
      ssize_t r = ::read(STDIN_FILENO, buf, sizeof buf);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        stdin_closed_ = true;
        if (signals) signals->push_back(SIGHUP);
      }
      continue;
    }
    read_pipe(*owners[i].first, owners[i].second);
  }
  if (fds[0].revents & POLLIN) {
    signalfd_siginfo si;
    bool child = false;
    while (::read(signal_fd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
      if (si.ssi_signo == SIGCHLD) {
        child = true;
      } else if (signals) {
        signals->push_back(static_cast<int>(si.ssi_signo));
      }
    }
    if (child) reap();
  }
}

Failure Agent::agent_failure(const std::string& reason, int exit_code, bool final) {
  Failure f;
  f.time = utc_now();
  f.host = host_;
  f.node_rank = node_rank_;
  f.reason = reason;
  f.exit_code = exit_code;
  f.final = final;
  return f;
}

Failure Agent::worker_failure(Worker& w) {
  Failure f = agent_failure("", 1, false);
  f.rank = w.rank;
  f.local_rank = w.local_rank;
  f.pid = w.pid;
  if (w.start_failed) {
    f.pid = fork_server_pid_;
    f.reason = "the fork server (pid " + std::to_string(fork_server_pid_) +
               ") ended before it had started the workers; its status is reported";
  }
  if (WIFSIGNALED(w.wait_status)) {
    f.signal = WTERMSIG(w.wait_status);
    f.exit_code = 128 + f.signal;
  } else {
    f.exit_code = WEXITSTATUS(w.wait_status);
  }
  auto tail = w.err->tail();
  f.stderr_tail.assign(tail.begin(), tail.end());
  f.error_file = w.error_file;
  f.error_file_contents = read_file(w.error_file);
  return f;
}

std::optional<Failure> Agent::first_local_failure() {
  for (auto& w : workers_) {
    if (w.alive) continue;
    bool ok = WIFEXITED(w.wait_status) && WEXITSTATUS(w.wait_status) == 0;
    if (!ok) {
      drain_and_close(w);
      return worker_failure(w);
    }
  }
  return std::nullopt;
}

// Records `f` as the job's root cause unless another agent already recorded one; returns the
// root cause that stands. Single-node jobs have no one to tell.
std::optional<Failure> Agent::publish_failure(const Failure& f) {
  if (!multi_node()) return f;
  std::string mine = f.to_json().dump();
  std::string stored = store_->compare_set(prefix_ + "failed", "", mine);
  return Failure::from_json(json::parse(stored));
}

std::optional<Failure> Agent::remote_failure() {
  if (!multi_node() || !store_->check({prefix_ + "failed"})) return std::nullopt;
  return Failure::from_json(json::parse(store_->get(prefix_ + "failed")));
}

void Agent::heartbeat_and_check(Clock::time_point now) {
  store_->set(prefix_ + "hb_" + std::to_string(node_rank_), std::to_string(++beat_));
  for (int k = 0; k < nnodes_; ++k) {
    if (k == node_rank_) continue;
    const std::string key = prefix_ + "hb_" + std::to_string(k);
    std::string v = store_->check({key}) ? store_->get(key) : "";
    auto it = heartbeats_.find(k);
    if (it == heartbeats_.end() || it->second.first != v) {
      heartbeats_[k] = {v, now};
    } else if (now - it->second.second > heartbeat_timeout_) {
      throw NetworkError("the agent of node " + std::to_string(k) +
                         " stopped responding (no heartbeat for " +
                         std::to_string(heartbeat_timeout_.count() / 1000) +
                         " s): it was killed, or its host or network failed");
    }
  }
}

void Agent::stop_workers(int sig) {
  read_fork_server();
  stop_signal_ = sig;
  for (auto& w : workers_) {
    if (w.alive && w.pid > 0) ::kill(-w.pid, sig);
  }
  // A fork server still loading the program: its workers do not exist yet. (A warm launch
  // server stays with its workers to report their ends: only SIGKILL below reaches it.)
  if (fork_server_ && fork_server_->pid() > 0 && !(fork_server_->warm() && fork_server_->done())) {
    ::kill(-fork_server_->pid(), sig);
  }
  auto deadline = Clock::now() + o_.term_timeout;
  bool killed = false;
  while (true) {
    bool any = std::any_of(workers_.begin(), workers_.end(), [](auto& w) { return w.alive; });
    if (!any) break;
    auto now = Clock::now();
    if (!killed && now >= deadline) {
      stop_signal_ = SIGKILL;
      for (auto& w : workers_) {
        if (w.alive && w.pid > 0) ::kill(-w.pid, SIGKILL);
      }
      if (fork_server_ && fork_server_->pid() > 0) ::kill(-fork_server_->pid(), SIGKILL);
      killed = true;
      deadline = now + std::chrono::seconds(10);  // SIGKILL cannot be caught; this is for D state
    } else if (killed && now >= deadline) {
      say("some workers did not die 10 s after SIGKILL; giving up on them");
      break;
    }
    std::vector<int> sigs;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    poll_once(std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(50)), &sigs);
    if (!sigs.empty() && !killed) deadline = Clock::now();  // asked again: stop waiting
  }
  release_workers();
}

void Agent::release_workers() {
  if (fork_server_ && fork_server_->warm()) {
    // Every worker has ended (or stop_workers gave up): the launch server ends now too.
    fork_server_->reap(true);
    fork_server_.reset();  // SIGKILL to it if it has not
  }
  if (fork_server_) {  // only after stop_workers gave up on it
    ::kill(-fork_server_->pid(), SIGKILL);
    fork_server_->reap(true);
    for (int i = 0; fork_server_ && i < 100; ++i) {  // EOF follows its death at once
      pollfd p{fork_server_->reply_fd(), POLLIN, 0};
      ::poll(&p, 1, 10);
      read_fork_server();  // marks the workers it never started
    }
    fork_server_.reset();
  }
  for (auto& w : workers_) {
    if (w.pid < 0) continue;
    drain_and_close(w);
    // Whatever the worker started is still in its group: take it down too.
    ::kill(-w.pid, SIGKILL);
    guard_->forget(w.pid);
    w.pid = -1;
  }
  sweep_orphans();
}

void Agent::sweep_orphans() {
  // Children of ours that are not workers: grandchildren re-parented to us (subreaper).
  const pid_t self = ::getpid();
  const pid_t guard = guard_ ? guard_->pid() : -1;
  const pid_t standby = standby_ ? standby_->pid() : -1;
  DIR* d = ::opendir("/proc");
  if (!d) return;
  std::vector<pid_t> orphans;
  while (dirent* e = ::readdir(d)) {
    pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0 || pid == guard || pid == standby) continue;
    std::string stat = read_file("/proc/" + std::string(e->d_name) + "/stat", 1024);
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid;
    rest >> state >> ppid;
    if (ppid == self) orphans.push_back(pid);
  }
  ::closedir(d);
  for (pid_t p : orphans) ::kill(p, SIGKILL);
  for (pid_t p : orphans) {
    int st;
    ::waitpid(p, &st, 0);
  }
}

AttemptResult Agent::run_attempt(const launch::RendezvousResult& rdzv) {
  prefix_ = launch::round_prefix(o_.rdzv_id, rdzv.round);
  heartbeats_.clear();
  spawn_workers(rdzv);
  AttemptResult result;
  bool local_done = false;
  auto next_tick = Clock::now();
  std::optional<Failure> failure;
  int got_signal = 0;
  while (true) {
    std::vector<int> sigs;
    auto now = Clock::now();
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - now);
    poll_once(std::max(wait, std::chrono::milliseconds(0)), &sigs);
    if (!sigs.empty()) {
      got_signal = sigs.front();
      break;
    }
    if (auto f = first_local_failure()) {
      failure = f;
      break;
    }
    if (!local_done &&
        std::none_of(workers_.begin(), workers_.end(), [](auto& w) { return w.alive; })) {
      local_done = true;
      release_workers();
      if (!multi_node()) return result;
      store_->set(prefix_ + "done_" + std::to_string(node_rank_), "1");
    }
    now = Clock::now();
    if (multi_node() && now >= next_tick) {
      next_tick = now + o_.monitor_interval;
      try {
        heartbeat_and_check(now);
        if (auto f = remote_failure()) {
          result.outcome = Outcome::kFailed;
          result.failure = *f;
          stop_workers(SIGTERM);
          return result;
        }
        // Elastic: a node waits to join and there is room; restart everyone with it.
        if (!local_done && elastic() && nnodes_ < o_.nnodes &&
            launch::late_agents(*store_, o_.rdzv_id, rdzv.round) > 0) {
          failure = agent_failure(
              "a new node is waiting to join the job; restarting the workers to admit it", 0,
              false);
          failure->membership = true;
          break;
        }
        if (local_done) {
          std::vector<std::string> done;
          for (int k = 0; k < nnodes_; ++k) done.push_back(prefix_ + "done_" + std::to_string(k));
          if (store_->check(done)) return result;
        }
      } catch (const NetworkError& e) {
        // The store or a peer agent is gone: nobody is left to coordinate with - unless the
        // job is elastic, where the survivors meet again in the next round (which fails with
        // the reason if the store itself is gone).
        failure = agent_failure(e.what(), 1, !elastic());
        break;
      } catch (const StoreError& e) {
        failure = agent_failure(e.what(), 1, true);
        break;
      }
    } else if (!multi_node()) {
      next_tick = now + o_.monitor_interval;
    }
  }
  if (got_signal) {
    // Pass the signal on, then the usual teardown.
    say("got " + signal_name(got_signal) + ", stopping workers");
    stop_workers(got_signal);
    result.outcome = Outcome::kInterrupted;
    result.signal = got_signal;
    if (multi_node()) {
      try {
        publish_failure(agent_failure("the agent on " + host_ + " got " + signal_name(got_signal),
                                      128 + got_signal, true));
      } catch (const Error&) {
      }
    }
    return result;
  }
  // A local failure (or a lost peer): record it, stop everyone here, report the root cause.
  result.outcome = Outcome::kFailed;
  result.failure = *failure;
  try {
    if (auto root = publish_failure(*failure)) result.failure = *root;
  } catch (const Error&) {
  }
  stop_workers(SIGTERM);
  return result;
}

void Agent::finish_job(int round) {
  if (!multi_node()) return;
  const std::string prefix = launch::round_prefix(o_.rdzv_id, round);
  try {
    store_->set(prefix + "ack_" + std::to_string(node_rank_), "1");
    if (server_) {
      // Keep the store up until every agent has read the outcome.
      std::vector<std::string> acks;
      for (int k = 0; k < nnodes_; ++k) acks.push_back(prefix + "ack_" + std::to_string(k));
      store_->wait(acks, std::max(heartbeat_timeout_, std::chrono::milliseconds(5000)));
    }
  } catch (const Error&) {
    // The others are gone already; nothing is left to wait for.
  }
}

void Agent::write_failure_file(const Failure& f) const {
  if (o_.failure_file.empty()) return;
  // Temporary file + rename: a reader never sees half a report.
  const std::string tmp = o_.failure_file + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << f.to_json().dump() << "\n";
    if (!out) {
      say("cannot write --failure-file " + o_.failure_file + ": " + std::strerror(errno));
      return;
    }
  }
  if (::rename(tmp.c_str(), o_.failure_file.c_str()) != 0) {
    say("cannot write --failure-file " + o_.failure_file + ": " + std::strerror(errno));
    ::unlink(tmp.c_str());
  }
}

void Agent::publish_to_failure_store(const Failure& f) const {
  if (o_.failure_store_key.empty()) return;
  const std::string where = o_.failure_store_host + ":" + std::to_string(o_.failure_store_port);
  try {
    store::StoreClient::Options copts;
    copts.connect_timeout = std::chrono::seconds(5);
    copts.timeout = std::chrono::seconds(10);
    auto client = store::StoreClient::connect(
        o_.failure_store_host, static_cast<std::uint16_t>(o_.failure_store_port), copts);
    client->set(o_.failure_store_key, f.to_json().dump());
  } catch (const Error& e) {
    say("cannot publish the failure to --failure-store " + where + ": " + e.what());
  }
}

int Agent::run() {
  validate_launch_options(o_);
  if (uses_fork_server(o_)) fork_server_lib_ = launch::fork_server_library();
  if (o_.start_method != "spawn" && !runs_with_python(o_) && o_.nnodes == 1) {
    warm_socket_ = launch::warm_fork_server_socket(o_.program);
  }
  guard_ = std::make_unique<launch::Guard>();
  setup_signals();
  setup_store();
  nnodes_ = o_.nnodes;
  heartbeat_timeout_ = o_.heartbeat_timeout.count() > 0
                           ? o_.heartbeat_timeout
                           : std::max(std::chrono::milliseconds(10000), 50 * o_.monitor_interval);

  if (!o_.log_dir.empty()) {
    run_dir_ = o_.log_dir + "/" + o_.rdzv_id;
    std::filesystem::create_directories(run_dir_);
  } else {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dtrain-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw Error("cannot create a temporary directory: " + std::string(std::strerror(errno)));
    }
    run_dir_ = tmpl;
    own_run_dir_ = true;
  }
  struct Cleanup {
    Agent* a;
    ~Cleanup() {
      if (a->own_run_dir_) {
        std::error_code ec;
        std::filesystem::remove_all(a->run_dir_, ec);
      }
    }
  } cleanup{this};

  int code = 1;
  int round = 0;
  int failures = 0;  // attempts that failed (an elastic membership change is not one)
  int node_rank = o_.node_rank;
  for (;; ++round) {
    launch::RendezvousResult rdzv;
    launch::NodeInfo self{host_, o_.nproc_per_node, static_cast<int>(::getpid())};
    if (multi_node()) {
      try {
        if (elastic()) {
          // A late agent may be admitted to a later round than ours; go on from there.
          rdzv =
              launch::elastic_rendezvous(*store_, o_.rdzv_id, round, self,
                                         {o_.min_nodes, o_.nnodes, o_.last_call, o_.rdzv_timeout});
          round = rdzv.round;
        } else {
          rdzv = launch::rendezvous(*store_, o_.rdzv_id, round, node_rank, o_.nnodes, self,
                                    o_.rdzv_timeout);
        }
      } catch (const TimeoutError& e) {
        say(e.what());
        return 1;
      } catch (const NetworkError& e) {
        say(std::string("rendezvous failed: ") + e.what());
        return 1;
      }
      if (!elastic()) node_rank = rdzv.node_rank;  // keep the rank we got for later rounds
      nnodes_ = rdzv.nnodes;
      if (elastic()) {
        say("round " + std::to_string(round) + ": " + std::to_string(rdzv.nnodes) +
            " node(s) (--nnodes " + std::to_string(o_.min_nodes) + ":" + std::to_string(o_.nnodes) +
            "), world size " + std::to_string(rdzv.world_size) + ", this node is node " +
            std::to_string(rdzv.node_rank));
      }
    } else {
      rdzv = launch::layout(round, 0, {self});
    }
    node_rank_ = rdzv.node_rank;
    AttemptResult r = run_attempt(rdzv);
    if (r.outcome == Outcome::kSucceeded) {
      code = 0;
      break;
    }
    if (r.outcome == Outcome::kInterrupted) {
      code = 128 + r.signal;
      break;
    }
    if (r.failure.membership) {
      say("restarting the workers for a membership change: " + r.failure.reason);
      continue;
    }
    ++failures;
    failures_ =
        failures;  // the standby already started is for the restart below; no new one after it
    const bool leave = elastic() && o_.leave_on_worker_failure && r.failure.rank >= 0 &&
                       r.failure.node_rank == node_rank_;
    if (shared_console() && node_rank_ != 0) {
      // srun and the host-file launcher merge every agent's output on one console: node 0
      // prints the full root cause; the others, one line (enough if node 0 is gone).
      say("job failed: " + r.failure.one_line() + "; node 0's agent prints the root cause");
    } else {
      if (r.failure.collectives.empty())
        r.failure.collectives = published_collectives(round, rdzv.world_size);
      launch::write_all(STDERR_FILENO, r.failure.summary(o_.stderr_tail_lines));
    }
    write_failure_file(r.failure);
    publish_to_failure_store(r.failure);
    code = r.failure.exit_code;
    if (leave) {
      say("leaving the job: a worker of this node failed; the other nodes go on without it");
      break;
    }
    if (r.failure.final || failures > o_.max_restarts) break;
    say("restarting all workers (restart " + std::to_string(failures) + " of " +
        std::to_string(o_.max_restarts) + ")");
  }
  drop_standby();
  finish_job(round);
  return code;
}

}  // namespace

int run_launch(LaunchOptions options) {
  if (options.dry_run) {
    validate_launch_options(options);
    return print_plan(options);
  }
  if (options.engine == "ssh") {
    validate_launch_options(options);
    return run_ssh_launch(options);
  }
  Agent agent(std::move(options));
  return agent.run();
}

}  // namespace dtrain
