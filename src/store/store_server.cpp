// StoreServer: PyTorch's TCPStoreMasterDaemon, re-implemented without libtorch.
//
// One thread runs an epoll loop over the listen socket, an eventfd (shutdown) and every
// client connection, all non-blocking; the store itself (store/core.h) lives on that thread,
// so nothing here is locked. A connection's bytes go to the Core as they arrive, whole or in
// pieces; its replies collect in an output buffer sent once per loop turn, so a client that
// sends slowly (or reads slowly) delays nobody else.
//
// Why epoll rather than poll(): poll() hands the kernel every fd on every turn, so one
// request among 8,192 idle connections costs a scan of all of them (docs/benchmarks.md
// measures it against c10d's libuv server). Edge-triggered: a connection is registered once
// and never modified, and the kernel does not re-check a socket that reported nothing new.
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/core.h"
#include "store/socket.h"

namespace dtrain::store {

namespace {

using Clock = std::chrono::steady_clock;

// Past this much unsent reply, a connection is not read from until it drains: a client
// that sends requests and never reads the answers cannot grow the server without bound.
constexpr std::size_t kMaxBacklog = std::size_t{64} << 20;
// Bytes read from one connection per loop turn before the others get their turn.
constexpr int kReadsPerTurn = 16;
constexpr std::size_t kReadChunk = std::size_t{64} << 10;

std::string peer_name(int fd) {
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return "(unknown peer)";
  char host[NI_MAXHOST] = "", port[NI_MAXSERV] = "";
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&peer), len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "(unknown peer)";
  }
  std::string name = host;
  if (name.rfind("::ffff:", 0) == 0) name.erase(0, 7);  // IPv4 on the dual-stack socket
  return (name.find(':') != std::string::npos ? "[" + name + "]" : name) + ":" + port;
}

class Server final : public StoreServer {
 public:
  Server(net::Socket listener, const Options& options)
      : listener_(std::move(listener)),
        stall_timeout_(options.stall_timeout),
        on_protocol_error_(options.on_protocol_error),
        core_({options.token}, [this](int id, std::string bytes) { queue(id, std::move(bytes)); }) {
    port_ = net::local_port(listener_.fd());
    epoll_ = net::Socket(::epoll_create1(EPOLL_CLOEXEC));
    wake_ = net::Socket(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!epoll_.valid() || !wake_.valid()) {
      throw NetworkError(net::errno_text("epoll_create1/eventfd", errno));
    }
    net::set_nonblocking(listener_.fd());
    net::set_nodelay(listener_.fd());  // inherited by every accepted connection
    watch(listener_.fd(), EPOLLIN, EPOLL_CTL_ADD);
    watch(wake_.fd(), EPOLLIN, EPOLL_CTL_ADD);
    thread_ = std::thread([this] { run(); });
  }

  ~Server() override {
    std::uint64_t one = 1;
    while (::write(wake_.fd(), &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    thread_.join();
    // The links close their sockets as members are destroyed: clients blocked on us see
    // EOF instead of hanging.
  }

  std::uint16_t port() const override { return port_; }

 private:
  // One client connection's socket and unsent replies.
  struct Link {
    net::Socket socket;
    std::string out;
    std::size_t sent = 0;  // of `out`
    bool dirty = false;    // has output not yet tried this turn
    bool unread = false;   // a read stopped before the socket was drained (edge-triggered:
                           // no new event comes for those bytes)
    bool hung_up = false;  // the peer's FIN (or an error) was reported: read to EOF, since
                           // edge-triggered epoll reports it once, often with the last request
    Clock::time_point progress;
  };

  void run();
  void watch(int fd, std::uint32_t events, int op);
  void accept_all();
  void read_from(int fd);
  void queue(int id, std::string bytes);
  bool flush(Link& link);
  void flush_dirty();
  void drop(int fd);
  void sweep_stalled();
  void report(const std::string& line);

  Link* link(int fd) {
    return fd >= 0 && static_cast<std::size_t>(fd) < links_.size() ? links_[fd].get() : nullptr;
  }

  net::Socket listener_;
  std::chrono::milliseconds stall_timeout_;
  std::function<void(const std::string&)> on_protocol_error_;
  std::uint16_t port_ = 0;
  net::Socket epoll_;
  net::Socket wake_;

  // Everything below is touched only by the server thread.
  Core core_;
  std::vector<std::unique_ptr<Link>> links_;  // by fd
  std::vector<int> dirty_;                    // links with new output this turn
  std::vector<int> dropping_;                 // links to close once this turn's events are done
  std::vector<int> again_;                    // links with bytes left to read next turn
  std::vector<char> chunk_ = std::vector<char>(kReadChunk);
  bool accepting_ = true;
  Clock::time_point accept_again_;
  // At most kReports lines per window, so a port scanner cannot flood the agent's stderr.
  static constexpr int kReports = 20;
  int reports_ = 0;
  long long unreported_ = 0;
  Clock::time_point report_window_;

  std::thread thread_;  // last: starts once everything above is built
};

void Server::watch(int fd, std::uint32_t events, int op) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (::epoll_ctl(epoll_.fd(), op, fd, &ev) != 0) {
    throw NetworkError(net::errno_text("epoll_ctl", errno));
  }
}

void Server::run() {
  std::vector<epoll_event> events(1024);
  auto tick = std::clamp<std::chrono::milliseconds>(
      stall_timeout_ / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  auto next_sweep = Clock::now() + tick;
  std::vector<int> again;
  for (;;) {
    int n = ::epoll_wait(epoll_.fd(), events.data(), static_cast<int>(events.size()),
                         again_.empty() ? static_cast<int>(tick.count()) : 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "dtrain store: epoll_wait failed, server stops: %s\n",
                   std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wake_.fd()) return;
      if (fd == listener_.fd()) {
        accept_all();
        continue;
      }
      Link* l = link(fd);
      if (l == nullptr) continue;
      if (events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) l->hung_up = true;
      if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) read_from(fd);
      if ((events[i].events & EPOLLOUT) && !l->dirty) {
        l->dirty = true;
        dirty_.push_back(fd);
      }
      // Answers go out at once, not after the other events of this turn: a client's next
      // request waits for nobody else's.
      flush_dirty();
    }
    // Those that had more to read than one turn takes (or than their backlog allowed).
    again.swap(again_);
    for (int fd : again) {
      Link* l = link(fd);
      if (l != nullptr && l->unread) read_from(fd);
      flush_dirty();
    }
    again.clear();
    for (int fd : dropping_) drop(fd);
    dropping_.clear();

    auto now = Clock::now();
    if (now >= next_sweep) {
      sweep_stalled();
      next_sweep = now + tick;
      if (!accepting_ && now >= accept_again_) {
        accepting_ = true;
        watch(listener_.fd(), EPOLLIN, EPOLL_CTL_MOD);
      }
    }
  }
}

void Server::accept_all() {
  for (int i = 0; i < 1024; ++i) {
    net::Socket client;
    try {
      client = net::accept_nonblocking(listener_.fd());
    } catch (const NetworkError& e) {
      // Typically EMFILE: existing clients keep being served; stop accepting for a moment
      // instead of spinning on the listener that stays readable.
      report(std::string("cannot accept more connections: ") + e.what() +
             " (raise the open-file limit, ulimit -n, of the process hosting the store)");
      accepting_ = false;
      accept_again_ = Clock::now() + std::chrono::milliseconds(100);
      watch(listener_.fd(), 0, EPOLL_CTL_MOD);
      return;
    }
    if (!client.valid()) return;
    int fd = client.fd();
    if (static_cast<std::size_t>(fd) >= links_.size()) links_.resize(fd + 1);
    auto l = std::make_unique<Link>();
    l->socket = std::move(client);
    l->progress = Clock::now();
    watch(fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, EPOLL_CTL_ADD);
    links_[fd] = std::move(l);
    core_.open(fd);
  }
}

void Server::read_from(int fd) {
  Link* l = link(fd);
  l->unread = false;
  for (int i = 0; i < kReadsPerTurn; ++i) {
    // Too much unsent output: leave the rest in the socket until the client reads.
    if (l->out.size() - l->sent > kMaxBacklog) {
      l->unread = true;
      return;
    }
    ssize_t got = ::recv(fd, chunk_.data(), chunk_.size(), 0);
    if (got > 0) {
      l->progress = Clock::now();
      if (auto d = core_.receive(fd, std::string_view(chunk_.data(), got))) {
        if (d->report)
          report("dtrain store: closed the connection of " + peer_name(fd) + ": " + d->why);
        dropping_.push_back(fd);
        return;
      }
      // A short read drained the socket - unless the peer hung up: then the next recv is
      // the EOF, and no further event would come for it (the connection would sit in
      // CLOSE-WAIT for the server's lifetime, one descriptor per client that sent its last
      // request and exited).
      if (static_cast<std::size_t>(got) < chunk_.size() && !l->hung_up) return;
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // EOF, reset: this client is done; the others are unaffected.
    dropping_.push_back(fd);
    return;
  }
  // The turn's share is used up; the rest next turn, after the others had theirs.
  l->unread = true;
  again_.push_back(fd);
}

void Server::queue(int id, std::string bytes) {
  Link* l = link(id);
  if (l == nullptr) return;
  if (l->sent == l->out.size()) {
    l->out = std::move(bytes);
    l->sent = 0;
  } else {
    l->out += bytes;
  }
  if (!l->dirty) {
    l->dirty = true;
    dirty_.push_back(id);
  }
}

// Sends the replies and wake-ups the last request produced: several for one client in one
// send.
void Server::flush_dirty() {
  for (int fd : dirty_) {
    Link* l = link(fd);
    if (l == nullptr || !l->dirty) continue;
    l->dirty = false;
    if (!flush(*l)) {
      dropping_.push_back(fd);
      continue;
    }
    // Drained below the backlog limit: read what was left waiting.
    if (l->unread && l->out.size() - l->sent <= kMaxBacklog) again_.push_back(fd);
  }
  dirty_.clear();
}

// Sends what the socket takes now. False if the connection is broken.
bool Server::flush(Link& l) {
  while (l.sent < l.out.size()) {
    ssize_t n = ::send(l.socket.fd(), l.out.data() + l.sent, l.out.size() - l.sent,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      l.sent += static_cast<std::size_t>(n);
      l.progress = Clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;
  }
  l.out.clear();
  l.sent = 0;
  if (l.out.capacity() > (std::size_t{1} << 20)) std::string().swap(l.out);
  return true;
}

void Server::drop(int fd) {
  Link* l = link(fd);
  if (l == nullptr) return;
  flush(*l);  // a last answer (AUTH's refusal) goes out if the socket takes it
  core_.close(fd);
  links_[fd].reset();  // closes the socket, which takes it out of the epoll set
}

// A client that has half a request buffered, or replies it does not read, and moves no
// byte for the stall timeout is dropped.
void Server::sweep_stalled() {
  auto now = Clock::now();
  for (std::size_t fd = 0; fd < links_.size(); ++fd) {
    Link* l = links_[fd].get();
    if (l == nullptr || now - l->progress < stall_timeout_) continue;
    if (l->sent < l->out.size() || core_.partial(static_cast<int>(fd))) {
      drop(static_cast<int>(fd));
    }
  }
}

void Server::report(const std::string& line) {
  auto emit = [this](const std::string& text) {
    if (on_protocol_error_) {
      on_protocol_error_(text);
    } else {
      std::fprintf(stderr, "%s\n", text.c_str());
    }
  };
  auto now = Clock::now();
  if (now - report_window_ > std::chrono::seconds(10)) {
    if (unreported_ > 0) {
      emit("dtrain store: " + std::to_string(unreported_) +
           " more such lines were left out in the last 10 s");
    }
    report_window_ = now;
    reports_ = 0;
    unreported_ = 0;
  }
  if (++reports_ > kReports) {
    ++unreported_;
    return;
  }
  emit(line);
}

}  // namespace

std::unique_ptr<StoreServer> StoreServer::start(const Options& options) {
  // Every client is a file descriptor here: thousands of ranks need more than the usual
  // soft limit of 1,024. The hard limit stays the administrator's.
  rlimit fds{};
  if (::getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur < fds.rlim_max) {
    fds.rlim_cur = fds.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &fds);
  }
  // The kernel caps the backlog at net.core.somaxconn; thousands of ranks connect at once.
  return std::make_unique<Server>(net::listen(options.bind_host, options.port, 65535), options);
}

}  // namespace dtrain::store
