#include "launch/fork_server.h"

#include <elf.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/hostfile.h"
#include "core/params.h"
#include "core/paths.h"
#include "dtrain/error.h"
#include "launch/forkserver/protocol.h"
#include "launch/worker_process.h"

namespace dtrain::launch {

namespace {

bool read_at(std::ifstream& in, uint64_t offset, void* out, size_t n) {
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
  return static_cast<size_t>(in.gcount()) == n;
}

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }

void close_all(const std::vector<int>& fds) {
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
}

}  // namespace

ProgramInfo inspect_program(const std::string& path) {
  ProgramInfo info;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return info;
  info.set_id = (st.st_mode & (S_ISUID | S_ISGID)) != 0;
  std::ifstream in(path, std::ios::binary);
  Elf64_Ehdr eh{};
  if (!in || !read_at(in, 0, &eh, sizeof eh)) return info;
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      (eh.e_type != ET_EXEC && eh.e_type != ET_DYN) || eh.e_phentsize != sizeof(Elf64_Phdr) ||
      eh.e_phnum > 4096) {
    return info;
  }
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  if (!read_at(in, eh.e_phoff, ph.data(), ph.size() * sizeof(Elf64_Phdr))) return info;
  const Elf64_Phdr* dynamic = nullptr;
  for (const auto& p : ph) {
    if (p.p_type == PT_INTERP) info.dynamic_elf = true;
    if (p.p_type == PT_DYNAMIC) dynamic = &p;
  }
  if (!info.dynamic_elf || dynamic == nullptr || dynamic->p_filesz > (1u << 20)) return info;
  std::vector<Elf64_Dyn> dyn(dynamic->p_filesz / sizeof(Elf64_Dyn));
  if (!read_at(in, dynamic->p_offset, dyn.data(), dyn.size() * sizeof(Elf64_Dyn))) return info;
  uint64_t strtab = 0;
  std::vector<uint64_t> needed;
  for (const auto& d : dyn) {
    if (d.d_tag == DT_NULL) break;
    if (d.d_tag == DT_STRTAB) strtab = d.d_un.d_ptr;
    if (d.d_tag == DT_NEEDED) needed.push_back(d.d_un.d_val);
  }
  // DT_STRTAB is an address: find the file offset through the segment that loads it.
  uint64_t strtab_offset = 0;
  bool found = false;
  for (const auto& p : ph) {
    if (p.p_type == PT_LOAD && strtab >= p.p_vaddr && strtab < p.p_vaddr + p.p_filesz) {
      strtab_offset = strtab - p.p_vaddr + p.p_offset;
      found = true;
    }
  }
  if (!found) return info;
  for (uint64_t off : needed) {
    char name[256] = {0};
    in.clear();
    in.seekg(static_cast<std::streamoff>(strtab_offset + off));
    in.read(name, sizeof name - 1);
    info.needed.emplace_back(name);
  }
  return info;
}

bool fork_server_can_start(const ProgramInfo& info) {
  if (!info.dynamic_elf || info.set_id) return false;
  // A sanitizer runtime must be the first object loaded and intercepts fork: leave it alone.
  for (const auto& n : info.needed) {
    if (n.starts_with("libasan") || n.starts_with("libtsan") || n.starts_with("libhwasan") ||
        n.starts_with("liblsan") || n.starts_with("libmsan") || n.starts_with("libclang_rt.")) {
      return false;
    }
  }
  return true;
}

bool fork_server_pays_off(const ProgramInfo& info) {
  for (const auto& n : info.needed) {
    if (n.starts_with("libtorch") || n.starts_with("libc10") || n.starts_with("libdtrain"))
      return true;
  }
  return false;
}

std::string fork_server_library() {
  auto usable = [](const std::string& p) { return !p.empty() && ::access(p.c_str(), R_OK) == 0; };
  if (const auto env = param::kForkServerLib.get_if_set()) return usable(*env) ? *env : "";
  const auto self = read_self_exe();
#if defined(DTRAIN_FORKSERVER_BUILD_PATH) && defined(DTRAIN_BUILD_DIR)
  if (self && self->path.starts_with(DTRAIN_BUILD_DIR "/") &&
      usable(DTRAIN_FORKSERVER_BUILD_PATH)) {
    return DTRAIN_FORKSERVER_BUILD_PATH;
  }
#endif
#ifdef DTRAIN_FORKSERVER_FROM_BIN
  if (self) {
    const std::string beside =
        (std::filesystem::path(self->path).parent_path() / DTRAIN_FORKSERVER_FROM_BIN)
            .lexically_normal()
            .string();
    if (usable(beside)) return beside;
  }
#endif
#ifdef DTRAIN_FORKSERVER_INSTALL_PATH
  if (usable(DTRAIN_FORKSERVER_INSTALL_PATH)) return DTRAIN_FORKSERVER_INSTALL_PATH;
#endif
  return "";
}

namespace {

// One worker's entry of a spec (protocol.h), after its two fds in a cold spec.
void put_worker(std::string& spec, const ForkServerWorker& w) {
  auto strings = [&](const std::vector<std::string>& v) {
    put_u32(spec, static_cast<uint32_t>(v.size()));
    for (const auto& e : v) {
      put_u32(spec, static_cast<uint32_t>(e.size()));
      spec += e;
    }
  };
  auto ints = [&](const std::vector<int>& v) {
    put_u32(spec, static_cast<uint32_t>(v.size()));
    for (int x : v) put_u32(spec, static_cast<uint32_t>(x));
  };
  strings(w.env);
  strings(w.argv);
  ints(w.cpus);
  put_u32(spec, static_cast<uint32_t>(w.mem_policy));
  ints(w.mem_nodes);
}

std::string spec_bytes(const std::vector<std::pair<int, int>>& write_ends,
                       const std::vector<ForkServerWorker>& workers) {
  std::string spec;
  put_u32(spec, dtrain_forkserver::kMagic);
  put_u32(spec, static_cast<uint32_t>(workers.size()));
  put_u32(spec, static_cast<uint32_t>(::getpid()));
  for (size_t r = 0; r < workers.size(); ++r) {
    put_u32(spec, static_cast<uint32_t>(write_ends[r].first));
    put_u32(spec, static_cast<uint32_t>(write_ends[r].second));
    put_worker(spec, workers[r]);
  }
  return spec;
}

// A stdout and a stderr pipe for each of workers [first, n): the read ends go to out_fds and
// err_fds (and `ours`), the write ends to `theirs`, in worker order. False, errno set, when a
// pipe cannot be made (what was made is in ours/theirs, for the caller to close).
bool worker_pipes(size_t first, size_t n, std::vector<int>& ours, std::vector<int>& theirs,
                  std::vector<int>& out_fds, std::vector<int>& err_fds) {
  for (size_t r = first; r < n; ++r) {
    int o[2], e[2];
    if (::pipe2(o, O_CLOEXEC) != 0) return false;
    ours.push_back(o[0]), theirs.push_back(o[1]);
    if (::pipe2(e, O_CLOEXEC) != 0) return false;
    ours.push_back(e[0]), theirs.push_back(e[1]);
    out_fds[r] = o[0];
    err_fds[r] = e[0];
  }
  return true;
}

bool write_fd(int fd, const std::string& data) {
  for (size_t done = 0; done < data.size();) {
    ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

std::string warm_fork_server_socket(const std::string& program, const char* value) {
  std::string s;
  if (value != nullptr) {
    s = value;
  } else if (const auto v = param::kForkServerWarmSocket.get_if_set()) {
    s = *v;
  }
  if (s.empty()) return "";
  const auto colon = s.find(':');
  if (colon == std::string::npos) return "";
  std::error_code ec1, ec2;
  const auto a = std::filesystem::canonical(s.substr(colon + 1), ec1);
  const auto b = std::filesystem::canonical(program, ec2);
  if (ec1 || ec2 || a != b) return "";
  std::string socket = s.substr(0, colon);
  if (const auto at = socket.find("%h"); at != std::string::npos) {
    const std::string host = this_host_name();
    if (host.empty()) return "";
    socket.replace(at, 2, host);
  }
  return socket;
}

ForkServer::ForkServer(const ForkServerLaunch& l, std::vector<int>& out_fds,
                       std::vector<int>& err_fds) {
  launch(l, out_fds, err_fds, false);
}

ForkServer::ForkServer(const ForkServerLaunch& l, std::vector<int>& out_fds,
                       std::vector<int>& err_fds, Standby) {
  launch(l, out_fds, err_fds, true);
}

void ForkServer::start(const std::vector<ForkServerWorker>& workers) {
  DTRAIN_ASSERT(go_fd_ >= 0 && workers.size() == write_ends_.size(),
                "start() needs a waiting standby of this size");
  const bool ok = write_fd(spec_fd_, spec_bytes(write_ends_, workers)) && write_fd(go_fd_, "g");
  const int e = errno;
  ::close(spec_fd_);
  ::close(go_fd_);
  spec_fd_ = go_fd_ = -1;
  if (!ok)
    throw Error(std::string("cannot start the standby fork server (pid ") + std::to_string(pid_) +
                "): " + std::strerror(e));
}

void ForkServer::launch(const ForkServerLaunch& l, std::vector<int>& out_fds,
                        std::vector<int>& err_fds, bool standby) {
  const size_t n = l.workers.size();
  DTRAIN_ASSERT(n >= 1, "a fork server needs a worker");
  if (!l.warm_socket.empty()) {
    start_warm(l, out_fds, err_fds);
    return;
  }
  // Worker 0 writes to the server's own stdout/stderr (what the libraries print while
  // loading goes there too); the others get pipes the server hands on.
  std::vector<int> ours, theirs;  // read ends kept here, write ends for the server
  auto fail = [&](const std::string& what) {
    int e = errno;
    close_all(ours);
    close_all(theirs);
    throw Error(what + ": " + std::strerror(e));
  };
  std::vector<std::pair<int, int>> write_ends(n, {STDOUT_FILENO, STDERR_FILENO});
  out_fds.assign(n, -1);
  err_fds.assign(n, -1);
  if (!worker_pipes(1, n, ours, theirs, out_fds, err_fds)) fail("pipe");
  for (size_t r = 1; r < n; ++r) write_ends[r] = {theirs[2 * (r - 1)], theirs[2 * (r - 1) + 1]};
  int reply[2];
  if (::pipe2(reply, O_CLOEXEC) != 0) fail("pipe");
  ours.push_back(reply[0]), theirs.push_back(reply[1]);

  int spec_fd = ::memfd_create("dtrain-forkserver-spec", MFD_CLOEXEC);
  if (spec_fd < 0) fail("memfd_create");
  theirs.push_back(spec_fd);
  // A standby reads the spec only after a byte on its go pipe; we keep the memfd (the same
  // file) and the pipe's write end until start().
  int go[2] = {-1, -1};
  if (standby) {
    spec_fd_ = ::fcntl(spec_fd, F_DUPFD_CLOEXEC, 0);
    if (spec_fd_ < 0) fail("dup");
    if (::pipe2(go, O_CLOEXEC) != 0) {
      ::close(spec_fd_);
      spec_fd_ = -1;
      fail("pipe");
    }
    ours.push_back(spec_fd_), ours.push_back(go[1]), theirs.push_back(go[0]);
  } else if (!write_fd(spec_fd, spec_bytes(write_ends, l.workers))) {
    fail("writing the fork server's spec");
  }

  SpawnSpec s;
  s.argv = l.argv;
  s.env = l.common_env;
  s.inherit_stdin = l.inherit_stdin;
  // Ours last: a sanitizer runtime the user preloads must stay first.
  std::string preload = "LD_PRELOAD=";
  for (const auto& e : l.common_env) {
    if (e.starts_with("LD_PRELOAD=") && e.size() > 11) preload += e.substr(11) + ":";
  }
  preload += l.library;
  std::erase_if(s.env, [](const std::string& e) {
    return e.starts_with("LD_PRELOAD=") || e.starts_with("DTRAIN_FORKSERVER=");
  });
  s.env.push_back(preload);
  // The server's own pid goes in the first ten characters (written by the child before exec).
  s.own_pid_env = static_cast<int>(s.env.size());
  s.env.push_back("DTRAIN_FORKSERVER=0000000000:" + std::to_string(spec_fd) + ":" +
                  std::to_string(reply[1]) + (standby ? ":" + std::to_string(go[0]) : ""));
  s.inherit_fds = theirs;
  SpawnedProcess p;
  try {
    p = spawn_process(s);
  } catch (...) {
    close_all(ours);
    close_all(theirs);
    throw;
  }
  close_all(theirs);
  pid_ = p.pid;
  go_fd_ = go[1];
  write_ends_ = write_ends;
  out_fds[0] = p.stdout_fd;
  err_fds[0] = p.stderr_fd;
  reply_fd_ = reply[0];
  ::fcntl(reply_fd_, F_SETFL, ::fcntl(reply_fd_, F_GETFL) | O_NONBLOCK);
  for (size_t r = 1; r < n; ++r) {
    for (int fd : {out_fds[r], err_fds[r]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
}

void ForkServer::start_warm(const ForkServerLaunch& l, std::vector<int>& out_fds,
                            std::vector<int>& err_fds) {
  const size_t n = l.workers.size();
  if (2 * n + 2 > 256) throw Error("the warm fork server takes at most 127 workers per launch");
  std::vector<int> ours, theirs;
  auto fail = [&](const std::string& what) {
    int e = errno;
    close_all(ours);
    close_all(theirs);
    throw Error(what + ": " + std::strerror(e));
  };
  out_fds.assign(n, -1);
  err_fds.assign(n, -1);
  int reply[2];
  if (::pipe2(reply, O_CLOEXEC) != 0) fail("pipe");
  ours.push_back(reply[0]);
  int spec_fd = ::memfd_create("dtrain-forkserver-spec", MFD_CLOEXEC);
  if (spec_fd < 0) fail("memfd_create");
  theirs.push_back(spec_fd);
  theirs.push_back(reply[1]);
  if (!worker_pipes(0, n, ours, theirs, out_fds, err_fds)) fail("pipe");
  std::string spec;
  put_u32(spec, dtrain_forkserver::kMagicWarm);
  put_u32(spec, static_cast<uint32_t>(n));
  put_u32(spec, static_cast<uint32_t>(::getpid()));
  put_u32(spec, static_cast<uint32_t>(l.argv.size()));
  for (const auto& a : l.argv) {
    put_u32(spec, static_cast<uint32_t>(a.size()));
    spec += a;
  }
  for (const auto& w : l.workers) put_worker(spec, w);
  if (!write_fd(spec_fd, spec)) fail("writing the fork server's spec");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (l.warm_socket.size() >= sizeof addr.sun_path) {
    errno = ENAMETOOLONG;
    fail("warm fork server socket " + l.warm_socket);
  }
  std::memcpy(addr.sun_path, l.warm_socket.c_str(), l.warm_socket.size() + 1);
  int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) fail("socket");
  ours.push_back(sock);
  const struct timeval limit = {5, 0};  // the server accepts at once; never hang on it
  ::setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  if (::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    fail("cannot reach the warm fork server at " + l.warm_socket);
  }
  std::vector<char> control(CMSG_SPACE(sizeof(int) * theirs.size()));
  char byte = 'L';
  iovec iov{&byte, 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * theirs.size());
  std::memcpy(CMSG_DATA(c), theirs.data(), sizeof(int) * theirs.size());
  ssize_t sent;
  do {
    sent = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent != 1) fail("sending the launch to the warm fork server at " + l.warm_socket);
  ::close(sock);
  ours.pop_back();
  close_all(theirs);
  theirs.clear();
  warm_ = true;
  reply_fd_ = reply[0];
  ::fcntl(reply_fd_, F_SETFL, ::fcntl(reply_fd_, F_GETFL) | O_NONBLOCK);
  // Its launch server says its pid at once (the first launch waits while the server loads
  // the program's libraries); one that has not within 20 s never starts these workers (its
  // first write, to the pipe closed here, fails).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (pid_ <= 0 && !failed_ && reply_fd_ >= 0 && std::chrono::steady_clock::now() < deadline) {
    pollfd p{reply_fd_, POLLIN, 0};
    ::poll(&p, 1, 100);
    // Its workers may be reported in the same read: kept for the caller's next read_reply().
    for (auto& f : read_reply()) early_.push_back(f);
  }
  if (pid_ <= 0) {
    if (reply_fd_ < 0) std::erase(ours, reply[0]);  // read_reply closed it at EOF
    reply_fd_ = -1;                                 // else in `ours`: fail() closes it
    errno = failed_ ? EIO : ETIMEDOUT;
    fail("the warm fork server at " + l.warm_socket + " did not take the launch");
  }
  for (size_t r = 0; r < n; ++r) {
    for (int fd : {out_fds[r], err_fds[r]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
}

ForkServer::~ForkServer() {
  if (warm_) {
    // Its launch server is not our child; it ends after its workers (or with SIGKILL here).
    if (pid_ > 0 && reply_fd_ >= 0) ::kill(-pid_, SIGKILL);
    if (reply_fd_ >= 0) ::close(reply_fd_);
    return;
  }
  if (reply_fd_ >= 0) ::close(reply_fd_);
  if (spec_fd_ >= 0) ::close(spec_fd_);
  if (go_fd_ >= 0) ::close(go_fd_);  // a standby never started: it reads EOF and exits 0
  if (pid_ > 0 && !reaped_) {
    ::kill(-pid_, SIGKILL);
    reap(true);
  }
}

std::vector<std::pair<int, pid_t>> ForkServer::read_reply() {
  std::vector<std::pair<int, pid_t>> forked;
  forked.swap(early_);
  char buf[4096];
  while (reply_fd_ >= 0) {
    ssize_t got = ::read(reply_fd_, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == EAGAIN) break;
    if (got <= 0) {  // EOF: the server has exited (its workers closed their copies at once)
      ::close(reply_fd_);
      reply_fd_ = -1;
      break;
    }
    pending_.append(buf, static_cast<size_t>(got));
    while (pending_.size() >= sizeof(dtrain_forkserver::Record)) {
      dtrain_forkserver::Record r;
      std::memcpy(&r, pending_.data(), sizeof r);
      pending_.erase(0, sizeof r);
      if (r.index == dtrain_forkserver::kMode) mode_ = r.value;
      if (r.index == dtrain_forkserver::kDone) done_ = true;
      if (r.index == dtrain_forkserver::kError) failed_ = true;
      if (r.index == dtrain_forkserver::kServerPid && r.value > 0) pid_ = r.value;
      if (r.index <= dtrain_forkserver::kExitBase)
        exits_[dtrain_forkserver::kExitBase - r.index] = r.value;
      if (r.index >= 0 && r.value > 0) forked.emplace_back(r.index, static_cast<pid_t>(r.value));
    }
  }
  return forked;
}

bool ForkServer::reap(bool block) {
  if (warm_) {
    // Not our child: it has ended once its reply pipe is at EOF (bounded wait: 2 s).
    for (int i = 0; reply_fd_ >= 0 && (block ? i < 200 : i < 1); ++i) {
      read_reply();
      if (reply_fd_ >= 0 && block) {
        pollfd p{reply_fd_, POLLIN, 0};
        ::poll(&p, 1, 10);
      }
    }
    reaped_ = reply_fd_ < 0;
    status_ = done_ ? 0 : (127 << 8);
    return reaped_;
  }
  if (reaped_ || pid_ <= 0) return reaped_;
  int st = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &st, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_ || (r < 0 && errno == ECHILD)) {
    reaped_ = true;
    status_ = r == pid_ ? st : 0;
  }
  return reaped_;
}

}  // namespace dtrain::launch
