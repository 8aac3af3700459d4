// A kept driver service (see driver_service.h and python/dtrain/_cluster.py).
#include "core/driver_service.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include <CLI/CLI.hpp>

#include "core/params.h"
#include "core/paths.h"
#include "dtrain/error.h"
#include "launch/options_internal.h"

extern char** environ;

namespace dtrain::detail {

namespace {

bool exited(pid_t pid, std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

int connect_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads one line (without '\n') of at most 64 KiB, each byte within `timeout`.
std::string read_line(int fd, std::chrono::milliseconds timeout) {
  std::string line;
  char ch;
  pollfd p{fd, POLLIN, 0};
  while (line.size() < 65536 && ::poll(&p, 1, static_cast<int>(timeout.count())) > 0 &&
         ::read(fd, &ch, 1) == 1 && ch != '\n')
    line += ch;
  return line;
}

bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

bool readable(const std::string& p) { return !p.empty() && ::access(p.c_str(), R_OK) == 0; }

}  // namespace

DriverService::DriverService(std::string engine) : engine_(std::move(engine)) {}

DriverService::~DriverService() {
  MutexLock lock(mu_);
  stop_locked();
}

void DriverService::stop_locked() {
  if (owner_ != ::getpid()) {  // never started, or started by the process we were forked from
    dir_.reset();              // closes this process's copy of the lock; removes nothing
    pid_ = -1;
    control_ = -1;
    key_.clear();
    id_.clear();
    return;
  }
  if (control_ >= 0) ::close(control_);  // the service cancels its jobs, disconnects, exits
  if (pid_ > 0 && !exited(pid_, std::chrono::seconds(25))) {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    exited(pid_, std::chrono::seconds(5));
  }
  dir_.reset();
  pid_ = -1;
  control_ = -1;
  owner_ = -1;
  socket_.clear();
  key_.clear();
  id_.clear();
}

bool DriverService::alive_locked() {
  if (pid_ <= 0 || owner_ != ::getpid()) return false;
  if (exited(pid_, std::chrono::milliseconds(0))) {
    pid_ = -1;
    return false;
  }
  // The service closes the control connection when it stops (idle, or its cluster failed).
  pollfd p{control_, POLLIN, 0};
  if (::poll(&p, 1, 0) > 0) return false;
  return std::filesystem::exists(socket_);  // unlinked first when it stops
}

std::string DriverService::ensure(const std::string& key, const Start& s) {
  MutexLock lock(mu_);
  if (!key_.empty() && (key_ != key || !alive_locked())) stop_locked();
  if (!key_.empty()) return socket_;

  dir_ = std::make_unique<OwnedTempDir>("dtrain-" + engine_ + "-");
  owner_ = ::getpid();
  socket_ = dir_->path() + "/driver.sock";
  key_ = key;
  std::vector<std::string> args = s.argv;
  args.insert(args.end(), {"--serve", socket_, "--parent-pid", std::to_string(::getpid())});
  args.insert(args.end(), s.extra.begin(), s.extra.end());
  // Built before fork: the child only makes async-signal-safe calls until exec.
  std::map<std::string, std::string> env_map;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string v(*e);
    auto eq = v.find('=');
    if (eq != std::string::npos) env_map[v.substr(0, eq)] = v.substr(eq + 1);
  }
  for (const auto& [k, v] : s.env) env_map[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env_map) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t pid = ::fork();
  if (pid < 0) {
    if (devnull >= 0) ::close(devnull);
    stop_locked();
    throw Error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);  // its own group: a terminal's Ctrl-C reaches this program, which stops it
    if (devnull >= 0) ::dup2(devnull, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (devnull >= 0) ::close(devnull);
  pid_ = pid;
  // Ready: the socket answers the control connection with "READY ID".
  const auto deadline = std::chrono::steady_clock::now() + s.timeout;
  for (;;) {
    if (exited(pid_, std::chrono::milliseconds(0))) {
      pid_ = -1;
      stop_locked();
      throw Error("engine \"" + engine_ + "\": " + s.what +
                  " exited before it was connected to the cluster; its output is above, on "
                  "this program's stdout/stderr. " +
                  s.hint);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      stop_locked();
      throw TimeoutError("engine \"" + engine_ + "\": " + s.what + " was not connected after " +
                         std::to_string(s.timeout.count()) +
                         " s; it was stopped (its output is above). " + s.hint);
    }
    int fd = std::filesystem::exists(socket_) ? connect_unix(socket_) : -1;
    if (fd < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    std::string line;
    if (send_all(fd, "CONTROL\n")) line = read_line(fd, std::chrono::seconds(10));
    if (line.rfind("READY ", 0) != 0) {
      ::close(fd);
      stop_locked();
      throw Error("engine \"" + engine_ + "\": " + s.what + " did not answer within 10 s (got '" +
                  line + "'); its output is above. " + s.hint);
    }
    control_ = fd;
    id_ = line.substr(6);
    return socket_;
  }
}

std::string DriverService::id() {
  MutexLock lock(mu_);
  return alive_locked() ? id_ : std::string();
}

std::optional<std::string> DriverService::query(const std::string& json,
                                                std::chrono::milliseconds timeout) {
  std::string path;
  {
    MutexLock lock(mu_);
    if (!alive_locked()) return std::nullopt;
    path = socket_;
  }
  const int fd = connect_unix(path);
  if (fd < 0) return std::nullopt;
  std::string line;
  if (send_all(fd, "QUERY " + json + "\n")) line = read_line(fd, timeout);
  ::close(fd);
  if (line.empty()) return std::nullopt;
  return line;
}

void DriverService::stop() {
  MutexLock lock(mu_);
  stop_locked();
}

std::string python_script(const std::string& name, const param::String& variable) {
  if (const auto env = variable.get_if_set()) {
    if (!readable(*env)) {
      throw UsageError(std::string(variable.name) + ": '" + *env + "' is not a readable file");
    }
    return *env;
  }
#ifdef DTRAIN_PYTHON_SOURCE_DIR
  if (const std::string p = std::string(DTRAIN_PYTHON_SOURCE_DIR) + "/dtrain/" + name; readable(p))
    return p;
#endif
  // Installed: PREFIX/bin/dtrain (or a program in PREFIX/bin) -> PREFIX/share/dtrain/python.
  if (const auto exe = read_self_exe()) {
    const std::string beside = std::filesystem::path(exe->path).parent_path().string() +
                               "/../share/dtrain/python/dtrain/" + name;
    if (readable(beside)) return beside;
  }
#ifdef DTRAIN_PYTHON_INSTALL_DIR
  if (const std::string p = std::string(DTRAIN_PYTHON_INSTALL_DIR) + "/dtrain/" + name; readable(p))
    return p;
#endif
  throw UsageError("cannot find dtrain's Python driver python/dtrain/" + name +
                   " (installed under share/dtrain/python); reinstall dtrain or set " +
                   variable.name + " to its path");
}

std::string RunFlags::value(const std::string& flag, const std::string& def) const {
  auto it = given.find(flag);
  return it == given.end() || it->second.empty() ? def : it->second.back();
}

namespace {

// Whether `dtrain run`'s option `arg` ("--nnodes", "-H") takes a value (a separate argument
// unless written "--flag=V"); unknown options are taken for flags.
bool takes_value(const CLI::App& run, const std::string& arg) {
  const CLI::Option* opt = run.get_option_no_throw(arg);
  return opt != nullptr && opt->get_expected_max() != 0 && opt->get_type_size() != 0;
}

}  // namespace

std::optional<RunFlags> scan_run_flags(int argc, char** argv, const std::vector<std::string>& flags,
                                       const std::string& trigger) {
  if (argc < 2 || (std::string(argv[1]) != "run" && std::string(argv[1]) != "launch"))
    return std::nullopt;
  // dtrain run's own options, to tell an option's value from PROGRAM: everything from PROGRAM
  // on is the program's (its own --ray-address is not ours).
  CLI::App run;
  RunArgs unused;
  add_run_options(run, unused);
  RunFlags r;
  r.command = argv[1];  // the agents run the same command (`dtrain launch`'s --use-env)
  bool program = false;
  bool no_python = false, use_env = false;  // of the flags before PROGRAM (`dtrain launch`'s)
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (program || a == "--" || a.empty() || a[0] != '-') {
      r.rest.push_back(a);
      program = true;
      continue;
    }
    bool taken = false;
    for (const auto& f : flags) {
      if (a == f) {
        if (i + 1 >= argc) throw UsageError("dtrain " + r.command + ": " + f + " needs a value");
        r.given[f].push_back(argv[++i]);
        taken = true;
      } else if (a.rfind(f + "=", 0) == 0) {
        r.given[f].push_back(a.substr(f.size() + 1));
        taken = true;
      }
      if (taken) break;
    }
    if (taken) continue;
    no_python = no_python || a == "--no-python" || a == "--no_python";
    use_env = use_env || a == "--use-env" || a == "--use_env";
    r.rest.push_back(a);
    if (a.find('=') == std::string::npos && takes_value(run, a) && i + 1 < argc)
      r.rest.push_back(argv[++i]);
  }
  if (!r.given.count(trigger)) return std::nullopt;
  // torch.distributed.launch's own refusal, here before anything is submitted (the agents on
  // the cluster would refuse it each).
  if (r.command == "launch" && no_python && !use_env)
    throw UsageError("When using the '--no-python' flag, you must also set the '--use-env' flag.");
  return r;
}

std::string self_path() { return self_exe().path; }

void exec_driver(std::vector<std::string> argv,
                 const std::vector<std::pair<std::string, std::string>>& env,
                 const std::string& what) {
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> args;
  for (auto& s : argv) args.push_back(s.data());
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  throw UsageError(what + ": cannot run " + argv[0] + ": " + std::strerror(errno));
}

}  // namespace dtrain::detail
