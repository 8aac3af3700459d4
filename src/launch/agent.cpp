// The per-node agent: rendezvous, spawn, fan-in, monitor, tear down, restart.
//
// One thread does everything but serve the store: a poll() loop over a signalfd (SIGCHLD,
// SIGINT, SIGTERM, SIGHUP, SIGQUIT) and every worker's stdout/stderr pipe. A worker's death is seen
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
//   workers_cleared  (R > 0) node 0 deleted the previous workers' keys; every agent waits for
//               it before starting its workers (launch/worker_keys.h).
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
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "core/hostfile.h"
#include "core/owned_dir.h"
#include "core/shared_files.h"
#include "diagnosis/records.h"
#include "dtrain/env.h"
#include "dtrain/error.h"
#include "dtrain/launch.h"
#include "dtrain/store.h"
#include "engines/engine.h"
#include "launch/elastic_rendezvous.h"
#include "launch/failure.h"
#include "launch/fork_server.h"
#include "launch/guard.h"
#include "launch/options_internal.h"
#include "launch/output.h"
#include "launch/rendezvous.h"
#include "launch/worker_keys.h"
#include "launch/worker_set.h"
#include "store/socket.h"

namespace dtrain {

namespace {

using Clock = std::chrono::steady_clock;
using launch::Failure;
using launch::say;
using launch::signal_name;
using nlohmann::json;

constexpr char kRunDirStem[] = "dtrain-run-";  // the agent's temporary run directory

std::string hostname() {
  std::string h = this_host_name();
  return h.empty() ? "localhost" : h;
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

enum class Outcome { kSucceeded, kFailed, kInterrupted };

struct AttemptResult {
  Outcome outcome = Outcome::kSucceeded;
  Failure failure;  // kFailed
  int signal = 0;   // kInterrupted
};

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
  // A connection of our own to the store this agent hosts (single node: the agent has none).
  std::unique_ptr<store::StoreClient> connect_own_store(std::chrono::milliseconds timeout) const;
  // Before an attempt after the first: the previous workers' keys deleted (worker_keys.h).
  void clear_previous_workers(const launch::RendezvousResult& rdzv);
  bool restart_possible(int failures) const { return elastic() || failures < o_.max_restarts; }
  // One step of the loop: the signalfd, stdin (stop_on_stdin_eof) and the workers' fds.
  void poll_once(std::chrono::milliseconds timeout, std::vector<int>* signals);
  void stop_workers(int sig);
  Failure agent_failure(const std::string& reason, int exit_code, bool final);
  std::optional<Failure> publish_failure(const Failure& f);
  std::optional<Failure> remote_failure();
  void heartbeat_and_check(Clock::time_point now);
  void finish_job(int round);
  void write_failure_file(const Failure& f) const;
  // torchrun's @record main: the root cause's error file copied to the agent's own
  // TORCHELASTIC_ERROR_FILE (its errorCode set to the exit code, -N for signal N).
  void write_parent_error_file(const Failure& f) const;
  void publish_to_failure_store(const Failure& f) const;
  bool multi_node() const { return o_.nnodes > 1; }
  bool elastic() const { return o_.min_nodes > 0; }
  // Every agent's output reaches one console (srun's, or the host-file launcher's).
  bool shared_console() const {
    return multi_node() && (engines::named(o_.engine).shared_console() || o_.stop_on_stdin_eof);
  }
  std::string attempt_dir(int round) const;

  LaunchOptions o_;
  std::string host_;
  std::unique_ptr<launch::Guard> guard_;
  std::unique_ptr<launch::WorkerSet> workers_;  // after guard_: destroyed before it
  int signal_fd_ = -1;
  bool stdin_closed_ = false;  // stop_on_stdin_eof: stdin reached EOF
  std::unique_ptr<store::StoreServer> server_;
  std::string store_bind_;  // the address server_ binds ("": every interface)
  std::string own_store_host() const { return store_bind_.empty() ? "127.0.0.1" : store_bind_; }
  std::unique_ptr<store::StoreClient> store_;
  std::string store_host_;  // what workers get as MASTER_ADDR
  int store_port_ = 0;
  std::string run_dir_;  // the attempts' directories: error files, logs (setup_run_dir)
  std::unique_ptr<detail::OwnedTempDir> own_run_dir_;  // run_dir_ when it is a temporary one
  void setup_run_dir();
  int node_rank_ = -1;
  int nnodes_ = 1;
  std::string prefix_;  // round_prefix of the current round
  // Heartbeats of the other nodes: last value and when it last changed.
  std::map<int, std::pair<std::string, Clock::time_point>> heartbeats_;
  int64_t beat_ = 0;
  std::chrono::milliseconds heartbeat_timeout_{0};
};

// While the agent blocks in the store (connecting, the rendezvous), nothing reads the
// signalfd: a thread waits for SIGINT/SIGTERM/SIGHUP/SIGQUIT meanwhile and ends the agent at once
// with 128 + N, as torchrun does. No worker runs then (an earlier attempt's are stopped before the
// next rendezvous); the guard removes what the agent leaves. SIGCHLD stays for the signalfd.
class InterruptibleWait {
 public:
  explicit InterruptibleWait(const char* what) : what_(what) {
    thread_ = std::thread([this] { watch(); });
  }
  ~InterruptibleWait() {
    done_ = true;
    thread_.join();  // within one tick of sigtimedwait
  }
  InterruptibleWait(const InterruptibleWait&) = delete;
  InterruptibleWait& operator=(const InterruptibleWait&) = delete;

 private:
  void watch() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&set, s);
    const timespec tick{0, 20 * 1000 * 1000};
    while (!done_) {
      const int sig = ::sigtimedwait(&set, nullptr, &tick);
      if (sig <= 0) continue;
      const std::string line = std::string("dtrain: ") + ::strsignal(sig) + " while " + what_ +
                               "; stopping (exit code " + std::to_string(128 + sig) + ")\n";
      launch::write_all(STDERR_FILENO, line);
      ::_exit(128 + sig);
    }
  }
  const char* what_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

void Agent::setup_signals() {
  // Block the signals we handle before any thread exists (the store's thread inherits the
  // mask), then read them from a signalfd in the poll loop.
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&set, s);
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
      store::StoreServer::Options so;
      // Reachable at the job's address only, not through every interface of this machine.
      so.bind_host = store_bind_ = net::bind_address_for(o_.master_addr);
      so.token = o_.store_token;
      if (o_.master_port < 0) {
        // No port given, one node: torchrun's default, else any free one (torchrun would fail).
        so.port = 29500;
        try {
          server_ = store::StoreServer::start(so);
        } catch (const AddressInUseError&) {
          so.port = 0;
          server_ = store::StoreServer::start(so);
        }
      } else {
        so.port = static_cast<std::uint16_t>(o_.master_port);
        server_ = store::StoreServer::start(so);
      }
    } catch (const AddressInUseError& e) {
      // With c10d every agent tries to host the endpoint; the first one to bind does.
      if (!(o_.rdzv_backend == "c10d" && o_.nnodes > 1)) {
        // The port is --master-port's or --rdzv-endpoint's (which overrides it).
        throw UsageError("--master-port/--rdzv-endpoint: port " + std::to_string(o_.master_port) +
                         " is already in use on this host; choose a free port (or, on a single "
                         "node, give neither to get one)");
      }
    }
  }
  store_port_ = server_ ? server_->port() : (o_.master_port < 0 ? 29500 : o_.master_port);
  store_host_ = o_.master_addr;
  store::StoreClient::Options copts;
  copts.connect_timeout = o_.rdzv_timeout;
  copts.timeout = o_.rdzv_timeout;
  copts.token = o_.store_token;
  if (multi_node()) {
    // Our own server is reached over loopback (or the one address it binds); others at the
    // master address.
    try {
      store_ = store::StoreClient::connect(server_ ? own_store_host() : store_host_,
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

std::unique_ptr<store::StoreClient> Agent::connect_own_store(
    std::chrono::milliseconds timeout) const {
  store::StoreClient::Options copts;
  copts.connect_timeout = timeout;
  copts.timeout = timeout;
  copts.token = o_.store_token;
  return store::StoreClient::connect(own_store_host(), static_cast<std::uint16_t>(store_port_),
                                     copts);
}

void Agent::clear_previous_workers(const launch::RendezvousResult& rdzv) {
  if (!multi_node()) {
    launch::clear_worker_keys(*connect_own_store(std::chrono::seconds(10)));
    return;
  }
  const std::string cleared = launch::round_prefix(o_.rdzv_id, rdzv.round) + "workers_cleared";
  if (rdzv.node_rank == 0) {
    launch::clear_worker_keys(*store_);
    store_->set(cleared, "1");
  } else if (!store_->wait({cleared}, o_.rdzv_timeout)) {
    throw TimeoutError("round " + std::to_string(rdzv.round) + " of job '" + o_.rdzv_id +
                       "': node 0's agent did not clear the previous workers' store keys within " +
                       std::to_string(o_.rdzv_timeout.count() / 1000) +
                       " s (it died or lost the store?)");
  }
}

std::vector<std::string> Agent::published_collectives(int round, int world_size) {
  try {
    std::unique_ptr<store::StoreClient> own;
    store::StoreClient* client = store_.get();
    if (!client) {
      if (!server_) return {};
      own = connect_own_store(std::chrono::seconds(2));
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

namespace {

// Whether a job without --log-dir still has output only files can keep: streams redirected
// off the console or teed (torchrun writes both to its torchelastic_ directory), or the
// duplicate filters' copies.
bool keeps_output_in_files(const LaunchOptions& o) {
  for (const auto* spec : {&o.redirects, &o.tee})
    for (const auto& [rank, mask] : *spec)
      if (mask != 0) return true;
  return !o.duplicate_stdout_filters.empty() || !o.duplicate_stderr_filters.empty();
}

// ROOT/<run id>_<8 of [a-z0-9_]>, made new (Python's tempfile.mkdtemp(prefix=run_id + "_"),
// as torchrun names it): agents sharing a log directory, on one host or several, never
// share a run directory.
std::string make_run_dir(const std::string& root, const std::string& run_id) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789_";
  std::random_device seed;
  std::mt19937_64 gen(seed());
  std::uniform_int_distribution<size_t> pick(0, sizeof kChars - 2);
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  std::string dir;
  for (int tries = 0; tries < 100; ++tries) {
    dir = root + "/" + run_id + "_";
    for (int i = 0; i < 8; ++i) dir += kChars[pick(gen)];
    if (!ec && ::mkdir(dir.c_str(), 0755) == 0) return dir;
    if (ec || errno != EEXIST) break;
  }
  throw UsageError("--log-dir " + root + ": cannot create " + dir + " (" +
                   (ec ? ec.message() : std::string(std::strerror(errno))) +
                   "); give a directory this user can write");
}

}  // namespace

void Agent::setup_run_dir() {
  std::string root = o_.log_dir;
  if (root.empty() && keeps_output_in_files(o_)) {
    // torchrun keeps them in a torchelastic_XXXXXXXX of its own without saying where; this
    // one is kept too, and named.
    std::string tmpl = std::filesystem::temp_directory_path().string() + "/dtrain-logs-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
      throw Error("cannot create a log directory " + tmpl + ": " + std::strerror(errno) +
                  "; give --log-dir");
    root = tmpl;
  }
  if (!root.empty()) {
    run_dir_ = make_run_dir(root, o_.rdzv_id);
    if (o_.log_dir.empty())
      launch::say(
          "no --log-dir: the logs of the redirected and teed streams and filtered lines are in " +
          run_dir_);
    return;
  }
  // /tmp/dtrain-run-<pid>-XXXXXX: removed at exit; by the guard if this agent is SIGKILLed;
  // by the next agent or driver on the host if the guard dies too (core/owned_dir.h).
  own_run_dir_ = std::make_unique<detail::OwnedTempDir>(kRunDirStem);
  run_dir_ = std::filesystem::absolute(own_run_dir_->path()).string();
  guard_->remove_dir_on_exit(run_dir_);
}

std::string Agent::attempt_dir(int round) const {
  return run_dir_ + "/attempt_" + std::to_string(round);
}

void Agent::poll_once(std::chrono::milliseconds timeout, std::vector<int>* signals) {
  std::vector<pollfd> fds;
  fds.push_back({signal_fd_, POLLIN, 0});
  const bool watch_stdin = o_.stop_on_stdin_eof && !stdin_closed_;
  if (watch_stdin) fds.push_back({STDIN_FILENO, POLLIN, 0});
  const size_t first_worker_fd = fds.size();
  const std::vector<pollfd> worker_fds = workers_->poll_fds();
  fds.insert(fds.end(), worker_fds.begin(), worker_fds.end());
  if (auto due = workers_->output_flush_due()) {  // a partial line waiting for its idle flush
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(*due - launch::OutputStream::Clock::now());
    timeout = std::clamp(left, std::chrono::milliseconds(0), timeout);
  }
  int n = ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  if (n <= 0) {
    workers_->flush_idle_output();
    return;
  }
  if (watch_stdin && fds[1].revents != 0) {
    // stdin of an agent started over ssh: EOF means the launching dtrain is gone or wants
    // the job stopped. Treat it as SIGHUP.
    char buf[256];
    ssize_t r = ::read(STDIN_FILENO, buf, sizeof buf);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
      stdin_closed_ = true;
      if (signals) signals->push_back(SIGHUP);
    }
  }
  workers_->on_ready(
      std::vector<pollfd>(fds.begin() + static_cast<long>(first_worker_fd), fds.end()));
  workers_->flush_idle_output();  // after the reads: a line whose rest just came goes whole
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
    if (child) workers_->reap();
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
  workers_->stop(sig, [this](std::chrono::milliseconds timeout, std::vector<int>* signals) {
    poll_once(timeout, signals);
  });
}

AttemptResult Agent::run_attempt(const launch::RendezvousResult& rdzv) {
  prefix_ = launch::round_prefix(o_.rdzv_id, rdzv.round);
  heartbeats_.clear();
  // A kept run directory (not the temporary one) gets the workers' stdout.log and stderr.log.
  workers_->spawn(rdzv, attempt_dir(rdzv.round), own_run_dir_ == nullptr, store_host_, store_port_);
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
    if (auto f = workers_->first_failure()) {
      f->time = utc_now();
      f->host = host_;
      f->node_rank = node_rank_;
      failure = f;
      break;
    }
    if (!local_done && !workers_->any_alive()) {
      local_done = true;
      workers_->release();
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

void Agent::write_parent_error_file(const Failure& f) const {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path || f.error_file_contents.empty()) return;
  json data;
  try {
    data = json::parse(f.error_file_contents);
  } catch (const json::exception&) {
    return;  // not the JSON a @record worker writes
  }
  const int code = f.signal > 0 ? -f.signal : f.exit_code;
  if (code != 0 && data.is_object() && data.contains("message") && data["message"].is_object())
    data["message"]["errorCode"] = code;
  std::ofstream out(path, std::ios::trunc);
  out << data.dump();
  if (!out) say(std::string("cannot write TORCHELASTIC_ERROR_FILE ") + path);
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
  std::string fork_server_lib, warm_socket;
  if (uses_fork_server(o_)) fork_server_lib = launch::fork_server_library();
  if (o_.start_method != "spawn" && !runs_with_python(o_)) {
    // A local search's agent has it in its environment; a cluster search's remote agents
    // through --env (then it is for this agent only, not its workers).
    const auto it = o_.extra_env.find("DTRAIN_FORKSERVER_WARM_SOCKET");
    warm_socket = launch::warm_fork_server_socket(
        o_.program, it == o_.extra_env.end() ? nullptr : it->second.c_str());
  }
  o_.extra_env.erase("DTRAIN_FORKSERVER_WARM_SOCKET");
  guard_ = std::make_unique<launch::Guard>();
  workers_ = std::make_unique<launch::WorkerSet>(o_, *guard_, std::move(fork_server_lib),
                                                 std::move(warm_socket));
  workers_->set_restart_possible(restart_possible(0));
  setup_signals();
  {
    // Only several nodes wait here (a single node's store is its own, at once): the watch
    // thread costs up to one 20 ms tick to stop, which a single node's start-up need not pay.
    std::optional<InterruptibleWait> interruptible;
    if (multi_node()) interruptible.emplace("connecting to the job's store");
    setup_store();
  }
  nnodes_ = o_.nnodes;
  heartbeat_timeout_ = o_.heartbeat_timeout.count() > 0
                           ? o_.heartbeat_timeout
                           : std::max(std::chrono::milliseconds(10000), 50 * o_.monitor_interval);

  setup_run_dir();
  struct Cleanup {
    Agent* a;
    ~Cleanup() {
      if (a->own_run_dir_) {
        a->own_run_dir_.reset();
        a->guard_->keep_dir();  // removed: the name may be another's by the time the guard ends
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
      InterruptibleWait interruptible("waiting for the other nodes (rendezvous)");
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
        if (round > 0) clear_previous_workers(rdzv);
      } catch (const TimeoutError& e) {
        say(e.what());
        launch::record_launcher_error(e);  // as torchrun's @record: RendezvousTimeoutError
        return 1;
      } catch (const NetworkError& e) {
        say(std::string("rendezvous failed: ") + e.what());
        launch::record_launcher_error(e);
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
      if (round > 0) clear_previous_workers(rdzv);
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
    // The standby already started is for the restart below; no new one after the last.
    workers_->set_restart_possible(restart_possible(failures));
    const bool leave = elastic() && o_.leave_on_worker_failure && r.failure.rank >= 0 &&
                       r.failure.node_rank == node_rank_;
    if (shared_console() && node_rank_ != 0) {
      // srun and the host-file launcher merge every agent's output on one console: node 0
      // prints the full root cause; the others, one line (enough if node 0 is gone).
      say("job failed: " + r.failure.one_line() + "; node 0's agent prints the root cause");
    } else {
      if (r.failure.collectives.empty())
        r.failure.collectives = published_collectives(round, rdzv.world_size);
      launch::say_block(r.failure.summary(o_.stderr_tail_lines));
    }
    write_failure_file(r.failure);
    publish_to_failure_store(r.failure);
    if (leave || r.failure.final || failures > o_.max_restarts) write_parent_error_file(r.failure);
    code = r.failure.exit_code;
    if (leave) {
      say("leaving the job: a worker of this node failed; the other nodes go on without it");
      break;
    }
    if (r.failure.final || failures > o_.max_restarts) break;
    say("restarting all workers (restart " + std::to_string(failures) + " of " +
        std::to_string(o_.max_restarts) + ")");
  }
  workers_->drop_standby();
  // The data reader's shared cache of workers that died without clean-up: no one holds it now.
  detail::sweep_shared_files("/dev/shm", detail::data_cache_stem());
  finish_job(round);
  return code;
}

}  // namespace

int run_agent(LaunchOptions options) {
  Agent agent(std::move(options));
  return agent.run();
}

int run_launch(LaunchOptions options) {
  if (options.dry_run) {
    validate_launch_options(options);
    return print_plan(options);
  }
  // This node's agent, or (ssh) one agent per host started from here.
  const engines::Engine& engine = engines::named(options.engine);
  return engine.launch(std::move(options));
}

}  // namespace dtrain
