#include "launch/guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtrain/error.h"

namespace dtrain::launch {

namespace {

struct Record {
  int op;  // +1 watch, -1 forget
  pid_t pgid;
};

constexpr int kMaxGroups = 8192;

[[noreturn]] void guard_main(int fd) {
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::sigaction(s, &ign, nullptr);
  ::setsid();
  // Hold no terminal or pipe of the agent's open: whoever reads the agent's output must see
  // EOF when the agent exits, not when the guard does.
  for (int i = 0; i < 1024; ++i) {
    if (i != fd) ::close(i);
  }
  static pid_t groups[kMaxGroups];
  int count = 0;
  Record r;
  while (true) {
    ssize_t n = ::read(fd, &r, sizeof r);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof r)) break;  // EOF (or a torn write): the agent is gone
    if (r.op > 0) {
      if (count < kMaxGroups) groups[count++] = r.pgid;
    } else {
      for (int i = 0; i < count; ++i) {
        if (groups[i] == r.pgid) {
          groups[i] = groups[--count];
          break;
        }
      }
    }
  }
  for (int i = 0; i < count; ++i) ::kill(-groups[i], SIGKILL);
  ::_exit(0);
}

}  // namespace

Guard::Guard() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  pid_ = ::fork();
  if (pid_ < 0) {
    ::close(p[0]);
    ::close(p[1]);
    throw Error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid_ == 0) {
    ::close(p[1]);
    guard_main(p[0]);
  }
  ::close(p[0]);
  fd_ = p[1];
}

Guard::~Guard() {
  if (fd_ >= 0) ::close(fd_);
  if (pid_ > 0) {
    int st;
    // The guard exits as soon as it reads EOF; don't leave a zombie behind.
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
}

void Guard::send(int op, pid_t pgid) {
  Record r{op, pgid};
  ssize_t n;
  do {
    n = ::write(fd_, &r, sizeof r);
  } while (n < 0 && errno == EINTR);
}

void Guard::watch(pid_t pgid) { send(+1, pgid); }
void Guard::forget(pid_t pgid) { send(-1, pgid); }

}  // namespace dtrain::launch
