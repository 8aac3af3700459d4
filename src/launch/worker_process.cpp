#include "launch/worker_process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "dtrain/error.h"

extern char** environ;

namespace dtrain::launch {

int exec_program(std::vector<std::string> argv, const std::string& who) {
  std::vector<char*> cargv;
  for (auto& s : argv) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  ::execvp(cargv[0], cargv.data());
  std::cerr << who << ": cannot run '" << argv[0] << "': " << std::strerror(errno) << "\n";
  return 127;
}

std::vector<std::string> current_environment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) out.emplace_back(*e);
  return out;
}

SpawnedProcess spawn_process(const SpawnSpec& spec) {
  DTRAIN_ASSERT(!spec.argv.empty(), "spawn_process needs argv[0]");
  // Everything the child touches is prepared before fork: it may only make
  // async-signal-safe calls afterwards.
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int out[2], err[2], status[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]), ::close(out[1]);
    throw Error(std::string("pipe: ") + std::strerror(errno));
  }
  // Carries exec's errno to the parent; closed by a successful exec (CLOEXEC).
  if (::pipe2(status, O_CLOEXEC) != 0) {
    ::close(out[0]), ::close(out[1]), ::close(err[0]), ::close(err[1]);
    throw Error(std::string("pipe: ") + std::strerror(errno));
  }
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Where the child writes its pid (SpawnSpec::own_pid_env): found now, not after fork.
  char* pid_digits = nullptr;
  if (spec.own_pid_env >= 0) {
    char* entry = envp[static_cast<size_t>(spec.own_pid_env)];
    char* eq = std::strchr(entry, '=');
    DTRAIN_ASSERT(eq != nullptr && std::strlen(eq + 1) >= 10,
                  "own_pid_env needs NAME= and 10 characters");
    pid_digits = eq + 1;
  }
  const pid_t parent = ::getpid();
  cpu_set_t cpus;  // built now: the child makes only async-signal-safe calls
  CPU_ZERO(&cpus);
  for (int c : spec.cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &cpus);
  }

  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1], status[0], status[1], devnull}) ::close(fd);
    throw Error(std::string("fork: ") + std::strerror(e));
  }
  if (pid == 0) {
    // Its own session (as torchrun 2.x starts workers: start_new_session), so its own process
    // group too: -pid reaches it and what it starts. Cannot fail in a fresh child (not a group
    // leader); if it did, the worker must not start in the agent's group.
    if (::setsid() < 0) {
      int e = errno;
      ssize_t ignored = ::write(status[1], &e, sizeof e);
      (void)ignored;
      ::_exit(127);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the agent died before prctl took effect
    if (devnull >= 0 && !spec.inherit_stdin) ::dup2(devnull, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    for (int fd : spec.inherit_fds) ::fcntl(fd, F_SETFD, 0);
    if (pid_digits != nullptr) {
      long v = ::getpid();
      for (int i = 9; i >= 0; --i, v /= 10) pid_digits[i] = static_cast<char>('0' + v % 10);
    }
    // Undo the agent's signal set-up: the worker starts with defaults and nothing blocked.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGQUIT})
      ::sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (!spec.cpus.empty() && ::sched_setaffinity(0, sizeof cpus, &cpus) != 0) {
      int e = errno;
      ssize_t ignored = ::write(status[1], &e, sizeof e);
      (void)ignored;
      ::_exit(127);
    }
    ::execve(argv[0], argv.data(), envp.data());
    int e = errno;
    ssize_t ignored = ::write(status[1], &e, sizeof e);
    (void)ignored;
    ::_exit(127);
  }
  // No setpgid(pid, pid) here: it would make the child a group leader, and its setsid() fail.
  // The session (and group) exists before this returns: the status pipe stays open until the
  // child's exec, which comes after its setsid().
  ::close(out[1]);
  ::close(err[1]);
  ::close(status[1]);
  if (devnull >= 0) ::close(devnull);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(status[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  ::close(status[0]);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    int st;
    ::waitpid(pid, &st, 0);
    ::close(out[0]);
    ::close(err[0]);
    throw Error("cannot execute '" + spec.argv[0] + "': " + std::strerror(child_errno));
  }
  for (int fd : {out[0], err[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  SpawnedProcess p;
  p.pid = pid;
  p.stdout_fd = out[0];
  p.stderr_fd = err[0];
  return p;
}

}  // namespace dtrain::launch
