// Small RAII helpers over POSIX TCP sockets, shared by the store server and client.
//
// Every blocking call takes a deadline: a peer that stops talking costs a bounded wait,
// never a hung process. Every fd is close-on-exec, so workers the launcher forks do not
// inherit (and keep open) the store's sockets.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "dtrain/error.h"

namespace dtrain::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after(std::chrono::milliseconds timeout) { return Clock::now() + timeout; }

// The peer closed the connection (EOF, reset, broken pipe).
class ConnectionClosed : public NetworkError {
 public:
  using NetworkError::NetworkError;
};

// Owns one fd; closes it on destruction. Move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close();

 private:
  int fd_ = -1;
};

// Binds and listens on host:port with SO_REUSEADDR. An empty host means every interface:
// IPv6 dual-stack if the kernel has IPv6, else IPv4. Port 0 picks a free port.
// Throws AddressInUseError if the port is taken, NetworkError for anything else.
Socket listen(const std::string& host, std::uint16_t port, int backlog = 1024);

// The address a store serving clients that reach it as `host` should bind: `host`'s address
// when every address it resolves to is one and the same address of this machine (a
// loopback address included), so the store is not reachable through the machine's other
// interfaces; "" (every interface) when `host` names several addresses, none of this
// machine's, or does not resolve here. Never throws.
std::string bind_address_for(const std::string& host);

// The local port a bound socket ended up on.
std::uint16_t local_port(int fd);

// Accepts one pending connection (TCP_NODELAY, CLOEXEC). Returns an invalid Socket when
// there was nothing to accept after all (the peer gave up between poll and accept).
// Throws NetworkError for other failures.
Socket accept(int listen_fd);

// The same for an event loop, in one system call: the connection comes non-blocking and
// takes TCP_NODELAY from the listening socket (REQUIRES: set_nodelay(listen_fd) before).
Socket accept_nonblocking(int listen_fd);

// TCP_NODELAY: store requests are tiny request/response pairs; Nagle would add 40 ms stalls.
void set_nodelay(int fd);

// Sets O_NONBLOCK (for the store's event loop). Throws NetworkError if fcntl fails.
void set_nonblocking(int fd);

// Connects to host:port, trying every address getaddrinfo returns and retrying with a
// short backoff (the server may not be up yet) until `deadline`.
// Throws TimeoutError naming host:port and the last error when it never succeeded.
Socket connect(const std::string& host, std::uint16_t port, Deadline deadline);

// Waits until fd is readable (or at EOF/error). False if the deadline passed first.
bool wait_readable(int fd, Deadline deadline);

// A timeout on progress rather than on the whole transfer: it passes only when no byte
// moves for `limit`. A gigabyte over a slow link takes as long as it takes; a peer that
// stops sending (or reading) is still given up on.
struct Stall {
  std::chrono::milliseconds limit;
};

// Sends all n bytes (retrying on EINTR and short writes, without SIGPIPE).
// Throws ConnectionClosed if the peer went away, TimeoutError past the deadline (or stall).
void send_all(int fd, const void* data, std::size_t n, Deadline deadline);
void send_all(int fd, const void* data, std::size_t n, Stall stall);

// Receives exactly n bytes. Throws ConnectionClosed on EOF or reset, TimeoutError past
// the deadline (or stall), NetworkError for other errors.
void recv_all(int fd, void* data, std::size_t n, Deadline deadline);
void recv_all(int fd, void* data, std::size_t n, Stall stall);

// errno's text, prefixed with what was being done: "connect: Connection refused".
std::string errno_text(const char* what, int err);

}  // namespace dtrain::net
