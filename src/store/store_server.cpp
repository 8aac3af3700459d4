// StoreServer: PyTorch's TCPStoreMasterDaemon, re-implemented without libtorch.
//
// One thread runs a poll() loop over the listen socket, a self-pipe (shutdown) and every
// client connection; all store state lives on that thread, so nothing here is locked.
// Handlers mirror c10d's (torch/csrc/distributed/c10d/TCPStore.cpp) query for query,
// including its quirks, because PyTorch clients depend on them.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "dtrain/error.h"
#include "dtrain/store.h"
#include "core/memory.h"
#include "store/socket.h"

namespace dtrain::store {

namespace {

enum class Query : std::uint8_t {
  SET = 0,
  COMPARE_SET = 1,
  GET = 2,
  ADD = 3,
  CHECK = 4,
  WAIT = 5,
  GETNUMKEYS = 6,
  WATCH_KEY = 7,
  DELETE_KEY = 8,
  APPEND = 9,
  MULTI_GET = 10,
  MULTI_SET = 11,
  CANCEL_WAIT = 12,
};

constexpr std::uint8_t kReady = 0, kNotReady = 1;              // CHECK
constexpr std::uint8_t kStopWaiting = 0, kWaitCanceled = 1;    // WAIT, CANCEL_WAIT
constexpr std::uint8_t kKeyUpdated = 0, kKeyCreated = 1, kKeyDeleted = 2,
                       kCallbackRegistered = 3, kKeyAppended = 4;  // WATCH_KEY

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
  std::string bytes() {
    auto n = value<std::uint64_t>();
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
  Server(net::Socket listener, std::chrono::milliseconds stall_timeout)
      : listener_(std::move(listener)), stall_timeout_(stall_timeout) {
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
  void drop(int fd);
  void send_to(int fd, const Writer& w);
  void do_set(const std::string& key, std::string value);
  void wake_waiters(const std::string& key);
  void notify_watchers(const std::string& key, std::uint8_t type, const std::string& old_value,
                       const std::string& new_value);
  bool all_exist(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return data_.count(k) > 0; });
  }

  net::Socket listener_;
  std::chrono::milliseconds stall_timeout_;
  std::uint16_t port_ = 0;
  int stop_pipe_[2] = {-1, -1};
  std::thread thread_;

  // Everything below is touched only by the server thread.
  std::unordered_map<int, net::Socket> clients_;
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::vector<int>> waiting_;  // key -> sockets waiting for it
  std::unordered_map<int, std::size_t> keys_awaited_;          // socket -> keys still missing
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
  dead_.erase(fd);
  clients_.erase(fd);  // closes the socket
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

// Reads one request from fd and answers it. Throws when the client must be dropped.
void Server::handle(int fd) {
  Reader in(fd, net::Stall{stall_timeout_});
  auto type = in.value<std::uint8_t>();
  switch (static_cast<Query>(type)) {
    case Query::SET: {
      auto key = in.bytes();
      do_set(key, in.bytes());
      return;
    }
    case Query::COMPARE_SET: {
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
    case Query::GET: {
      auto key = in.bytes();
      auto it = data_.find(key);
      // Clients WAIT before GET; a missing key here is a protocol error (c10d drops too).
      if (it == data_.end()) throw StoreError("GET of missing key " + key);
      send_to(fd, Writer().bytes(it->second));
      return;
    }
    case Query::ADD: {
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
    case Query::CHECK: {
      auto keys = in.keys();
      send_to(fd, Writer().value(all_exist(keys) ? kReady : kNotReady));
      return;
    }
    case Query::WAIT: {
      auto keys = in.keys();
      if (all_exist(keys)) {
        send_to(fd, Writer().value(kStopWaiting));
        return;
      }
      std::size_t missing = 0;
      for (const auto& key : keys) {
        if (data_.count(key) == 0) {
          waiting_[key].push_back(fd);
          ++missing;
        }
      }
      keys_awaited_[fd] = missing;
      return;
    }
    case Query::GETNUMKEYS:
      send_to(fd, Writer().value(static_cast<std::int64_t>(data_.size())));
      return;
    case Query::WATCH_KEY: {
      watchers_[in.bytes()].push_back(fd);
      send_to(fd, Writer().value(kCallbackRegistered));
      return;
    }
    case Query::DELETE_KEY: {
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
    case Query::APPEND: {
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
    case Query::MULTI_GET: {
      auto keys = in.keys();
      Writer reply;
      for (const auto& key : keys) {
        auto it = data_.find(key);
        if (it == data_.end()) throw StoreError("MULTI_GET of missing key " + key);
        reply.bytes(it->second);
      }
      send_to(fd, reply);
      return;
    }
    case Query::MULTI_SET: {
      auto n = in.value<std::uint64_t>();
      for (std::uint64_t i = 0; i < n; ++i) {
        auto key = in.bytes();
        do_set(key, in.bytes());
      }
      return;
    }
    case Query::CANCEL_WAIT: {
      forget(waiting_, fd);
      keys_awaited_.erase(fd);
      send_to(fd, Writer().value(kWaitCanceled));
      return;
    }
  }
  throw StoreError("unknown query type " + std::to_string(type));
}

}  // namespace

std::unique_ptr<StoreServer> StoreServer::start(const Options& options) {
  return std::make_unique<Server>(net::listen(options.bind_host, options.port), options.stall_timeout);
}

}  // namespace dtrain::store
