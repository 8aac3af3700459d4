// Host-file jobs (engine "ssh", src/engines/ssh.cpp): one agent per host, started over ssh.
//
// The launching dtrain (the "driver") is not an agent: it checks every host answers over
// ssh (an unreachable host is named and nothing starts, exit code 2), then runs
//   ssh [ssh options] HOST 'cd CWD; exec DTRAIN run --nnodes N --node-rank K
//        --master-addr HOST0 --master-port P --rdzv-id ID ... --stop-on-stdin-eof PROGRAM ARGS'
// for every host K. The agents do the rest exactly as in any multi-node job (rendezvous on
// node 0's store, rank-prefixed output, the shared root cause, the same exit code). The driver
// forwards their output and holds each ssh's stdin open: closing it (on SIGINT/SIGTERM/SIGHUP,
// when an agent's ssh fails, or when the driver dies, however it dies) reaches the agent as
// EOF, and an agent started with --stop-on-stdin-eof then stops its workers and exits. No
// remote process depends on ssh delivering a signal (it does not, without a tty).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/paths.h"
#include "dtrain/engine_env.h"
#include "dtrain/error.h"
#include "dtrain/launch.h"
#include "launch/cpu_binding.h"
#include "launch/options_internal.h"
#include "launch/output.h"
#include "launch/string_template.h"

extern char** environ;

namespace dtrain {

namespace {

using Clock = std::chrono::steady_clock;

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream s;
  s << static_cast<double>(ms.count()) / 1000.0;
  return s.str();
}

std::string stream_spec(const std::map<int, int>& m) {
  if (m.empty()) return "0";
  if (m.size() == 1 && m.count(-1)) return std::to_string(m.at(-1));
  std::string out;
  for (auto [rank, mask] : m) {
    if (rank < 0) continue;
    if (!out.empty()) out += ",";
    out += std::to_string(rank) + ":" + std::to_string(mask);
  }
  return out.empty() ? "0" : out;
}

std::string self_path() {
  auto self = read_self_exe();
  return self ? self->path : "dtrain";
}

// A child with a stdin pipe (kept by us) and its output read as it comes.
struct Child {
  std::string host;
  pid_t pid = -1;
  int in_fd = -1;
  int out_fd = -1;
  int err_fd = -1;
  std::optional<launch::OutputStream> out;
  std::optional<launch::OutputStream> err;
  bool exited = false;
  int code = -1;
  std::string captured;  // stdout+stderr when not forwarded (reachability checks)
};

void start_child(Child& c, const std::vector<std::string>& argv, bool forward) {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw Error(std::string("pipe: ") + std::strerror(errno));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group: a Ctrl-C at the terminal reaches the driver, which stops the job
  // in order, rather than killing the ssh connections under the agents.
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    ::close(err[0]);
    throw UsageError("cannot run '" + argv[0] + "': " + std::strerror(rc) +
                     "; install the ssh client (openssh-client)");
  }
  c.pid = pid;
  c.in_fd = in[1];
  c.out_fd = out[0];
  c.err_fd = err[0];
  ::fcntl(c.out_fd, F_SETFL, O_NONBLOCK);
  ::fcntl(c.err_fd, F_SETFL, O_NONBLOCK);
  if (forward) {
    c.out.emplace("", STDOUT_FILENO, -1, 0);
    c.err.emplace("", STDERR_FILENO, -1, 20);
  }
}

void read_child(Child& c, int& fd, bool is_err) {
  char buf[65536];
  while (fd >= 0) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      auto& s = is_err ? c.err : c.out;
      if (s) {
        s->write(std::string_view(buf, static_cast<size_t>(n)));
      } else {
        c.captured.append(buf, static_cast<size_t>(n));
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    ::close(fd);
    fd = -1;
    auto& s = is_err ? c.err : c.out;
    if (s) s->close();
  }
}

void close_stdin(Child& c) {
  if (c.in_fd >= 0) ::close(c.in_fd);
  c.in_fd = -1;
}

// One poll round over every child's output (and `extra_fd`, when >= 0); reaps exits.
// Returns true when extra_fd became readable.
bool pump(std::vector<Child>& children, std::chrono::milliseconds wait, int extra_fd) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Child*, bool>> owner;
  for (auto& c : children) {
    if (c.out_fd >= 0) fds.push_back({c.out_fd, POLLIN, 0}), owner.push_back({&c, false});
    if (c.err_fd >= 0) fds.push_back({c.err_fd, POLLIN, 0}), owner.push_back({&c, true});
  }
  if (extra_fd >= 0) fds.push_back({extra_fd, POLLIN, 0}), owner.push_back({nullptr, false});
  bool extra = false;
  if (!fds.empty()) {
    int n = ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
    for (size_t i = 0; n > 0 && i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (!owner[i].first) {
        extra = true;
        continue;
      }
      Child& c = *owner[i].first;
      read_child(c, owner[i].second ? c.err_fd : c.out_fd, owner[i].second);
    }
  } else {
    ::usleep(static_cast<useconds_t>(std::min<int64_t>(wait.count(), 50) * 1000));
  }
  const auto now = launch::OutputStream::Clock::now();
  for (auto& c : children) {  // an agent's partial line (a worker's prompt) after its idle wait
    if (c.out) c.out->flush_idle(now);
    if (c.err) c.err->flush_idle(now);
  }
  for (auto& c : children) {
    if (c.exited || c.pid < 0) continue;
    int st = 0;
    if (::waitpid(c.pid, &st, WNOHANG) == c.pid) {
      c.exited = true;
      c.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
  }
  return extra;
}

bool all_done(const std::vector<Child>& children) {
  return std::all_of(children.begin(), children.end(),
                     [](const Child& c) { return c.exited && c.out_fd < 0 && c.err_fd < 0; });
}

void kill_all(std::vector<Child>& children, int sig) {
  for (auto& c : children) {
    if (!c.exited && c.pid > 0) ::kill(-c.pid, sig);
  }
}

int unreachable_error(const LaunchOptions& o, const std::vector<std::string>& why) {
  std::ostringstream s;
  s << "dtrain run: error: cannot reach ";
  int n = 0;
  for (size_t i = 0; i < why.size(); ++i) n += !why[i].empty();
  s << n << " of " << why.size() << " host(s) over ssh; nothing was started:\n";
  for (size_t i = 0; i < why.size(); ++i) {
    if (!why[i].empty()) s << "  " << o.hosts[i].first << ": " << why[i] << "\n";
  }
  s << "Check the host names, that sshd runs there, and the ssh options (--ssh-port, "
       "--ssh-identity, --ssh-arg); `dtrain run --dry-run ...` checks without starting anything.\n";
  launch::say_block(s.str());
  return 2;
}

}  // namespace

std::vector<std::string> ssh_command(const LaunchOptions& o, const std::string& host) {
  std::vector<std::string> argv = {"ssh"};
  // The user's arguments first: for each option ssh keeps the first value it sees.
  argv.insert(argv.end(), o.ssh_args.begin(), o.ssh_args.end());
  argv.insert(argv.end(), {"-o", "BatchMode=yes", "-o", "ConnectTimeout=10"});
  if (o.ssh_port > 0) argv.insert(argv.end(), {"-p", std::to_string(o.ssh_port)});
  if (!o.ssh_identity.empty()) argv.insert(argv.end(), {"-i", o.ssh_identity});
  argv.push_back(host);
  return argv;
}

std::string remote_dtrain(const LaunchOptions& o) {
  return o.remote_dtrain.empty() ? self_path() : o.remote_dtrain;
}

// ssh HOST 'test -x DTRAIN' on every host at once: "" for a reachable host with dtrain, else
// why not. Bounded by ssh's ConnectTimeout (10 s unless the user's arguments say otherwise)
// and a hard 30 s.
std::vector<std::string> check_ssh_hosts(const LaunchOptions& o) {
  const std::string dtrain = remote_dtrain(o);
  std::vector<Child> children(o.hosts.size());
  for (size_t i = 0; i < o.hosts.size(); ++i) {
    children[i].host = o.hosts[i].first;
    auto argv = ssh_command(o, o.hosts[i].first);
    argv.push_back(
        "test -x " + shell_quote(dtrain) + " || { echo " +
        shell_quote("dtrain is not at " + dtrain + " on this host (set --remote-dtrain)") +
        " >&2; exit 3; }");
    start_child(children[i], argv, false);
    close_stdin(children[i]);
  }
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!all_done(children) && Clock::now() < deadline)
    pump(children, std::chrono::milliseconds(50), -1);
  kill_all(children, SIGKILL);
  while (!all_done(children)) pump(children, std::chrono::milliseconds(50), -1);
  std::vector<std::string> why(children.size());
  for (size_t i = 0; i < children.size(); ++i) {
    const Child& c = children[i];
    if (c.code == 0) continue;
    std::string text = c.captured;
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (text.empty()) text = "ssh exited with code " + std::to_string(c.code);
    why[i] = text;
  }
  return why;
}

std::vector<std::string> agent_args(const LaunchOptions& o, int node_rank) {
  std::vector<std::string> a = {"run", "--no-slurm", "--stop-on-stdin-eof"};
  const std::string nproc = std::to_string(o.hosts.at(static_cast<size_t>(node_rank)).second);
  if (o.min_nodes > 0) {
    // Elastic: every agent the same flags; the c10d rendezvous on the first host gives the
    // node ranks out per round.
    const bool v6 = o.master_addr.find(':') != std::string::npos;
    a.insert(a.end(), {"--nnodes", std::to_string(o.min_nodes) + ":" + std::to_string(o.nnodes),
                       "--nproc-per-node", nproc, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                       (v6 ? "[" + o.master_addr + "]" : o.master_addr) + ":" +
                           std::to_string(o.master_port)});
    std::string conf = "last_call_timeout=" + seconds(o.last_call);
    if (o.heartbeat_timeout.count() > 0)
      conf += ",heartbeat_timeout=" + seconds(o.heartbeat_timeout);
    a.insert(a.end(), {"--rdzv-conf", conf});
  } else {
    a.insert(a.end(), {"--nnodes", std::to_string(o.nnodes), "--node-rank",
                       std::to_string(node_rank), "--nproc-per-node", nproc, "--master-addr",
                       o.master_addr, "--master-port", std::to_string(o.master_port)});
  }
  a.insert(a.end(), {
                        "--rdzv-id",
                        o.rdzv_id,
                        "--rdzv-timeout",
                        seconds(o.rdzv_timeout),
                        "--max-restarts",
                        std::to_string(o.max_restarts),
                        "--monitor-interval",
                        seconds(o.monitor_interval),
                        "--term-timeout",
                        seconds(o.term_timeout),
                        "--role",
                        o.role,
                        "--redirects",
                        stream_spec(o.redirects),
                        "--tee",
                        stream_spec(o.tee),
                    });
  // The token goes down ssh's stdin (run_ssh_launch), not onto command lines `ps` shows.
  if (!o.store_token.empty()) a.insert(a.end(), {"--store-token", "-"});
  if (!o.log_dir.empty()) a.insert(a.end(), {"--log-dir", o.log_dir});
  if (!o.local_ranks_filter.empty()) {
    a.insert(a.end(),
             {"--local-ranks-filter",
              launch::cpu_list_string({o.local_ranks_filter.begin(), o.local_ranks_filter.end()})});
  }
  // torchrun's comma_separated_list back: a comma inside a filter is written ",,".
  auto filters = [](const std::vector<std::string>& items) {
    std::string v;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) v += ',';
      for (char c : items[i]) v += c == ',' ? std::string(",,") : std::string(1, c);
    }
    return v;
  };
  if (!o.duplicate_stdout_filters.empty())
    a.push_back("--duplicate-stdout-filters=" + filters(o.duplicate_stdout_filters));
  if (!o.duplicate_stderr_filters.empty())
    a.push_back("--duplicate-stderr-filters=" + filters(o.duplicate_stderr_filters));
  // The prefix the console shows for every host is this host's (the agents' output is
  // gathered here), whatever the other hosts' environments say.
  if (!o.log_line_prefix_template.empty())
    a.push_back("--log-line-prefix-template=" + o.log_line_prefix_template);
  if (!o.ifname.empty()) a.insert(a.end(), {"--ifname", o.ifname});
  // Core binding is each host's own: its agent binds its local ranks to its cores (the list,
  // when given, names cores of every host alike, as DeepSpeed's --bind_core_list does).
  if (o.bind_cores_to_rank) a.push_back("--bind-cores-to-rank");
  if (!o.bind_core_list.empty()) {
    a.insert(a.end(), {"--bind-core-list", launch::cpu_list_string(o.bind_core_list)});
  }
  if (o.module) a.push_back("--module");
  if (o.no_python) a.push_back("--no-python");
  if (o.malloc_hugepages) a.push_back("--malloc-hugepages");
  if (o.start_method != "auto") a.insert(a.end(), {"--start-method", o.start_method});
  if (!o.failure_store_key.empty()) {
    const bool v6 = o.failure_store_host.find(':') != std::string::npos;
    a.push_back(
        "--failure-store=" + (v6 ? "[" + o.failure_store_host + "]" : o.failure_store_host) + ":" +
        std::to_string(o.failure_store_port) + "/" + o.failure_store_key);
  }
  for (const auto& [k, v] : o.extra_env) a.push_back("--env=" + k + "=" + v);
  // No "--" before PROGRAM: `dtrain run -- PROG` is rejected by CLI11 under a subcommand,
  // and validate_launch_options() made PROGRAM a path (or a module name), never "-...".
  // The remote agent is `dtrain run`, which substitutes torchrun's ${local_rank} in what follows
  // the executable; a launcher that does not (horovodrun -H) sends it escaped.
  const bool escape = !o.expand_local_rank;
  a.push_back(escape && runs_with_python(o) ? launch::escape_substitution(o.program) : o.program);
  for (const auto& arg : o.args) a.push_back(escape ? launch::escape_substitution(arg) : arg);
  return a;
}

int run_ssh_launch(const LaunchOptions& options) {
  LaunchOptions o = options;
  const bool elastic = o.min_nodes > 0;
  auto why = check_ssh_hosts(o);
  if (std::any_of(why.begin(), why.end(), [](auto& w) { return !w.empty(); })) {
    // Elastic: the job can start without the unreachable hosts while the first (the store's)
    // and at least MIN hosts answer.
    const auto reachable = std::count(why.begin(), why.end(), std::string());
    if (!elastic || !why.front().empty() || reachable < o.min_nodes)
      return unreachable_error(o, why);
    std::vector<std::pair<std::string, int>> up;
    for (size_t i = 0; i < why.size(); ++i) {
      if (why[i].empty()) {
        up.push_back(o.hosts[i]);
      } else {
        launch::say_block("dtrain: elastic job: " + o.hosts[i].first +
                          " is unreachable over ssh (" + why[i] + "); starting on the " +
                          std::to_string(reachable) + " host(s) that answer (--nnodes " +
                          std::to_string(o.min_nodes) + ":" + std::to_string(o.nnodes) + ")\n");
      }
    }
    o.hosts = std::move(up);
  }
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  const std::string dtrain = remote_dtrain(o);

  // Signals come to us through a self-pipe, read in the poll loop.
  static int sig_pipe[2] = {-1, -1};
  if (::pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error("pipe: " + std::string(std::strerror(errno)));
  static volatile sig_atomic_t last_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    last_signal = sig;
    char b = 1;
    [[maybe_unused]] ssize_t r = ::write(sig_pipe[1], &b, 1);
  };
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::sigaction(s, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  std::vector<Child> agents(o.hosts.size());
  for (size_t k = 0; k < o.hosts.size(); ++k) {
    agents[k].host = o.hosts[k].first;
    // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "lit" + string.
    std::string cmd = "cd ";
    cmd += shell_quote(cwd);
    cmd += " 2>/dev/null; exec ";
    cmd += shell_quote(dtrain);
    for (const auto& a : agent_args(o, static_cast<int>(k))) {
      cmd += ' ';
      cmd += shell_quote(a);
    }
    auto argv = ssh_command(o, o.hosts[k].first);
    argv.push_back(cmd);
    start_child(agents[k], argv, true);
    if (!o.store_token.empty() && agents[k].in_fd >= 0) {
      launch::write_all(agents[k].in_fd, o.store_token + "\n");
    }
  }

  int got_signal = 0;
  int first_failure = -1;                  // index of the first agent that exited non-zero
  std::vector<bool> noted(agents.size());  // elastic: failures reported
  // kNever: not scheduled (a sentinel rather than std::optional, which GCC 12 misreads as
  // maybe-uninitialized here).
  constexpr auto kNever = Clock::time_point::max();
  Clock::time_point stop_at = kNever;  // close every stdin then
  Clock::time_point kill_at = kNever;  // SIGTERM the ssh clients then
  // After one agent failed, the others learn it from the store within a tick and stop their
  // workers (term_timeout); give them that long before cutting their connections.
  const auto grace = o.term_timeout + std::chrono::seconds(5);
  int kill_rounds = 0;
  while (!all_done(agents)) {
    if (pump(agents, std::chrono::milliseconds(50), sig_pipe[0])) {
      char b[64];
      while (::read(sig_pipe[0], b, sizeof b) > 0) {
      }
      if (!got_signal) {
        got_signal = last_signal;
        launch::say_block("dtrain: got signal " + std::to_string(got_signal) +
                          ", stopping the agents on every host\n");
        stop_at = Clock::now();
      } else {
        kill_at = Clock::now();  // asked twice: stop waiting
      }
    }
    for (size_t k = 0; k < agents.size(); ++k) {
      if (elastic && agents[k].exited && agents[k].code != 0 && !noted[k]) {
        // A lost node: the others re-rendezvous without it (or fail with the reason when
        // fewer than MIN are left); nothing to stop here.
        noted[k] = true;
        if (first_failure < 0) first_failure = static_cast<int>(k);
        if (!got_signal) {
          launch::say_block("dtrain: the agent on " + agents[k].host + " ended (exit code " +
                            std::to_string(agents[k].code) + "); elastic job (--nnodes " +
                            std::to_string(o.min_nodes) + ":" + std::to_string(o.nnodes) +
                            "): the other agents go on without it while enough are left\n");
        }
      } else if (!elastic && agents[k].exited && agents[k].code != 0 && first_failure < 0) {
        first_failure = static_cast<int>(k);
        if (agents[k].code == 255) {
          launch::say_block("dtrain: the ssh connection to " + agents[k].host +
                            " failed (exit code 255); stopping the job\n");
          stop_at = Clock::now();
        } else if (stop_at == kNever) {
          stop_at = Clock::now() + grace;
        }
      }
    }
    auto now = Clock::now();
    if (now >= stop_at) {
      for (auto& a : agents) close_stdin(a);
      if (kill_at == kNever) kill_at = now + grace;
      stop_at = kNever;
    }
    if (now >= kill_at) {
      kill_all(agents, ++kill_rounds > 1 ? SIGKILL : SIGTERM);
      kill_at = now + std::chrono::seconds(5);
    }
  }
  for (auto& a : agents) close_stdin(a);
  if (got_signal) return 128 + got_signal;
  // Elastic: an agent exits 0 only when the workers of its last round all succeeded, so one
  // success means the job finished (agents lost on the way do not count against it).
  if (elastic &&
      std::any_of(agents.begin(), agents.end(), [](const Child& c) { return c.code == 0; }))
    return 0;
  if (first_failure >= 0) return agents[static_cast<size_t>(first_failure)].code;
  return 0;
}

}  // namespace dtrain
