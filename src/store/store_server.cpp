// StoreServer: PyTorch's TCPStoreMasterDaemon, re-implemented without libtorch.
//
// One thread runs a poll() loop over the listen socket, a self-pipe (shutdown) and every
// client connection; all store state lives on that thread, so nothing here is locked.
// Handlers mirror c10d's (torch/csrc/distributed/c10d/TCPStore.cpp) query for query,
// including its quirks, because PyTorch clients depend on them.
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/memory.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/socket.h"

namespace dtrain::store {

namespace {

// What a request asks for, whichever protocol numbered it on the wire.
enum class Op {
  SET,
  COMPARE_SET,
  GET,
  ADD,
  CHECK,
  WAIT,
  GETNUMKEYS,
  WATCH_KEY,
  DELETE_KEY,
  APPEND,
  MULTI_GET,
  MULTI_SET,
  CANCEL_WAIT,
  VALIDATE,
  PING,
  QUEUE_PUSH,
  QUEUE_POP,
  QUEUE_LEN,
  LIST_KEYS,
  UNKNOWN,
};

// Each connection speaks one protocol, told by its first request: v2 clients (PyTorch 2.x)
// open with VALIDATE + the magic number; v1 clients (PyTorch 1.x, dtrain before 2.x
// support) start with a query.
enum class Protocol { UNKNOWN, V1, V2 };

constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;

Op decode(Protocol p, std::uint8_t type) {
  static constexpr Op v1[] = {Op::SET,        Op::COMPARE_SET, Op::GET,        Op::ADD,
                              Op::CHECK,      Op::WAIT,        Op::GETNUMKEYS, Op::WATCH_KEY,
                              Op::DELETE_KEY, Op::APPEND,      Op::MULTI_GET,  Op::MULTI_SET,
                              Op::CANCEL_WAIT};
  static constexpr Op v2[] = {Op::VALIDATE,    Op::SET,      Op::COMPARE_SET, Op::GET,
                              Op::ADD,         Op::CHECK,    Op::WAIT,        Op::GETNUMKEYS,
                              Op::DELETE_KEY,  Op::APPEND,   Op::MULTI_GET,   Op::MULTI_SET,
                              Op::CANCEL_WAIT, Op::PING,     Op::QUEUE_PUSH,  Op::QUEUE_POP,
                              Op::QUEUE_LEN,   Op::LIST_KEYS};
  if (p == Protocol::V2) return type < std::size(v2) ? v2[type] : Op::UNKNOWN;
  return type < std::size(v1) ? v1[type] : Op::UNKNOWN;
}

// A client that speaks neither protocol: the message names it and what it sent.
class ProtocolError : public StoreError {
 public:
  using StoreError::StoreError;
};

constexpr std::uint8_t kReady = 0, kNotReady = 1;            // CHECK
constexpr std::uint8_t kStopWaiting = 0, kWaitCanceled = 1;  // WAIT, CANCEL_WAIT
constexpr std::uint8_t kKeyUpdated = 0, kKeyCreated = 1, kKeyDeleted = 2, kCallbackRegistered = 3,
                       kKeyAppended = 4;  // WATCH_KEY

// Reads one request's fields from a client. Once its first byte arrived, the client must
// keep bytes moving (Options::stall_timeout) or be dropped: while a request is being read
// the loop serves nobody else.
class Reader {
 public:
  Reader(int fd, net::Stall stall) : fd_(fd), stall_(stall) {}

  template <typename T>
  T value() {
    T v{};
    net::recv_all(fd_, &v, sizeof(v), stall_);
    return v;
  }

  // u64 length + bytes. Grown chunk by chunk as data arrives, so a garbage length from a
  // confused client costs nothing until the bytes actually show up.
  std::string bytes() { return bytes(value<std::uint64_t>()); }

  std::string bytes(std::uint64_t n) {
    std::string s;
    while (s.size() < n) {
      // Chunks grow with what has arrived (64 KiB, then doubling): few calls for big values.
      std::size_t chunk = static_cast<std::size_t>(
          std::min<std::uint64_t>(n - s.size(), std::max<std::size_t>(1 << 16, s.size())));
      std::size_t at = s.size();
      if (s.capacity() < at + chunk) {
        s.reserve(std::max(2 * s.capacity(), at + chunk));
        detail::advise_huge_pages(s.data(), s.capacity());
      }
      s.resize(at + chunk);
      net::recv_all(fd_, s.data() + at, chunk, stall_);
    }
    return s;
  }

  std::vector<std::string> keys() {
    auto n = value<std::uint64_t>();
    std::vector<std::string> keys;
    for (std::uint64_t i = 0; i < n; ++i) keys.push_back(bytes());
    return keys;
  }

 private:
  int fd_;
  net::Stall stall_;
};

// Builds one reply (or one watch update) so it goes out in a single send.
class Writer {
 public:
  template <typename T>
  Writer& value(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  Writer& bytes(const std::string& s) {
    value<std::uint64_t>(s.size());
    if (s.size() >= (std::size_t{4} << 20)) {
      out_.reserve(out_.size() + s.size());
      detail::advise_huge_pages(out_.data(), out_.capacity());
    }
    out_ += s;
    return *this;
  }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

class Server final : public StoreServer {
 public:
  Server(net::Socket listener, const Options& options)
      : listener_(std::move(listener)),
        stall_timeout_(options.stall_timeout),
        on_protocol_error_(options.on_protocol_error) {
    port_ = net::local_port(listener_.fd());
    if (::pipe2(stop_pipe_, O_CLOEXEC) != 0) throw NetworkError(net::errno_text("pipe2", errno));
    thread_ = std::thread([this] { run(); });
  }

  ~Server() override {
    // Wakes the poll loop; it exits without touching the pipe again.
    char byte = 0;
    while (::write(stop_pipe_[1], &byte, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
    ::close(stop_pipe_[0]);
    ::close(stop_pipe_[1]);
    // clients_ and listener_ close their sockets as members are destroyed: clients blocked
    // on us see EOF instead of hanging.
  }

  std::uint16_t port() const override { return port_; }

 private:
  void run();
  void handle(int fd);
  void serve(int fd, Protocol protocol, Op op, Reader& in);
  void protocol_error(int fd, const std::string& what);
  void drop(int fd);
  void send_to(int fd, const Writer& w);
  void do_set(const std::string& key, std::string value);
  void wake_waiters(const std::string& key);
  void wake_one_waiter(const std::string& key);
  void notify_watchers(const std::string& key, std::uint8_t type, const std::string& old_value,
                       const std::string& new_value);
  // A key exists when it holds a value or names a non-empty queue (v2's QUEUE_POP waits on
  // the queue's name).
  bool exists(const std::string& key) const {
    if (data_.count(key) > 0) return true;
    auto q = queues_.find(key);
    return q != queues_.end() && !q->second.empty();
  }
  bool all_exist(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return exists(k); });
  }

  net::Socket listener_;
  std::chrono::milliseconds stall_timeout_;
  std::function<void(const std::string&)> on_protocol_error_;
  std::uint16_t port_ = 0;
  int stop_pipe_[2] = {-1, -1};
  std::thread thread_;

  // Everything below is touched only by the server thread.
  std::unordered_map<int, net::Socket> clients_;
  std::unordered_map<int, Protocol> protocol_;  // per connection, once its first request came
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;  // v2 QUEUE_PUSH/POP
  std::unordered_map<std::string, std::vector<int>> waiting_;   // key -> sockets waiting for it
  std::unordered_map<int, std::size_t> keys_awaited_;           // socket -> keys still missing
  std::unordered_map<std::string, std::vector<int>> watchers_;  // key -> sockets watching it
  // Sockets a send failed on while serving someone else; dropped once that request is done
  // (dropping mid-handler would invalidate the lists being walked).
  std::unordered_set<int> dead_;
};

void Server::run() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({listener_.fd(), POLLIN, 0});
    fds.push_back({stop_pipe_[0], POLLIN, 0});
    for (const auto& [fd, socket] : clients_) fds.push_back({fd, POLLIN, 0});

    // No timeout: every event that matters (a client, a connection, shutdown) is an fd.
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "dtrain store: poll failed, server stops: %s\n", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;

    for (std::size_t i = 2; i < fds.size(); ++i) {
      int fd = fds[i].fd;
      if (fds[i].revents == 0 || clients_.count(fd) == 0) continue;
      try {
        handle(fd);
      } catch (const ProtocolError& e) {
        protocol_error(fd, e.what());
        dead_.insert(fd);
      } catch (const std::exception&) {
        // EOF, reset, garbage, a stalled request, a GET of a missing key (c10d does the
        // same): this client is done; the others are unaffected.
        dead_.insert(fd);
      }
      while (!dead_.empty()) drop(*dead_.begin());
    }

    if (fds[0].revents & POLLIN) {
      try {
        net::Socket client = net::accept(listener_.fd());
        if (client.valid()) {
          int fd = client.fd();
          clients_.emplace(fd, std::move(client));
        }
      } catch (const NetworkError& e) {
        // Typically EMFILE; existing clients keep being served.
        std::fprintf(stderr, "dtrain store: %s\n", e.what());
      }
    }
  }
}

// Removes fd from every key's list in `index`.
void forget(std::unordered_map<std::string, std::vector<int>>& index, int fd) {
  for (auto it = index.begin(); it != index.end();) {
    std::erase(it->second, fd);
    it = it->second.empty() ? index.erase(it) : std::next(it);
  }
}

void Server::drop(int fd) {
  forget(waiting_, fd);
  forget(watchers_, fd);
  keys_awaited_.erase(fd);
  protocol_.erase(fd);
  dead_.erase(fd);
  clients_.erase(fd);  // closes the socket
}

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

void Server::protocol_error(int fd, const std::string& what) {
  std::string message = "dtrain store: closed the connection of " + peer_name(fd) + ": " + what;
  if (on_protocol_error_) {
    on_protocol_error_(message);
  } else {
    std::fprintf(stderr, "%s\n", message.c_str());
  }
}

void Server::send_to(int fd, const Writer& w) {
  if (dead_.count(fd) != 0) return;
  try {
    net::send_all(fd, w.str().data(), w.str().size(), net::Stall{stall_timeout_});
  } catch (const Error&) {
    dead_.insert(fd);
  }
}

void Server::wake_waiters(const std::string& key) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  std::vector<int> sockets = std::move(it->second);
  waiting_.erase(it);
  for (int fd : sockets) {
    auto awaited = keys_awaited_.find(fd);
    if (awaited == keys_awaited_.end()) continue;
    if (--awaited->second == 0) {
      keys_awaited_.erase(awaited);
      send_to(fd, Writer().value(kStopWaiting));
    }
  }
}

// A queue item goes to one waiter: the first whose last awaited key this was.
void Server::wake_one_waiter(const std::string& key) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  auto& sockets = it->second;
  for (auto fd_it = sockets.begin(); fd_it != sockets.end(); ++fd_it) {
    auto awaited = keys_awaited_.find(*fd_it);
    if (awaited == keys_awaited_.end() || awaited->second != 1) continue;
    int fd = *fd_it;
    keys_awaited_.erase(awaited);
    sockets.erase(fd_it);
    if (sockets.empty()) waiting_.erase(it);
    send_to(fd, Writer().value(kStopWaiting));
    return;
  }
}

void Server::notify_watchers(const std::string& key, std::uint8_t type,
                             const std::string& old_value, const std::string& new_value) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  Writer update;
  update.value(type).bytes(key).bytes(old_value).bytes(new_value);
  for (int fd : it->second) send_to(fd, update);
}

void Server::do_set(const std::string& key, std::string value) {
  auto it = data_.find(key);
  bool created = it == data_.end();
  std::string old_value = created ? std::string() : std::move(it->second);
  std::string& slot = data_[key];
  slot = std::move(value);
  wake_waiters(key);
  notify_watchers(key, created ? kKeyCreated : kKeyUpdated, old_value, slot);
}

// Reads one request from fd and answers it. Throws when the client must be dropped
// (ProtocolError when it speaks neither protocol).
void Server::handle(int fd) {
  Reader in(fd, net::Stall{stall_timeout_});
  auto type = in.value<std::uint8_t>();
  Protocol& protocol = protocol_[fd];
  if (protocol == Protocol::UNKNOWN) {
    if (type != 0) {
      // Only v1 starts with a query other than byte 0; a byte v1 does not know either is
      // neither protocol (an HTTP probe, a newer PyTorch, ...).
      if (decode(Protocol::V1, type) == Op::UNKNOWN) {
        throw ProtocolError("its first request has type " + std::to_string(type) +
                            ", which is neither a PyTorch 1.x (v1) nor a PyTorch 2.x (v2) "
                            "TCPStore request; is it a TCPStore client of a PyTorch version this "
                            "dtrain does not support, or not a TCPStore client at all?");
      }
      protocol = Protocol::V1;
    } else {
      // Byte 0 is v2's VALIDATE or v1's SET. VALIDATE carries the magic number; as the low
      // half of a SET's key length it would mean a ~1 GB key, which no store client sends.
      auto magic = in.value<std::uint32_t>();
      if (magic == kValidationMagic) {
        protocol = Protocol::V2;
        return;  // VALIDATE has no reply
      }
      protocol = Protocol::V1;
      auto high = in.value<std::uint32_t>();
      auto key = in.bytes(static_cast<std::uint64_t>(high) << 32 | magic);
      do_set(key, in.bytes());
      return;
    }
  }
  Op op = decode(protocol, type);
  if (op == Op::UNKNOWN) {
    throw ProtocolError(std::string("it sent request type ") + std::to_string(type) +
                        ", unknown in the " +
                        (protocol == Protocol::V2 ? "PyTorch 2.x (v2)" : "PyTorch 1.x (v1)") +
                        " TCPStore protocol it spoke so far");
  }
  serve(fd, protocol, op, in);
}

void Server::serve(int fd, Protocol protocol, Op op, Reader& in) {
  switch (op) {
    case Op::SET: {
      auto key = in.bytes();
      do_set(key, in.bytes());
      return;
    }
    case Op::COMPARE_SET: {
      auto key = in.bytes();
      auto expected = in.bytes();
      auto desired = in.bytes();
      auto it = data_.find(key);
      if (it == data_.end()) {
        if (!expected.empty()) {
          // c10d answers `expected` for a missing key (its own TODO calls this "lying");
          // PyTorch callers compare against it, so we must too.
          send_to(fd, Writer().bytes(expected));
          return;
        }
        data_[key] = desired;
        // c10d does not wake waiters here, which leaves a wait() on a key created by
        // compare_set hanging; waking them is the only difference a client can observe.
        wake_waiters(key);
        notify_watchers(key, kKeyCreated, expected, desired);
        send_to(fd, Writer().bytes(desired));
        return;
      }
      if (it->second == expected) {
        std::string old_value = std::exchange(it->second, desired);
        notify_watchers(key, kKeyUpdated, old_value, it->second);
      }
      send_to(fd, Writer().bytes(it->second));
      return;
    }
    case Op::GET: {
      auto key = in.bytes();
      auto it = data_.find(key);
      // Clients WAIT before GET. A missing key anyway: PyTorch 1.x's daemon drops the
      // client, 2.x's answers an empty value; each client gets what its PyTorch does.
      if (it == data_.end() && protocol == Protocol::V2) {
        send_to(fd, Writer().bytes(std::string()));
        return;
      }
      if (it == data_.end()) throw StoreError("GET of missing key " + key);
      send_to(fd, Writer().bytes(it->second));
      return;
    }
    case Op::ADD: {
      auto key = in.bytes();
      auto value = in.value<std::int64_t>();
      auto it = data_.find(key);
      bool created = it == data_.end();
      std::string old_value = created ? std::string() : it->second;
      // Non-numeric text throws here and drops the client, exactly like c10d's stoll.
      if (!created) value += std::stoll(old_value);
      std::string& slot = data_[key];
      slot = std::to_string(value);
      send_to(fd, Writer().value(value));
      wake_waiters(key);
      notify_watchers(key, created ? kKeyCreated : kKeyUpdated, old_value, slot);
      return;
    }
    case Op::CHECK: {
      auto keys = in.keys();
      send_to(fd, Writer().value(all_exist(keys) ? kReady : kNotReady));
      return;
    }
    case Op::WAIT: {
      auto keys = in.keys();
      if (all_exist(keys)) {
        send_to(fd, Writer().value(kStopWaiting));
        return;
      }
      std::size_t missing = 0;
      for (const auto& key : keys) {
        if (!exists(key)) {
          waiting_[key].push_back(fd);
          ++missing;
        }
      }
      keys_awaited_[fd] = missing;
      return;
    }
    case Op::GETNUMKEYS:
      send_to(fd, Writer().value(static_cast<std::int64_t>(data_.size())));
      return;
    case Op::WATCH_KEY: {
      watchers_[in.bytes()].push_back(fd);
      send_to(fd, Writer().value(kCallbackRegistered));
      return;
    }
    case Op::DELETE_KEY: {
      auto key = in.bytes();
      auto it = data_.find(key);
      std::int64_t deleted = 0;
      if (it != data_.end()) {
        std::string old_value = std::move(it->second);
        data_.erase(it);
        deleted = 1;
        notify_watchers(key, kKeyDeleted, old_value, std::string());
      }
      send_to(fd, Writer().value(deleted));
      return;
    }
    case Op::APPEND: {
      auto key = in.bytes();
      auto value = in.bytes();
      auto it = data_.find(key);
      bool created = it == data_.end();
      if (created) {
        data_.emplace(key, value);
      } else {
        it->second += value;
      }
      wake_waiters(key);
      // c10d sends an empty "old value" and the appended bytes as the "new value".
      notify_watchers(key, created ? kKeyCreated : kKeyAppended, std::string(), value);
      return;
    }
    case Op::MULTI_GET: {
      auto keys = in.keys();
      Writer reply;
      for (const auto& key : keys) {
        auto it = data_.find(key);
        if (it == data_.end() && protocol == Protocol::V1) {
          throw StoreError("MULTI_GET of missing key " + key);
        }
        reply.bytes(it == data_.end() ? std::string() : it->second);
      }
      send_to(fd, reply);
      return;
    }
    case Op::MULTI_SET: {
      auto n = in.value<std::uint64_t>();
      for (std::uint64_t i = 0; i < n; ++i) {
        auto key = in.bytes();
        do_set(key, in.bytes());
      }
      return;
    }
    case Op::CANCEL_WAIT: {
      forget(waiting_, fd);
      keys_awaited_.erase(fd);
      send_to(fd, Writer().value(kWaitCanceled));
      return;
    }
    case Op::VALIDATE: {
      // Once more after the opening one: harmless if it still carries the magic number.
      if (in.value<std::uint32_t>() != kValidationMagic) {
        throw ProtocolError("it sent VALIDATE with a wrong magic number");
      }
      return;
    }
    case Op::PING:
      // The client checks that its nonce comes back.
      send_to(fd, Writer().value(in.value<std::uint32_t>()));
      return;
    case Op::QUEUE_PUSH: {
      auto key = in.bytes();
      queues_[key].push_back(in.bytes());
      wake_one_waiter(key);
      return;
    }
    case Op::QUEUE_POP: {
      // The length before the pop, then the item if there was one (clients WAIT first).
      auto& queue = queues_[in.bytes()];
      Writer reply;
      reply.value(static_cast<std::int64_t>(queue.size()));
      if (!queue.empty()) {
        reply.bytes(queue.front());
        queue.pop_front();
      }
      send_to(fd, reply);
      return;
    }
    case Op::QUEUE_LEN: {
      auto it = queues_.find(in.bytes());
      send_to(fd, Writer().value(
                      static_cast<std::int64_t>(it == queues_.end() ? 0 : it->second.size())));
      return;
    }
    case Op::LIST_KEYS: {
      Writer reply;
      reply.value(static_cast<std::int64_t>(data_.size()));
      for (const auto& [key, value] : data_) reply.bytes(key);
      send_to(fd, reply);
      return;
    }
    case Op::UNKNOWN:
      break;
  }
  throw ProtocolError("unhandled request");
}

}  // namespace

std::unique_ptr<StoreServer> StoreServer::start(const Options& options) {
  return std::make_unique<Server>(net::listen(options.bind_host, options.port), options);
}

}  // namespace dtrain::store
