#include "store/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <thread>

namespace dtrain::net {

namespace {

// Milliseconds left until the deadline, rounded up (so we never spin on a 0 ms poll while
// time remains) and clamped to poll()'s int range.
int remaining_ms(Deadline deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

// poll() one fd for `events` until the deadline; false on timeout.
bool poll_one(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    if (errno != EINTR) throw NetworkError(errno_text("poll", errno));
  }
}

bool is_closed_errno(int err) { return err == EPIPE || err == ECONNRESET || err == ENOTCONN; }

// Binds a fresh socket of `family` to addr and listens. Returns an invalid Socket and sets
// `err` on failure.
Socket try_listen(int family, const sockaddr* addr, socklen_t len, int backlog, int& err) {
  Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) {
    err = errno;
    return {};
  }
  int one = 1, zero = 0;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // Dual-stack: one socket serves both IPv6 and IPv4-mapped clients.
  if (family == AF_INET6) ::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  if (::bind(s.fd(), addr, len) != 0 || ::listen(s.fd(), backlog) != 0) {
    err = errno;
    return {};
  }
  return s;
}

[[noreturn]] void throw_in_use(const std::string& host, std::uint16_t port) {
  throw AddressInUseError("port " + std::to_string(port) + " is already in use on " +
                          (host.empty() ? std::string("all interfaces") : host) +
                          ": choose another --master-port or stop the process using it");
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string errno_text(const char* what, int err) {
  return std::string(what) + ": " + std::strerror(err);
}

Socket listen(const std::string& host, std::uint16_t port, int backlog) {
  int err = 0;
  if (host.empty()) {
    sockaddr_in6 any6{};
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    any6.sin6_port = htons(port);
    Socket s = try_listen(AF_INET6, reinterpret_cast<sockaddr*>(&any6), sizeof(any6), backlog, err);
    if (s.valid()) return s;
    if (err == EADDRINUSE) throw_in_use(host, port);
    // No IPv6 on this host (EAFNOSUPPORT, EADDRNOTAVAIL...): plain IPv4.
    sockaddr_in any4{};
    any4.sin_family = AF_INET;
    any4.sin_addr.s_addr = htonl(INADDR_ANY);
    any4.sin_port = htons(port);
    s = try_listen(AF_INET, reinterpret_cast<sockaddr*>(&any4), sizeof(any4), backlog, err);
    if (s.valid()) return s;
    if (err == EADDRINUSE) throw_in_use(host, port);
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) {
      throw NetworkError("cannot listen on " + host + ":" + std::to_string(port) +
                         ": cannot resolve host: " + ::gai_strerror(rc));
    }
    std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, ::freeaddrinfo);
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      Socket s = try_listen(ai->ai_family, ai->ai_addr, ai->ai_addrlen, backlog, err);
      if (s.valid()) return s;
      if (err == EADDRINUSE) throw_in_use(host, port);
    }
  }
  throw NetworkError("cannot listen on " + (host.empty() ? std::string("*") : host) + ":" +
                     std::to_string(port) + ": " + errno_text("bind", err));
}

std::string bind_address_for(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (host.empty() || ::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return "";
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, ::freeaddrinfo);
  std::string only;
  bool all_loopback = true;
  const addrinfo* ipv4_loopback = nullptr;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    char text[NI_MAXHOST] = "";
    if (::getnameinfo(ai->ai_addr, ai->ai_addrlen, text, sizeof(text), nullptr, 0,
                      NI_NUMERICHOST) != 0) {
      return "";
    }
    if (ai->ai_family == AF_INET &&
        (ntohl(reinterpret_cast<const sockaddr_in*>(ai->ai_addr)->sin_addr.s_addr) >> 24) == 127) {
      if (ipv4_loopback == nullptr) ipv4_loopback = ai;
    } else if (!(ai->ai_family == AF_INET6 &&
                 IN6_IS_ADDR_LOOPBACK(
                     &reinterpret_cast<const sockaddr_in6*>(ai->ai_addr)->sin6_addr))) {
      all_loopback = false;
    }
    if (only.empty())
      only = text;
    else if (only != text)
      only = "*";  // several addresses
  }
  const addrinfo* chosen = res;
  if (only == "*") {
    // "localhost" as ::1 and 127.0.0.1: the IPv4 one (clients try every address); other
    // names with several addresses: which one is meant is unclear.
    if (!all_loopback || ipv4_loopback == nullptr) return "";
    chosen = ipv4_loopback;
    char text[NI_MAXHOST] = "";
    ::getnameinfo(chosen->ai_addr, chosen->ai_addrlen, text, sizeof(text), nullptr, 0,
                  NI_NUMERICHOST);
    only = text;
  }
  if (only.empty()) return "";
  // Ours if we can bind it (port 0: nothing is taken); an address of another machine fails.
  int err = 0;
  Socket probe = try_listen(chosen->ai_family, chosen->ai_addr, chosen->ai_addrlen, 1, err);
  return probe.valid() ? only : "";
}

std::uint16_t local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw NetworkError(errno_text("getsockname", errno));
  }
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

namespace {

Socket accept_with(int listen_fd, int flags, bool nodelay) {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, flags);
    if (fd >= 0) {
      if (nodelay) set_nodelay(fd);
      return Socket(fd);
    }
    if (errno == EINTR) continue;
    // The connection was aborted before we got to it: nothing to accept, not an error.
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EPROTO) {
      return {};
    }
    throw NetworkError(errno_text("accept", errno));
  }
}

}  // namespace

Socket accept(int listen_fd) { return accept_with(listen_fd, SOCK_CLOEXEC, true); }

Socket accept_nonblocking(int listen_fd) {
  // Linux gives an accepted socket the listening socket's TCP_NODELAY.
  return accept_with(listen_fd, SOCK_CLOEXEC | SOCK_NONBLOCK, false);
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    throw NetworkError(errno_text("fcntl(O_NONBLOCK)", errno));
  }
}

Socket connect(const std::string& host, std::uint16_t port, Deadline deadline) {
  const auto start = Clock::now();
  const std::string where = host + ":" + std::to_string(port);
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) {
      last_error = std::string("cannot resolve host: ") + ::gai_strerror(rc);
      res = nullptr;
    }
    std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, ::freeaddrinfo);
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      Socket s(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (!s.valid()) {
        last_error = errno_text("socket", errno);
        continue;
      }
      // Non-blocking connect so an unresponsive address costs at most the deadline.
      if (::connect(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
          last_error = errno_text("connect", errno);
          continue;
        }
        if (!poll_one(s.fd(), POLLOUT, deadline)) {
          last_error = "connect: timed out";
          continue;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          last_error = errno_text("connect", err);
          continue;
        }
      }
      // Retrying a local port in the ephemeral range can make TCP connect the socket to
      // itself (simultaneous open); that is not the server.
      sockaddr_storage self{}, peer{};
      socklen_t self_len = sizeof(self), peer_len = sizeof(peer);
      if (::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&self), &self_len) == 0 &&
          ::getpeername(s.fd(), reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 &&
          self_len == peer_len && std::memcmp(&self, &peer, self_len) == 0) {
        last_error = "connect: connected to itself";
        continue;
      }
      ::fcntl(s.fd(), F_SETFL, ::fcntl(s.fd(), F_GETFL) & ~O_NONBLOCK);
      set_nodelay(s.fd());
      return s;
    }
    auto now = Clock::now();
    if (now >= deadline) {
      auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count();
      throw TimeoutError("could not connect to " + where + " within " + std::to_string(waited) +
                         " ms (last error: " + last_error + "); is the store server running?");
    }
    // Backoff between rounds; the server is most likely still starting.
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

bool wait_readable(int fd, Deadline deadline) { return poll_one(fd, POLLIN, deadline); }

namespace {

// The deadline of the next wait: fixed, or `limit` from now (so it moves with progress).
Deadline next_deadline(Deadline d) { return d; }
Deadline next_deadline(Stall s) { return deadline_after(s.limit); }

template <typename Limit>
void send_loop(int fd, const void* data, std::size_t n, Limit limit) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      p += sent;
      n -= static_cast<std::size_t>(sent);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!poll_one(fd, POLLOUT, next_deadline(limit)))
        throw TimeoutError("send: peer is not reading");
      continue;
    }
    if (is_closed_errno(errno)) throw ConnectionClosed(errno_text("send", errno));
    throw NetworkError(errno_text("send", errno));
  }
}

template <typename Limit>
void recv_loop(int fd, void* data, std::size_t n, Limit limit) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got > 0) {
      p += got;
      n -= static_cast<std::size_t>(got);
      continue;
    }
    if (got == 0) throw ConnectionClosed("connection closed by peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!poll_one(fd, POLLIN, next_deadline(limit)))
        throw TimeoutError("recv: no data before the deadline");
      continue;
    }
    if (is_closed_errno(errno)) throw ConnectionClosed(errno_text("recv", errno));
    throw NetworkError(errno_text("recv", errno));
  }
}

}  // namespace

void send_all(int fd, const void* data, std::size_t n, Deadline deadline) {
  send_loop(fd, data, n, deadline);
}
void send_all(int fd, const void* data, std::size_t n, Stall stall) {
  send_loop(fd, data, n, stall);
}
void recv_all(int fd, void* data, std::size_t n, Deadline deadline) {
  recv_loop(fd, data, n, deadline);
}
void recv_all(int fd, void* data, std::size_t n, Stall stall) { recv_loop(fd, data, n, stall); }

}  // namespace dtrain::net
