// Elastic `dtrain horovodrun`: Horovod's elastic driver mapped onto dtrain's elastic launcher.
//
// Horovod                                   dtrain
//   driver runs --host-discovery-script       this driver (the horovodrun process) runs it
//   driver's rendezvous server                this driver hosts the job's store; every agent
//                                             is a client of it (a leaving host never takes
//                                             the store down)
//   one worker per slot of each host          one `dtrain run` agent per host, --nproc-per-node
//                                             = its slots (capped so the total <= --max-np),
//                                             elastic c10d rendezvous (--nnodes MIN:MAX)
//   --min-np (processes)                      MIN = the fewest discovered hosts whose slots
//                                             reach --min-np (the launcher counts nodes)
//   a worker fails: its host is blacklisted,  the agent of that host leaves the job
//   the others reset and go on smaller        (LaunchOptions::leave_on_worker_failure); the
//                                             other agents restart their workers in the next
//                                             round without it; the workers restore the last
//                                             commit (hvd::elastic::run)
//   the script lists a new host               an agent is started there; it waits as "late"
//                                             and the running agents restart their workers to
//                                             admit it
//   --reset-limit                             --max-restarts of every agent
//   --elastic-timeout                         the rendezvous timeout (the survivors wait this
//                                             long for MIN hosts)
// Hosts: a host that names this machine (localhost, 127.x.y.z, its hostname) gets its agent as
// a child process; any other host gets it over ssh, as `dtrain run -H` starts its agents
// (ssh [--ssh-arg...] [-p PORT] [-i KEY] -o BatchMode=yes HOST 'cd CWD; exec env
// DTRAIN_HVD_ELASTIC_AGENT=... HOROVOD_*... DTRAIN horovodrun ARGS'). A remote agent reaches the
// driver's store at this machine's address on the route to that host, and stops its workers
// when its ssh's stdin closes (the driver holds it open; it closes when the driver ends,
// however it ends). The job's in-memory commits on remote hosts are removed over ssh at the end.
#include "horovod/horovodrun_elastic.h"
#include "core/params.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "core/hostfile.h"
#include "core/paths.h"
#include "dtrain/error.h"
#include "dtrain/store.h"

extern char** environ;

namespace dtrain::hvd {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kAgentVar = param::kHvdElasticAgent.name;

void say(const std::string& s) { std::cerr << "dtrain horovodrun: elastic: " << s << std::endl; }

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

// fork + execve with everything prepared before the fork (the store's threads exist).
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, int out_fd,
            int err_fd, bool die_with_parent, int in_fd = -1) {
  std::vector<char*> a, e;
  for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  for (auto& s : env) e.push_back(const_cast<char*>(s.c_str()));
  e.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    if (die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(1);
    }
    if (in_fd >= 0) ::dup2(in_fd, 0);
    if (out_fd >= 0) ::dup2(out_fd, 1);
    if (err_fd >= 0) ::dup2(err_fd, 2);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(a[0], a.data(), e.data());
    ::_exit(127);
  }
  return pid;
}

// This machine's address on the route to `host` (a connected UDP socket sends nothing): where
// that host's agent finds the driver's store. Falls back to this hostname.
std::string address_towards(const std::string& host) {
  const std::string name = this_host_name();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return name;
  std::string out = name;
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage me{};
    socklen_t len = sizeof me;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {};
      const void* src =
          me.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&me)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&me)->sin6_addr);
      if (::inet_ntop(me.ss_family, src, buf, sizeof buf)) {
        out = buf;
        ::close(fd);
        break;
      }
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

std::vector<std::string> ssh_argv(const ElasticFlags& f, const std::string& host) {
  std::vector<std::string> argv = {"ssh"};
  argv.insert(argv.end(), f.ssh_args.begin(),
              f.ssh_args.end());  // the user's first: ssh keeps first values
  argv.insert(argv.end(), {"-o", "BatchMode=yes", "-o", "ConnectTimeout=10"});
  if (f.ssh_port > 0) argv.insert(argv.end(), {"-p", std::to_string(f.ssh_port)});
  if (!f.ssh_identity.empty()) argv.insert(argv.end(), {"-i", f.ssh_identity});
  argv.push_back(host);
  return argv;
}

// The variables a remote agent gets from the driver (a local one inherits all of them):
// Horovod's, dtrain's and the threading ones, as horovodrun forwards its environment.
bool forwarded(const std::string& kv) {
  for (const char* p :
       {"HOROVOD_", "DTRAIN_", "TORCH_", "OMP_", "MKL_", "GLOO_", "LD_LIBRARY_PATH=", "PATH="}) {
    if (kv.rfind(p, 0) == 0) return true;
  }
  return false;
}

std::string ssh_path() {
  for (const char* dir : {"/usr/bin/ssh", "/bin/ssh", "/usr/local/bin/ssh"}) {
    if (is_executable_file(dir)) return dir;
  }
  throw Error(
      "elastic horovodrun: ssh is not installed here, and the discovery script lists hosts that "
      "are not "
      "this machine; install openssh-client");
}

// ssh HOST 'test -x DTRAIN' (as `dtrain run -H` checks its hosts): "" when the host answers and
// has this dtrain, else why not. Bounded by ssh's ConnectTimeout and a hard 30 s.
std::string check_remote(const ElasticFlags& f, const std::string& host, const std::string& exe) {
  auto argv = ssh_argv(f, host);
  argv[0] = ssh_path();
  argv.push_back("test -x " + shell_quote(exe) + " || { echo " +
                 shell_quote("dtrain is not at " + exe + " there") + " >&2; exit 3; }");
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t pid = spawn(argv, env, out[1], out[1], true, devnull);
  ::close(out[1]);
  if (devnull >= 0) ::close(devnull);
  std::string text;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  int status = 0;
  bool reaped = false;
  while (true) {
    pollfd p{out[0], POLLIN, 0};
    if (::poll(&p, 1, 50) > 0) {
      char buf[512];
      ssize_t n = ::read(out[0], buf, sizeof buf);
      if (n > 0) {
        text.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) break;  // EOF: ssh exited (or closed its output)
    }
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      break;
    }
  }
  ::close(out[0]);
  while (!reaped) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      reaped = true;
    } else if (Clock::now() >= deadline + std::chrono::seconds(1)) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      reaped = true;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  text = trim(text);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.empty())
    text = WIFEXITED(status) ? "ssh exited with code " + std::to_string(WEXITSTATUS(status))
                             : "ssh did not answer in 30 s";
  return text;
}

// The job's in-memory commits on this machine (hvd::elastic::TorchState writes them to
// /dev/shm/dtrain-hvd-elastic-<uid>-<run id>-<prefix>): gone with the job, also when it failed.
void remove_memory_commits(const std::string& run_id) {
  const std::string head = "dtrain-hvd-elastic-" + std::to_string(::getuid()) + "-" + run_id + "-";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    if (e.path().filename().string().rfind(head, 0) == 0) std::filesystem::remove_all(e.path(), ec);
  }
}

// The same on every remote host an agent ran on: one ssh each, at once, 15 s at most in all.
void remove_remote_commits(const ElasticFlags& f, const std::set<std::string>& hosts,
                           const std::string& run_id) {
  if (hosts.empty()) return;
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  std::map<pid_t, std::string> children;
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  for (const auto& h : hosts) {
    auto argv = ssh_argv(f, h);
    try {
      argv[0] = ssh_path();
    } catch (const Error&) {
      break;
    }
    argv.push_back("rm -rf /dev/shm/dtrain-hvd-elastic-$(id -u)-" + run_id + "-*");
    children[spawn(argv, env, devnull, devnull, true, devnull)] = h;
  }
  if (devnull >= 0) ::close(devnull);
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  while (!children.empty()) {
    for (auto it = children.begin(); it != children.end();) {
      int status = 0;
      if (::waitpid(it->first, &status, WNOHANG) == it->first) {
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          say("could not remove the job's in-memory commits on " + it->second +
              " over ssh (/dev/shm/dtrain-hvd-elastic-*-" + run_id + "-*)");
        }
        it = children.erase(it);
      } else {
        ++it;
      }
    }
    if (Clock::now() >= deadline) {
      for (auto& [pid, h] : children) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        say("could not remove the job's in-memory commits on " + h + " over ssh within 15 s");
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

std::vector<std::pair<std::string, int>> parse_discovery_output(const std::string& output,
                                                                int default_slots,
                                                                const std::string& script) {
  std::vector<std::pair<std::string, int>> hosts;
  std::set<std::string> seen;
  std::istringstream in(output);
  std::string raw;
  int line_no = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    std::string line = trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    const std::string where = "--host-discovery-script " + script + " printed line " +
                              std::to_string(line_no) + " '" + trim(raw) + "'";
    std::string host = line;
    int slots = default_slots;
    auto colon = line.rfind(':');
    if (colon != std::string::npos) {
      host = trim(line.substr(0, colon));
      std::string n = trim(line.substr(colon + 1));
      long v = -1;
      try {
        size_t used = 0;
        v = std::stol(n, &used);
        if (used != n.size()) v = -1;
      } catch (const std::exception&) {
        v = -1;
      }
      if (v < 1 || v > 4096) {
        throw UsageError(
            where +
            ": the slots after ':' must be a positive integer (expected HOST:SLOTS or HOST)");
      }
      slots = static_cast<int>(v);
    }
    if (host.empty() || host.find_first_of(" \t,") != std::string::npos) {
      throw UsageError(where + ": expected one HOST:SLOTS (or HOST) per line, e.g. 'node1:4'");
    }
    if (!seen.insert(host).second)
      throw UsageError(where + ": host '" + host + "' is listed twice");
    hosts.emplace_back(host, slots);
  }
  return hosts;
}

std::vector<std::pair<std::string, int>> run_discovery(const std::string& script,
                                                       int default_slots) {
  if (::access(script.c_str(), F_OK) != 0) {
    throw UsageError("--host-discovery-script " + script + ": no such file");
  }
  if (!is_executable_file(script)) {
    throw UsageError("--host-discovery-script " + script +
                     ": not executable; make it so (chmod +x) - it is run as a program and prints "
                     "HOST:SLOTS lines");
  }
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw Error(std::string("pipe: ") + std::strerror(errno));
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, kAgentVar, std::strlen(kAgentVar)) != 0) env.emplace_back(*e);
  }
  std::string path = script.find('/') == std::string::npos ? "./" + script : script;
  pid_t pid = spawn({path}, env, out[1], err[1], true);
  ::close(out[1]);
  ::close(err[1]);
  std::string text, errtext;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  bool out_open = true, err_open = true;
  auto ran_too_long = [&] {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    ::close(out[0]);
    ::close(err[0]);
    return Error("--host-discovery-script " + script +
                 " ran for more than 30 s without finishing; it must print "
                 "the current hosts and exit");
  };
  while (out_open || err_open) {
    if (Clock::now() > deadline) throw ran_too_long();
    pollfd p[2] = {{out_open ? out[0] : -1, POLLIN, 0}, {err_open ? err[0] : -1, POLLIN, 0}};
    ::poll(p, 2, 100);
    char buf[4096];
    for (int k = 0; k < 2; ++k) {
      if (p[k].fd < 0 || !(p[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = ::read(p[k].fd, buf, sizeof buf);
      if (n > 0) {
        (k == 0 ? text : errtext).append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        (k == 0 ? out_open : err_open) = false;
      }
    }
  }
  int status = 0;
  for (pid_t r; (r = ::waitpid(pid, &status, WNOHANG)) == 0 || (r < 0 && errno == EINTR);) {
    // It may close its output and go on running.
    if (Clock::now() > deadline) throw ran_too_long();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::close(out[0]);
  ::close(err[0]);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string how = WIFEXITED(status) ? "exited with code " + std::to_string(WEXITSTATUS(status))
                                        : "died of signal " + std::to_string(WTERMSIG(status));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) how += " (could not be run)";
    throw Error(
        "--host-discovery-script " + script + " " + how +
        (errtext.empty() ? std::string() : "; its stderr: " + trim(errtext.substr(0, 2000))));
  }
  return parse_discovery_output(text, default_slots, script);
}

void validate_elastic_flags(ElasticFlags& f) {
  if (f.discovery_script.empty()) {
    throw UsageError(
        "--min-np/--max-np (elastic) need --host-discovery-script SCRIPT: an executable that "
        "prints "
        "the current hosts as HOST:SLOTS lines");
  }
  if (f.min_np < 0) f.min_np = f.np;
  if (f.min_np < 0) {
    throw UsageError(
        "elastic horovodrun needs --min-np N (or -np N): the fewest processes the job runs on");
  }
  if (f.max_np >= 0 && f.max_np < f.min_np) {
    throw UsageError("--max-np " + std::to_string(f.max_np) + " is below --min-np " +
                     std::to_string(f.min_np) + "; --max-np must be >= --min-np");
  }
  if (f.np >= 0 && (f.np < f.min_np || (f.max_np >= 0 && f.np > f.max_np))) {
    throw UsageError("-np " + std::to_string(f.np) + " is outside --min-np " +
                     std::to_string(f.min_np) + " .. --max-np " +
                     (f.max_np >= 0 ? std::to_string(f.max_np) : std::string("(no limit)")));
  }
}

bool is_elastic_agent(std::string* agent_spec) {
  const auto v = param::kHvdElasticAgent.get_if_set();
  if (!v) return false;
  if (agent_spec) *agent_spec = *v;
  ::unsetenv(kAgentVar);  // the workers must not see it
  return true;
}

int run_elastic_driver(const ElasticFlags& f, const std::vector<std::string>& self_args) {
  // 1. Wait (up to --start-timeout) for hosts with --min-np slots.
  const auto start_deadline = Clock::now() + std::chrono::seconds(f.start_timeout_s);
  std::vector<std::pair<std::string, int>> hosts;
  while (true) {
    hosts = run_discovery(f.discovery_script, f.slots);
    int total = 0;
    for (auto& [h, s] : hosts) total += s;
    if (total >= f.min_np) break;
    if (Clock::now() >= start_deadline) {
      throw Error("--host-discovery-script " + f.discovery_script + " lists " +
                  std::to_string(hosts.size()) + " host(s) with " + std::to_string(total) +
                  " slot(s) after --start-timeout " + std::to_string(f.start_timeout_s) +
                  " s, but --min-np " + std::to_string(f.min_np) +
                  " needs that many; add hosts or slots, or lower --min-np");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  // The launcher counts nodes: MIN = the fewest hosts whose slots reach --min-np.
  std::vector<int> sizes;
  for (auto& [h, s] : hosts) sizes.push_back(f.max_np > 0 ? std::min(s, f.max_np) : s);
  std::sort(sizes.rbegin(), sizes.rend());
  int min_nodes = 0;
  for (int sum = 0; sum < f.min_np && min_nodes < static_cast<int>(sizes.size()); ++min_nodes)
    sum += sizes[min_nodes];
  min_nodes = std::max(min_nodes, 1);
  const int max_nodes = std::max(min_nodes + 1, f.max_np > 0 ? f.max_np : 4096);

  // 2. The job's store, hosted here for the whole job.
  auto server = store::StoreServer::start({});
  const int port = server->port();
  const std::string run_id =
      "hvd-elastic-" + std::to_string(::getpid()) + "-" + std::to_string(std::time(nullptr));
  say("job " + run_id + ": --min-np " + std::to_string(f.min_np) + " -> at least " +
      std::to_string(min_nodes) + " host(s); store on port " + std::to_string(port));

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  const std::string exe = self_exe().path;
  std::map<pid_t, std::pair<std::string, int>> running;  // agent pid -> host, processes
  std::set<std::string> blacklist;
  std::vector<std::string> unreachable;  // remote hosts ssh could not reach, with why
  std::map<pid_t, int> ssh_stdin;        // remote agents: the write end of their ssh's stdin
  std::set<std::string> remote_hosts;    // every remote host an agent ran on (commits to remove)
  std::error_code cwd_ec;
  const std::string cwd = std::filesystem::current_path(cwd_ec).string();
  ::signal(SIGPIPE, SIG_IGN);
  int total = 0;
  auto start_agents = [&](const std::vector<std::pair<std::string, int>>& given) {
    auto is_new = [&](const std::string& h) {
      return !blacklist.count(h) && std::none_of(running.begin(), running.end(),
                                                 [&](auto& r) { return r.second.first == h; });
    };
    // New remote hosts are checked over ssh before any agent starts, and their agents (slower
    // to start: ssh) start first, so that the first rendezvous round finds every host.
    std::vector<std::pair<std::string, int>> list;
    for (auto& [h, s] : given) {
      if (is_this_host(h) || !is_new(h)) continue;
      if (std::string why = check_remote(f, h, exe); !why.empty()) {
        blacklist.insert(h);
        unreachable.push_back("'" + h + "' is unreachable over ssh (" + why + ")");
        say("host " + unreachable.back() + "; it is blacklisted");
        continue;
      }
      list.emplace_back(h, s);
    }
    for (auto& hs : given) {
      if (is_this_host(hs.first)) list.push_back(hs);
    }
    for (auto& [h, s] : list) {
      if (!is_new(h)) continue;
      int n = f.max_np > 0 ? std::min(s, f.max_np - total) : s;
      if (n <= 0) continue;
      std::string spec = h + "," + std::to_string(n) + "," + std::to_string(port) + "," + run_id +
                         "," + std::to_string(min_nodes) + "," + std::to_string(max_nodes);
      std::vector<std::string> env;
      for (char** e = environ; *e; ++e) env.emplace_back(*e);
      pid_t pid = -1;
      if (is_this_host(h)) {
        std::vector<std::string> argv = {exe, "horovodrun"};
        argv.insert(argv.end(), self_args.begin(), self_args.end());
        env.push_back(std::string(kAgentVar) + "=" + spec);
        pid = spawn(argv, env, -1, -1, true);
      } else {
        // Over ssh, as `dtrain run -H` starts its agents; the 7th field is the store's address.
        spec += "," + address_towards(h);
        std::string cmd = "cd ";
        cmd += shell_quote(cwd);
        cmd += " 2>/dev/null; exec env ";
        cmd += shell_quote(std::string(kAgentVar) + "=" + spec);
        for (const auto& kv : env) {
          if (!forwarded(kv)) continue;
          cmd += ' ';
          cmd += shell_quote(kv);
        }
        cmd += ' ';
        cmd += shell_quote(exe);
        cmd += " horovodrun";
        for (const auto& a : self_args) {
          cmd += ' ';
          cmd += shell_quote(a);
        }
        auto argv = ssh_argv(f, h);
        argv[0] = ssh_path();
        argv.push_back(cmd);
        int in[2];
        if (::pipe2(in, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
        pid = spawn(argv, env, -1, -1, true, in[0]);
        ::close(in[0]);
        ssh_stdin[pid] = in[1];
        remote_hosts.insert(h);
      }
      running[pid] = {h, n};
      total += n;
      say("started the agent for " + h + " (" + std::to_string(n) + " process(es), pid " +
          std::to_string(pid) + (is_this_host(h) ? "" : ", over ssh") + ")");
    }
  };
  start_agents(hosts);
  if (running.empty()) {
    std::string why;
    for (const auto& u : unreachable) why += (why.empty() ? "" : "; ") + u;
    throw UsageError("--host-discovery-script " + f.discovery_script +
                     ": no agent could start: " + why +
                     " - check the host names, ssh access (-p, -i, --ssh-arg) and that dtrain is "
                     "at the same path there");
  }

  // 3. Watch the agents and the hosts.
  bool succeeded = false;
  int last_code = 1;
  auto next_discovery =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(f.discovery_interval_s * 1000));
  while (!running.empty()) {
    if (g_signal) {
      int sig = g_signal;
      say(std::string("got signal ") + std::to_string(sig) + ", stopping the agents");
      // A remote agent stops its workers when its ssh's stdin closes; then its ssh ends.
      for (auto& [pid, fd] : ssh_stdin) ::close(fd);
      ssh_stdin.clear();
      for (auto& [pid, hs] : running) ::kill(pid, SIGTERM);
      for (auto& [pid, hs] : running) ::waitpid(pid, nullptr, 0);
      remove_memory_commits(run_id);
      remove_remote_commits(f, remote_hosts, run_id);
      return 128 + sig;
    }
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0 && running.count(pid)) {
      auto [host, n] = running[pid];
      running.erase(pid);
      if (auto fd = ssh_stdin.find(pid); fd != ssh_stdin.end()) {
        ::close(fd->second);
        ssh_stdin.erase(fd);
      }
      total -= n;
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code == 0) {
        succeeded = true;
      } else {
        last_code = code;
        if (!succeeded) {
          blacklist.insert(host);
          say("the agent for " + host + " left the job (exit code " + std::to_string(code) + "); " +
              host + " is blacklisted" +
              (running.empty() ? std::string() : "; the other hosts go on from the last commit"));
        }
      }
      continue;
    }
    if (!succeeded && Clock::now() >= next_discovery) {
      next_discovery = Clock::now() + std::chrono::milliseconds(
                                          static_cast<int64_t>(f.discovery_interval_s * 1000));
      try {
        start_agents(run_discovery(f.discovery_script, f.slots));
      } catch (const std::exception& e) {
        say(std::string("host discovery failed (the job goes on with its hosts): ") + e.what());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!succeeded) say("every host's agent left the job; it failed");
  remove_memory_commits(run_id);
  remove_remote_commits(f, remote_hosts, run_id);
  return succeeded ? 0 : last_code;
}

}  // namespace dtrain::hvd
