// This node's workers (see worker_set.h).
#include "launch/worker_set.h"
#include "launch/forkserver/protocol.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dtrain/env.h"
#include "dtrain/error.h"
#include "launch/deepspeed_worker.h"
#include "launch/options_internal.h"
#include "launch/string_template.h"
#include "launch/worker_process.h"

namespace dtrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

bool mask_has(const std::map<int, int>& spec, int local_rank, int bit) {
  auto it = spec.find(local_rank);
  if (it == spec.end()) it = spec.find(-1);
  return it != spec.end() && (it->second & bit) != 0;
}

// --virtual-local-rank: the worker sees one GPU, local rank `lr`'s: that entry of the agent's
// CUDA_VISIBLE_DEVICES, else `lr` itself (as torchrun's LocalElasticAgent).
void set_visible_device(std::vector<std::string>& env, int lr) {
  const std::string key = "CUDA_VISIBLE_DEVICES=";
  std::string device = std::to_string(lr);
  for (auto it = env.begin(); it != env.end(); ++it) {
    if (it->rfind(key, 0) != 0) continue;
    std::vector<std::string> listed;
    std::stringstream list(it->substr(key.size()));
    for (std::string d; std::getline(list, d, ',');) listed.push_back(d);
    if (lr >= static_cast<int>(listed.size()))
      throw UsageError("--virtual-local-rank: local rank " + std::to_string(lr) +
                       " has no GPU of its own in CUDA_VISIBLE_DEVICES=" + it->substr(key.size()) +
                       " (" + std::to_string(listed.size()) +
                       " listed); list one per worker or run fewer workers per node");
    device = listed[static_cast<size_t>(lr)];
    device.erase(0, device.find_first_not_of(' '));
    device.erase(device.find_last_not_of(' ') + 1);
    env.erase(it);
    break;
  }
  env.push_back(key + device);
}

std::string read_file(const std::string& path, size_t limit = 64 * 1024) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::string s(limit, '\0');
  in.read(s.data(), static_cast<std::streamsize>(limit));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

}  // namespace

WorkerSet::WorkerSet(const LaunchOptions& options, Guard& guard, std::string fork_server_lib,
                     std::string warm_socket)
    : o_(options),
      guard_(guard),
      fork_server_lib_(std::move(fork_server_lib)),
      warm_socket_(std::move(warm_socket)) {
  if (o_.bind_cores_to_rank) binding_ = bind_cores(o_.nproc_per_node, o_.bind_core_list);
  // `dtrain deepspeed`'s PROGRAM forked from a server: this agent does what its shim would.
  if (!fork_server_lib_.empty()) deepspeed_ = deepspeed_shim_of(o_);
}

WorkerSet::~WorkerSet() { drop_standby(); }

bool WorkerSet::any_alive() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.alive; });
}

std::vector<pollfd> WorkerSet::poll_fds() const {
  std::vector<pollfd> fds;
  for (auto& w : workers_) {
    if (w.out_fd >= 0) fds.push_back({w.out_fd, POLLIN, 0});
    if (w.err_fd >= 0) fds.push_back({w.err_fd, POLLIN, 0});
  }
  if (fork_server_ && fork_server_->reply_fd() >= 0)
    fds.push_back({fork_server_->reply_fd(), POLLIN, 0});
  return fds;
}

void WorkerSet::on_ready(const std::vector<pollfd>& fds) {
  // poll_fds()'s order: each worker's out and err pipe (those open), then the fork server's.
  size_t i = 0;
  for (auto& w : workers_) {
    const bool out = w.out_fd >= 0, err = w.err_fd >= 0;
    if (out && i < fds.size() && fds[i++].revents) read_pipe(w, false);
    if (err && i < fds.size() && fds[i++].revents) read_pipe(w, true);
  }
  if (i < fds.size() && fds[i].revents) {
    read_fork_server();
    // A warm launch server reports its workers' ends here (no SIGCHLD for them).
    if (fork_server_ && fork_server_->warm()) reap();
  }
}

std::optional<OutputStream::Clock::time_point> WorkerSet::output_flush_due() const {
  std::optional<OutputStream::Clock::time_point> due;
  for (const auto& w : workers_) {
    for (const auto* s : {&w.out, &w.err}) {
      if (!*s) continue;
      auto d = (*s)->flush_due();
      if (d && (!due || *d < *due)) due = d;
    }
  }
  return due;
}

void WorkerSet::flush_idle_output() {
  const auto now = OutputStream::Clock::now();
  for (auto& w : workers_) {
    if (w.out) w.out->flush_idle(now);
    if (w.err) w.err->flush_idle(now);
  }
}

void WorkerSet::worker_command(std::vector<std::string>& argv, std::vector<std::string>& inherited,
                               std::vector<std::string>& tail) const {
  std::vector<std::string> base = current_environment();
  // Drop what we set, so a parent launcher's contract never leaks into ours.
  WorkerEnv proto;
  auto contract = proto.to_variables();
  bool has_omp = false;
  bool has_arrow_malloc = false;
  bool has_tunables = false;
  bool has_nccl_errors = false;
  inherited.clear();
  for (auto& e : base) {
    std::string name = e.substr(0, e.find('='));
    if (contract.count(name) || o_.extra_env.count(name)) continue;
    if (name == "DTRAIN_FORKSERVER_WARM_SOCKET") continue;   // for this agent only
    if (name == "DTRAIN_STORE_TOKEN") continue;              // the job's, below
    if (name == "DTRAIN_BIND_CPUS") continue;                // each rank's, below
    if (name == "TORCHELASTIC_SIGNALS_TO_HANDLE") continue;  // the flag's, below
    if (name == "TORCH_NCCL_ASYNC_ERROR_HANDLING") has_nccl_errors = true;
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
  // C++ workers prove it to the store (store/token_store.h); never on a command line.
  if (!o_.store_token.empty()) extra_env["DTRAIN_STORE_TOKEN"] = o_.store_token;
  if (o_.malloc_hugepages && !has_tunables) {
    auto it = extra_env.find("GLIBC_TUNABLES");
    if (it == extra_env.end()) {
      inherited.push_back("GLIBC_TUNABLES=glibc.malloc.hugetlb=1");
    } else {
      it->second += ":glibc.malloc.hugetlb=1";
    }
  }
  argv.clear();
  if (deepspeed_) {
    // The server runs PROGRAM itself (each worker gets DeepSpeed's argv in the spec).
    argv.push_back(fork_server_program(o_));
    argv.insert(argv.end(), deepspeed_->args.begin(), deepspeed_->args.end());
  } else {
    if (runs_with_python(o_)) {
      argv = {o_.python, "-u"};
      if (o_.module) argv.push_back("-m");
    }
    argv.push_back(o_.program);
    argv.insert(argv.end(), o_.args.begin(), o_.args.end());
  }

  tail.clear();
  for (auto& [k, v] : extra_env) tail.push_back(k + "=" + v);
  // As torchrun: the launcher's --signals-to-handle, and NCCL's asynchronous error handling
  // on (1: a failed or timed-out NCCL collective aborts the communicator and the process)
  // unless the environment says otherwise.
  if (!o_.extra_env.count("TORCHELASTIC_SIGNALS_TO_HANDLE"))
    tail.push_back("TORCHELASTIC_SIGNALS_TO_HANDLE=" + o_.signals_to_handle);
  if (!has_nccl_errors && !o_.extra_env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING"))
    tail.push_back("TORCH_NCCL_ASYNC_ERROR_HANDLING=1");
  // torchrun sets it only where a node runs more than one worker.
  if (!has_omp && !o_.extra_env.count("OMP_NUM_THREADS") &&
      (o_.bind_cores_to_rank || o_.nproc_per_node > 1)) {
    const int threads = o_.bind_cores_to_rank ? binding_.cores_per_rank : 1;
    tail.push_back("OMP_NUM_THREADS=" + std::to_string(threads));
  }
  // Arrow's bundled jemalloc (pyarrow's libarrow, which dtrain::data links) starts a purging
  // thread while the library loads, so a program linking it could not start from the fork
  // server; without it jemalloc purges inline. A value the user set wins.
  if (!has_arrow_malloc && !o_.extra_env.count("JE_ARROW_MALLOC_CONF"))
    tail.push_back("JE_ARROW_MALLOC_CONF=background_thread:false");
}

void WorkerSet::spawn(const RendezvousResult& rdzv, const std::string& dir, bool write_logs,
                      const std::string& master_addr, int master_port) {
  std::vector<std::string> argv, inherited, tail;
  worker_command(argv, inherited, tail);
  // A worker's environment: inherited, then the contract, then ours. The fork server gets
  // the same without the contract (what differs between workers).
  std::vector<std::string> common = inherited;
  common.insert(common.end(), tail.begin(), tail.end());

  workers_.clear();
  workers_.resize(o_.nproc_per_node);
  // torchrun's attempt_K/filtered_std{out,err}.log: created for the attempt even when no
  // line matches; the console's matching lines of every rank, prefixed.
  std::filesystem::create_directories(dir);
  std::shared_ptr<FilteredLog> filtered_out, filtered_err;
  if (!o_.duplicate_stdout_filters.empty())
    filtered_out =
        std::make_shared<FilteredLog>(dir + "/filtered_stdout.log", o_.duplicate_stdout_filters);
  if (!o_.duplicate_stderr_filters.empty())
    filtered_err =
        std::make_shared<FilteredLog>(dir + "/filtered_stderr.log", o_.duplicate_stderr_filters);
  std::vector<std::vector<std::string>> envs(workers_.size());
  std::vector<ForkServerWorker> started(workers_.size());  // what a fork server gets
  for (int lr = 0; lr < o_.nproc_per_node; ++lr) {
    Worker& w = workers_[lr];
    w.local_rank = lr;
    w.rank = rdzv.rank_offset + lr;
    // torchrun's layout: one directory per local rank (the run directory is the agent's own).
    const std::string rank_dir = dir + "/" + std::to_string(lr);
    std::filesystem::create_directories(rank_dir);
    w.error_file = rank_dir + "/error.json";
    WorkerEnv env;
    env.rank = w.rank;
    const bool shared_host = o_.host_rank >= 0;  // several agents on this host (Ray)
    env.local_rank = o_.virtual_local_rank ? 0 : shared_host ? o_.first_local_rank + lr : lr;
    env.world_size = rdzv.world_size;
    env.local_world_size = shared_host ? o_.host_world_size : o_.nproc_per_node;
    env.group_rank = rdzv.node_rank;
    env.group_world_size = rdzv.nnodes;
    env.role_rank = w.rank;
    env.role_world_size = rdzv.world_size;
    env.role_name = o_.role;
    env.master_addr = master_addr;
    env.master_port = master_port;
    env.restart_count = rdzv.round;
    env.max_restarts = o_.max_restarts;
    env.run_id = o_.rdzv_id;
    env.use_agent_store = true;
    env.error_file = w.error_file;
    envs[lr] = inherited;
    for (auto& [k, v] : env.to_variables()) envs[lr].push_back(k + "=" + v);
    // Ray Train's TorchTrainer gives its workers the host's index too.
    if (shared_host) envs[lr].push_back("NODE_RANK=" + std::to_string(o_.host_rank));
    envs[lr].insert(envs[lr].end(), tail.begin(), tail.end());
    if (o_.virtual_local_rank)  // the node's local rank, whose GPU it is
      set_visible_device(envs[lr], shared_host ? o_.first_local_rank + lr : lr);
    // Applied by the worker itself before the program runs (worker_process.cpp, the fork
    // server's child); the program may read it.
    if (o_.bind_cores_to_rank)
      envs[lr].push_back("DTRAIN_BIND_CPUS=" + cpu_list_string(binding_.cpus[lr]));
    ForkServerWorker& fs = started[static_cast<size_t>(lr)];
    std::string own_log;  // dtrain deepspeed --enable_each_rank_log: the rank's file
    if (deepspeed_) {
      // What `dtrain deepspeed-exec` would make of this worker (launch/deepspeed_worker.h).
      const DsWorker ds = ds_worker(*deepspeed_, env.group_rank, env.local_rank);
      fs.env = ds_worker_env(envs[lr], *deepspeed_, env.group_rank, ds);
      fs.argv = ds.argv;
      if (ds.binding) {
        fs.cpus = ds.binding->cpus;
        fs.mem_policy = ds.binding->mem_policy();
        if (fs.mem_policy != 0) fs.mem_nodes = ds.binding->mem_nodes;
      }
      own_log = ds.log_path;
    } else {
      fs.env = envs[lr];
      if (o_.bind_cores_to_rank) fs.cpus = binding_.cpus[lr];
      // torchrun's ${local_rank} in the arguments: the node's local rank (with
      // --virtual-local-rank too, whose LOCAL_RANK is 0).
      if (o_.expand_local_rank) {
        auto own = substitute_local_rank(argv, shared_host ? o_.first_local_rank + lr : lr);
        if (own != argv) fs.argv = std::move(own);
      }
    }

    auto open_log = [&](const char* name) {
      if (!write_logs) return -1;
      std::string path = rank_dir + "/" + name;
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) throw Error("cannot create log file " + path + ": " + std::strerror(errno));
      return fd;
    };
    const std::string prefix =
        o_.log_line_prefix_template.empty()
            ? "[" + o_.role + std::to_string(w.rank) + "]:"
            : safe_substitute(o_.log_line_prefix_template, {{"role_name", o_.role},
                                                            {"rank", std::to_string(w.rank)},
                                                            {"local_rank", std::to_string(lr)}});
    // As torchrun's DefaultLogsSpecs: a stream has its file (stdout.log, stderr.log) only where
    // --redirects or --tee names it; a rank the filter shows has it on the console unless it
    // is redirected and not teed (torchrun tails a teed stream from its file, redirected or
    // not); the duplicate filters copy what the console shows of the teed streams only.
    const bool shown = o_.local_ranks_filter.empty() || o_.local_ranks_filter.count(lr) > 0;
    auto console = [&](int bit, int fd) {
      return shown && (mask_has(o_.tee, lr, bit) || !mask_has(o_.redirects, lr, bit)) ? fd : -1;
    };
    auto file = [&](int bit, const char* name) {
      return mask_has(o_.redirects, lr, bit) || mask_has(o_.tee, lr, bit) ? open_log(name) : -1;
    };
    auto filtered = [&](int bit, const std::shared_ptr<FilteredLog>& log) {
      return mask_has(o_.tee, lr, bit) ? log : nullptr;
    };
    if (!own_log.empty()) {
      // Both streams' bytes, as they come, to the rank's one file (as the shim's dup2 would);
      // nothing on the console.
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(own_log).parent_path(), ec);
      const int fd = ::open(own_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) throw Error("cannot create " + own_log + ": " + std::strerror(errno));
      w.out.emplace(prefix, -1, fd, 0);
      w.err.emplace(prefix, -1, ::fcntl(fd, F_DUPFD_CLOEXEC, 0), o_.stderr_tail_lines);
    } else {
      w.out.emplace(prefix, console(1, STDOUT_FILENO), file(1, "stdout.log"), 0,
                    filtered(1, filtered_out));
      w.err.emplace(prefix, console(2, STDERR_FILENO), file(2, "stderr.log"), o_.stderr_tail_lines,
                    filtered(2, filtered_err));
    }
  }
  stop_signal_ = 0;
  if (!warm_socket_.empty()) {
    // A warm server (a Tuner's, the program's libraries loaded once for all its trials)
    // forks the workers; when it cannot be reached, the workers start as below.
    std::vector<int> outs, errs;
    try {
      ForkServerLaunch launch{argv, common, started, fork_server_lib_};
      launch.warm_socket = warm_socket_;
      fork_server_ = std::make_unique<ForkServer>(launch, outs, errs);
      fork_server_pid_ = -1;  // its launch server's, once it says (read_fork_server)
      for (size_t lr = 0; lr < workers_.size(); ++lr) {
        workers_[lr].out_fd = outs[lr];
        workers_[lr].err_fd = errs[lr];
        workers_[lr].alive = true;
      }
      // The reads that waited for the launch server's pid may have taken all it will say - the
      // workers' pids and, for workers that ended at once, their statuses and the pipe's end -
      // and a closed pipe is never polled again: learn it now.
      reap();
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
        standby_->start(started);
        fork_server_ = std::move(standby_);
        outs.swap(standby_out_);
        errs.swap(standby_err_);
      } catch (const Error& e) {
        say(std::string("the standby fork server is gone (") + e.what() + "); starting a new one");
      }
    }
    drop_standby();  // one that ended on its own, or failed to start: a fresh server instead
    if (!fork_server_) {
      ForkServerLaunch launch{argv, common, started, fork_server_lib_};
      launch.inherit_stdin = workers_read_stdin();
      fork_server_ = std::make_unique<ForkServer>(launch, outs, errs);
      guard_.watch(fork_server_->pid());
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
    // Its own arguments where ${local_rank} made them differ (DeepSpeed's workers run
    // `argv`, which starts their own through the shim).
    const auto& own = started[lr].argv;
    SpawnSpec spec{own.empty() || deepspeed_ ? argv : own, envs[lr], {}};
    if (o_.bind_cores_to_rank) spec.cpus = binding_.cpus[lr];
    spec.inherit_stdin = workers_read_stdin();
    auto p = spawn_process(spec);
    guard_.watch(p.pid);
    w.pid = p.pid;
    w.out_fd = p.stdout_fd;
    w.err_fd = p.stderr_fd;
    w.alive = true;
  }
}

void WorkerSet::read_fork_server() {
  if (!fork_server_) return;
  auto learn = [&](const std::vector<std::pair<int, pid_t>>& forked) {
    for (auto [index, pid] : forked) {
      if (index < 0 || index >= static_cast<int>(workers_.size()) || workers_[index].pid > 0)
        continue;
      guard_.watch(pid);
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
    const std::string why = fork_server_->mode() == dtrain_forkserver::kModeExecCuda
                                ? " initialises CUDA's driver while loading (a forked process "
                                  "cannot use CUDA then)"
                                : " keeps a thread running after loading";
    say("a library of " + o_.program + why +
        ", so the fork server cannot fork it safely: each worker is fork+exec'd from it instead "
        "(--start-method spawn saves the server's own start)");
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
  guard_.forget(fork_server_->pid());
  fork_server_.reset();
  if (started_all && restart_possible_) start_standby();
}

void WorkerSet::start_standby() {
  if (standby_ || fork_server_lib_.empty()) return;
  std::vector<std::string> argv, inherited, tail;
  worker_command(argv, inherited, tail);
  inherited.insert(inherited.end(), tail.begin(), tail.end());
  try {
    ForkServerLaunch launch{argv, inherited, std::vector<ForkServerWorker>(o_.nproc_per_node),
                            fork_server_lib_};
    launch.inherit_stdin = workers_read_stdin();
    standby_ =
        std::make_unique<ForkServer>(launch, standby_out_, standby_err_, ForkServer::Standby{});
    guard_.watch(standby_->pid());
  } catch (const Error&) {
    // A restart starts a fresh server then, and says why if it cannot. The pipes are closed.
    standby_.reset();
    standby_out_.clear();
    standby_err_.clear();
  }
}

void WorkerSet::drop_standby() {
  for (auto* fds : {&standby_out_, &standby_err_}) {
    for (int fd : *fds) {
      if (fd >= 0) ::close(fd);
    }
    fds->clear();
  }
  if (!standby_) return;
  guard_.forget(standby_->pid());
  standby_.reset();  // it reads EOF on its go pipe and exits (or is SIGKILLed and reaped)
}

void WorkerSet::read_pipe(Worker& w, bool is_err) {
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

void WorkerSet::drain_and_close(Worker& w) {
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

void WorkerSet::reap() {
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
      bool ours = info.si_pid == guard_.pid();
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

std::optional<Failure> WorkerSet::first_failure() {
  for (auto& w : workers_) {
    if (w.alive) continue;
    bool ok = WIFEXITED(w.wait_status) && WEXITSTATUS(w.wait_status) == 0;
    if (ok) continue;
    drain_and_close(w);
    Failure f;
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
  return std::nullopt;
}

void WorkerSet::stop(
    int sig, const std::function<void(std::chrono::milliseconds, std::vector<int>*)>& poll) {
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
    poll(std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(50)), &sigs);
    if (!sigs.empty() && !killed) deadline = Clock::now();  // asked again: stop waiting
  }
  release();
}

void WorkerSet::release() {
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
    guard_.forget(w.pid);
    w.pid = -1;
  }
  sweep_orphans();
}

void WorkerSet::sweep_orphans() {
  // Children of ours that are not workers: grandchildren re-parented to us (subreaper).
  const pid_t self = ::getpid();
  const pid_t guard = guard_.pid();
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

}  // namespace dtrain::launch
