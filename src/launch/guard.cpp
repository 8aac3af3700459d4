#include "launch/guard.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "dtrain/error.h"

namespace dtrain::launch {

namespace {

struct Record {
  int op;  // kWatch, kForget, kDir (`pgid` bytes of path follow), kKeepDir
  pid_t pgid;
};
constexpr int kWatch = 1, kForget = -1, kDir = 2, kKeepDir = -2;

constexpr int kMaxGroups = kMaxLocalWorkers;
constexpr int kMaxPath = 4000;  // a record and its path fit one atomic pipe write (PIPE_BUF)

// Removes the directory `name` (under `parent`) and what it holds, following no symbolic link.
// Only async-signal-safe calls (see guard.h): getdents64 into a stack buffer, unlinkat.
void remove_tree(int parent, const char* name, int depth) {
  if (depth > 32) return;
  const int fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    // Removing entries while listing may skip some: list again until a pass finds none.
    for (int pass = 0; pass < 16; ++pass) {
      bool found = false;
      ::lseek(fd, 0, SEEK_SET);
      char buf[4096];
      ssize_t n;
      while ((n = ::getdents64(fd, buf, sizeof buf)) > 0) {
        for (ssize_t off = 0; off < n;) {
          const auto* e = reinterpret_cast<const dirent64*>(buf + off);
          off += e->d_reclen;
          const char* entry = e->d_name;
          if (entry[0] == '.' && (entry[1] == '\0' || (entry[1] == '.' && entry[2] == '\0')))
            continue;
          found = true;
          if (::unlinkat(fd, entry, 0) != 0 && (errno == EISDIR || errno == EPERM))
            remove_tree(fd, entry, depth + 1);
        }
      }
      if (!found) break;
    }
    ::close(fd);
  }
  ::unlinkat(parent, name, AT_REMOVEDIR);
}

// Reads exactly n bytes; false at EOF or on an error.
bool read_exact(int fd, void* out, size_t n) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = ::read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

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
  static char dir[kMaxPath + 1];
  int count = 0;
  Record r;
  // EOF (or a torn write): the agent is gone.
  while (read_exact(fd, &r, sizeof r)) {
    if (r.op == kWatch) {
      if (count < kMaxGroups) groups[count++] = r.pgid;
    } else if (r.op == kForget) {
      for (int i = 0; i < count; ++i) {
        if (groups[i] == r.pgid) {
          groups[i] = groups[--count];
          break;
        }
      }
    } else if (r.op == kDir) {
      if (r.pgid <= 0 || r.pgid > kMaxPath || !read_exact(fd, dir, static_cast<size_t>(r.pgid))) {
        dir[0] = '\0';
        break;
      }
      dir[r.pgid] = '\0';
    } else if (r.op == kKeepDir) {
      dir[0] = '\0';
    }
  }
  for (int i = 0; i < count; ++i) ::kill(-groups[i], SIGKILL);
  // The killed workers write nothing more there; a directory the agent removed is not named.
  if (dir[0] == '/') remove_tree(AT_FDCWD, dir, 0);
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

void Guard::watch(pid_t pgid) { send(kWatch, pgid); }
void Guard::forget(pid_t pgid) { send(kForget, pgid); }

void Guard::remove_dir_on_exit(const std::string& dir) {
  if (fd_ < 0 || dir.empty() || dir[0] != '/' || dir.size() > static_cast<size_t>(kMaxPath)) return;
  // One write, so the record and its path arrive whole (<= PIPE_BUF bytes).
  std::vector<char> msg(sizeof(Record) + dir.size());
  const Record r{kDir, static_cast<pid_t>(dir.size())};
  std::memcpy(msg.data(), &r, sizeof r);
  std::memcpy(msg.data() + sizeof r, dir.data(), dir.size());
  ssize_t n;
  do {
    n = ::write(fd_, msg.data(), msg.size());
  } while (n < 0 && errno == EINTR);
}

void Guard::keep_dir() { send(kKeepDir, 0); }

}  // namespace dtrain::launch
