#include "tune/warm_hosts.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/hostfile.h"
#include "core/params.h"
#include "core/paths.h"
#include "tune/warm_fork_server.h"

extern char** environ;

namespace dtrain::tune::detail {

namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_stop = 0;

bool write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t w = ::write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

// write_all without a SIGPIPE when the reader is gone (blocked in this thread meanwhile, the
// pending one taken back): the driver's own signal dispositions stay as they are.
bool write_request(int fd, const std::string& s) {
  sigset_t pipe_signal, old;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_signal, &old);
  const bool ok = write_all(fd, s);
  if (!ok && errno == EPIPE) {
    const timespec none{0, 0};
    ::sigtimedwait(&pipe_signal, nullptr, &none);
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return ok;
}

std::string host_name() {
  std::string h = this_host_name();
  return h.empty() ? "host" : h;
}

// "%h" in `path` replaced by this host's name.
std::string for_this_host(std::string path) {
  const auto at = path.find("%h");
  if (at != std::string::npos) path.replace(at, 2, host_name());
  return path;
}

// Waits up to `limit` for `pid` to end (and reaps it); true once reaped.
bool reaped_within(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    const pid_t r = ::waitpid(pid, nullptr, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return true;
    if (Clock::now() >= deadline) return false;
    ::usleep(5000);
  }
}

}  // namespace

std::unique_ptr<WarmHosts> WarmHosts::start(const std::vector<engines::HostCommand>& hosts,
                                            const std::map<std::string, std::string>& env,
                                            bool verbose) {
  if (!param::kTuneWarmForkServer.get()) return nullptr;
  const auto self = read_self_exe();
  if (!self || self->deleted || hosts.empty()) return nullptr;
  const std::string program = self->path;
  std::unique_ptr<WarmHosts> w(new WarmHosts);
  w->program_ = program;
  std::random_device rd;
  char id[32];
  std::snprintf(id, sizeof id, "%d-%06x", static_cast<int>(::getpid()), rd() & 0xffffff);
  w->socket_template_ = std::string("/tmp/dtrain-warmhost-") + id + "-%h/s";
  const std::string request =
      nlohmann::json{{"program", program}, {"socket", w->socket_template_}, {"env", env}}.dump() +
      "\n";

  for (const auto& h : hosts) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) continue;
    if (::pipe2(out, O_CLOEXEC) != 0) {
      ::close(in[0]), ::close(in[1]);
      continue;
    }
    std::vector<std::string> argv = h.argv;
    argv.push_back("exec " + shell_quote(h.dtrain) + " tune-warm-host");
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setpgroup(&attr, 0);  // a Ctrl-C reaches the driver, which ends them
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    pid_t pid = -1;
    const int rc = ::posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    ::close(in[0]);
    ::close(out[1]);
    if (rc != 0) {
      ::close(in[1]), ::close(out[0]);
      continue;
    }
    Keeper k{h.host, pid, in[1], out[0]};
    if (!write_request(k.in_fd, request)) {
      ::close(k.in_fd);
      k.in_fd = -1;
    }
    w->keepers_.push_back(k);
  }

  // Every keeper's first line, all at once, 30 s at most.
  std::vector<std::string> lines(w->keepers_.size());
  std::vector<bool> done(w->keepers_.size(), false);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    for (size_t i = 0; i < w->keepers_.size(); ++i) {
      if (!done[i]) fds.push_back({w->keepers_[i].out_fd, POLLIN, 0}), which.push_back(i);
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (fds.empty() || left <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (size_t j = 0; j < fds.size(); ++j) {
      if (!fds[j].revents) continue;
      const size_t i = which[j];
      char c;
      const ssize_t r = ::read(fds[j].fd, &c, 1);
      if (r <= 0 || c == '\n') {
        done[i] = true;
      } else {
        lines[i] += c;
      }
    }
  }
  for (size_t i = 0; i < w->keepers_.size(); ++i) {
    const std::string& line = lines[i];
    if (done[i] && line.rfind("READY ", 0) == 0) {
      w->ready_.push_back(w->keepers_[i].host);
      if (verbose) {
        std::fprintf(stderr, "tune: warm fork server on %s (%s)\n", w->keepers_[i].host.c_str(),
                     line.substr(6).c_str());
      }
    } else if (verbose) {
      std::fprintf(stderr, "tune: no warm fork server on %s (%s); its trials' workers start cold\n",
                   w->keepers_[i].host.c_str(),
                   line.rfind("NONE ", 0) == 0 ? line.substr(5).c_str()
                   : done[i]                   ? "the keeper exited; see ssh's message above"
                                               : "no answer within 30 s");
    }
  }
  if (w->ready_.empty()) return nullptr;  // the destructor ends what was started
  return w;
}

WarmHosts::~WarmHosts() {
  for (auto& k : keepers_) {
    if (k.in_fd >= 0) ::close(k.in_fd);
    k.in_fd = -1;
  }
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  for (auto& k : keepers_) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (!reaped_within(k.pid, std::max(left, std::chrono::milliseconds(0)))) {
      ::kill(k.pid, SIGKILL);  // the ssh client: the keeper's stdin ends with the connection
      reaped_within(k.pid, std::chrono::seconds(5));
    }
    ::close(k.out_fd);
  }
}

int warm_host_main() {
  std::string line;
  if (!std::getline(std::cin, line)) {
    std::cout << "NONE no request on stdin" << std::endl;
    return 2;
  }
  std::string program, socket;
  std::map<std::string, std::string> env;
  try {
    const auto j = nlohmann::json::parse(line);
    program = j.at("program").get<std::string>();
    socket = for_this_host(j.at("socket").get<std::string>());
    env = j.at("env").get<std::map<std::string, std::string>>();
  } catch (const nlohmann::json::exception& e) {
    std::cout << "NONE malformed request: " << e.what() << std::endl;
    return 2;
  }
  const std::filesystem::path path(socket);
  if (path.filename() != "s" ||
      path.parent_path().filename().string().rfind("dtrain-warmhost-", 0) != 0) {
    std::cout << "NONE the socket must be /tmp/dtrain-warmhost-*/s, got " << socket << std::endl;
    return 2;
  }
  auto server = WarmForkServer::start(env, program, path.parent_path().string());
  if (!server) {
    // Another keeper of this search on this machine (two host names of one machine) serves it,
    // or the program cannot be served here: the agents start their workers cold then.
    std::cout << "NONE cannot start a warm fork server for " << program << " at " << socket
              << std::endl;
  } else {
    std::cout << "READY " << server->socket() << " pid " << server->pid() << std::endl;
  }
  // Until the driver's connection ends (or a SIGTERM/SIGHUP/SIGINT: the server is ended and
  // its directory removed all the same).
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop = 1; };
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: read() returns EINTR
  for (int sig : {SIGTERM, SIGHUP, SIGINT}) ::sigaction(sig, &sa, nullptr);
  char buf[4096];
  while (!g_stop) {
    const ssize_t r = ::read(STDIN_FILENO, buf, sizeof buf);
    if (r == 0 || (r < 0 && errno != EINTR)) break;
  }
  return 0;
}

}  // namespace dtrain::tune::detail
