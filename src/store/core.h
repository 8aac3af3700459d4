// The store's state and request handling, without sockets: bytes in per connection,
// replies out through a callback. StoreServer (store_server.cpp) is the epoll loop around it;
// the fuzz target feeds it bytes directly.
//
// Handlers mirror c10d's TCPStoreMasterDaemon (torch/csrc/distributed/c10d/TCPStore.cpp) query
// for query, including its quirks, because PyTorch clients depend on them.
//
// Not thread-safe: one thread owns a Core (the server's loop thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "store/wire.h"

namespace dtrain::store {

class Core {
 public:
  struct Options {
    // Non-empty: a connection must send this token (AUTH) before anything but VALIDATE.
    std::string token;
    // Until a connection proved the token, a request longer than this is refused (a
    // stranger cannot make the server buffer more than this per connection).
    std::uint64_t max_unauthenticated_request = 4096;
  };

  // Receives every reply and wake-up: (connection id, bytes to send it).
  using Send = std::function<void(int, std::string)>;

  Core(Options options, Send send);

  // A new connection. REQUIRES: id >= 0 and not open.
  void open(int id);

  // Why a connection must be closed; `report` when it is worth a line naming the peer (a
  // client that speaks neither protocol or lacks the token), not when c10d's daemon would
  // silently drop it too (a v1 GET of a missing key).
  struct Drop {
    std::string why;
    bool report = false;
  };

  // Feeds bytes that arrived on `id`; serves every complete request in them (replies go to
  // Send, possibly to other connections: wake-ups, watch updates). Returns a Drop when the
  // connection must be closed; the caller then sends what Send gave it and calls close().
  // REQUIRES: id is open.
  std::optional<Drop> receive(int id, std::string_view bytes);

  // Forgets a connection (its waits, watches, buffered bytes). No-op if not open.
  void close(int id);

  // True while `id` has part of a request buffered (the server's stall timeout applies).
  bool partial(int id) const;

  std::size_t keys() const { return data_.size(); }

 private:
  struct Conn {
    std::string in;       // received, not yet decoded
    std::size_t pos = 0;  // decoded up to here
    std::uint64_t need = 0;
    wire::Protocol protocol = wire::Protocol::UNKNOWN;
    bool authenticated = false;
    // The WAIT in progress: keys still missing (a key awaited twice counts twice).
    std::size_t missing = 0;
    std::vector<std::string> awaiting;
    std::vector<std::string> watching;
  };

  Conn* find(int id) const;
  std::optional<Drop> serve(int id, Conn& c, wire::Request& r);
  void append(Conn& c, std::string_view bytes);
  void do_set(const std::string& key, std::string value);
  void wake_waiters(const std::string& key);
  void wake_one_waiter(const std::string& key);
  void cancel_wait(int id, Conn& c);
  void notify_watchers(const std::string& key, std::uint8_t type, const std::string& old_value,
                       const std::string& new_value);
  // A key exists when it holds a value or names a non-empty queue (v2's QUEUE_POP waits on
  // the queue's name).
  bool exists(const std::string& key) const;

  Options options_;
  Send send_;
  std::vector<std::unique_ptr<Conn>> conns_;  // by id (fds are small integers)
  wire::Request request_;                     // reused: its vectors keep their capacity
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;  // v2 QUEUE_PUSH/POP
  std::unordered_map<std::string, std::vector<int>> waiting_;        // key -> connections
  std::unordered_map<std::string, std::vector<int>> watchers_;       // key -> connections
};

}  // namespace dtrain::store
