#include "tune/warm_fork_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "core/params.h"
#include "core/paths.h"
#include "launch/fork_server.h"

extern char** environ;

namespace dtrain::tune::detail {

std::unique_ptr<WarmForkServer> WarmForkServer::start(const std::map<std::string, std::string>& env,
                                                      const std::string& given_program,
                                                      const std::string& dir) {
  if (!param::kTuneWarmForkServer.get()) return nullptr;
  std::string program = given_program;
  if (program.empty()) {
    const auto self = read_self_exe();
    if (!self || self->deleted) return nullptr;
    program = self->path;
  }
  const auto info = launch::inspect_program(program);
  if (!launch::fork_server_can_start(info) || !launch::fork_server_pays_off(info)) return nullptr;
  const std::string library = launch::fork_server_library();
  if (library.empty()) return nullptr;

  // A driver that was killed (SIGKILL) left its socket's directory: those of drivers that no
  // longer run go now. The name carries the driver's pid.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/tmp", ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("dtrain-warm-")) continue;
    const int owner = std::atoi(name.c_str() + std::strlen("dtrain-warm-"));
    struct stat st {};
    if (owner > 0 && ::kill(owner, 0) != 0 && errno == ESRCH &&
        ::lstat(e.path().c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::getuid()) {
      std::error_code ignored;
      std::filesystem::remove_all(e.path(), ignored);
    }
  }
  std::unique_ptr<WarmForkServer> w(new WarmForkServer);
  w->program_ = program;
  if (dir.empty()) {
    std::string tmpl = "/tmp/dtrain-warm-" + std::to_string(::getpid()) + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) return nullptr;
    w->dir_ = tmpl;
  } else {
    if (::mkdir(dir.c_str(), 0700) != 0) return nullptr;
    w->dir_ = dir;
  }
  w->socket_ = w->dir_ + "/s";
  if (w->socket_.size() >= sizeof(sockaddr_un::sun_path)) return nullptr;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return nullptr;  // ~WarmForkServer removes the directory
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, w->socket_.c_str(), w->socket_.size() + 1);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0) {
    ::close(fd);
    return nullptr;
  }

  // The environment a trial's worker would have (the agent adds OMP_NUM_THREADS=1 when unset:
  // libraries read it while loading), plus the preload and the server's own variable.
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e; ++e) {
    const std::string s = *e;
    const auto eq = s.find('=');
    if (eq != std::string::npos) vars[s.substr(0, eq)] = s.substr(eq + 1);
  }
  for (const auto& [k, v] : env) vars[k] = v;
  if (!vars.count("OMP_NUM_THREADS")) vars["OMP_NUM_THREADS"] = "1";
  vars.erase("DTRAIN_FORKSERVER");
  vars.erase("DTRAIN_FORKSERVER_WARM_SOCKET");
  vars.erase("DTRAIN_DISTRIBUTOR_TASK");
  vars["LD_PRELOAD"] = vars.count("LD_PRELOAD") && !vars["LD_PRELOAD"].empty()
                           ? vars["LD_PRELOAD"] + ":" + library  // a sanitizer's stays first
                           : library;
  std::vector<std::string> strings;
  for (const auto& [k, v] : vars) strings.push_back(k + "=" + v);
  // Its own pid goes in the first ten characters, written by the child before exec.
  strings.push_back("DTRAIN_FORKSERVER_WARM=0000000000:" + std::to_string(fd) + ":" +
                    std::to_string(::getpid()));
  std::vector<char*> envp;
  for (auto& s : strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  char* own = strings.back().data() + std::strlen("DTRAIN_FORKSERVER_WARM=");
  std::string prog = program;
  char* argv[] = {prog.data(), nullptr};

  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    return nullptr;
  }
  if (pid == 0) {  // only async-signal-safe calls until exec
    pid_t self = ::getpid();
    for (int i = 9; i >= 0; --i, self /= 10) own[i] = static_cast<char>('0' + self % 10);
    ::fcntl(fd, F_SETFD, 0);  // the server keeps the listening socket
    ::setpgid(0, 0);
    ::execve(argv[0], argv, envp.data());
    ::_exit(127);
  }
  w->pid_ = pid;
  // Only the server holds the socket now: if it dies, an agent's connect fails at once.
  ::close(fd);
  return w;
}

namespace {

// Waits up to `limit` for `pid` to end (and reaps it); true once reaped.
bool reaped_within(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const pid_t r = ::waitpid(pid, nullptr, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

WarmForkServer::~WarmForkServer() {
  if (pid_ > 0) {
    // Asked to quit, it reaps the launch servers still ending (their last trial's) and exits;
    // one that does not within 6 s is killed.
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket_.c_str(), socket_.size() + 1);
    const struct timeval limit = {2, 0};
    bool asked = false;
    if (fd >= 0) {
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
      asked = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
              ::send(fd, "Q", 1, MSG_NOSIGNAL) == 1;
      ::close(fd);
    }
    if (!asked || !reaped_within(pid_, std::chrono::milliseconds(6000))) {
      ::kill(pid_, SIGKILL);
      reaped_within(pid_, std::chrono::milliseconds(10000));
    }
  }
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

}  // namespace dtrain::tune::detail
