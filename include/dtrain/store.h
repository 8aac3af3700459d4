// A key-value store that speaks PyTorch's TCPStore wire protocol.
//
// Why our own: the launcher hosts the job's store for its whole life, and linking
// libtorch only to get c10d::TCPStore costs every `dtrain run` ~0.6 s of dynamic loading.
// StoreServer/StoreClient need no libtorch, and any c10d::TCPStore client (C++ or Python,
// PyTorch 1.x or 2.x) talks to StoreServer unchanged - so workers use PyTorch's own TCPStore
// against the agent's server (TORCHELASTIC_USE_AGENT_STORE=True).
//
// Two wire protocols, told apart per connection by its first request:
//
// v2 (PyTorch 2.x; tested with 2.11): the client opens with
//   0 VALIDATE    u32 0x3C85F7CE                    -> (nothing)
// and then uses this numbering (arguments and replies as in v1 below):
//   1 SET  2 COMPARE_SET  3 GET  4 ADD  5 CHECK  6 WAIT  7 GETNUMKEYS  8 DELETE_KEY  9 APPEND
//   10 MULTI_GET  11 MULTI_SET  12 CANCEL_WAIT, and
//   13 PING       u32 nonce                         -> u32 the same nonce
//   14 QUEUE_PUSH key, data                         -> (nothing; wakes one WAIT on key)
//   15 QUEUE_POP  key                               -> i64 queue length, then bytes if it was > 0
//   16 QUEUE_LEN  key                               -> i64
//   17 LIST_KEYS                                    -> i64 n, n keys
// A v2 GET or MULTI_GET of a missing key answers an empty value; CHECK and WAIT count a
// non-empty queue as an existing key. There is no WATCH_KEY.
//
// v1 (PyTorch 1.x; tested with 1.13): no handshake. A connection whose first request is
// neither (a byte v1 does not know) is closed at once and named on stderr, or given to
// StoreServer::Options::on_protocol_error.
//
// v1 wire protocol (little-endian host byte order, as c10d's tcputil sends it):
//   request  = u8 query type, then its arguments;
//   string   = u64 length, bytes;          value = raw bytes of the C++ type.
//   0 SET         key, data                         -> (nothing)
//   1 COMPARE_SET key, expected, desired            -> bytes (the value now stored, except: key
//                                                      absent + expected non-empty -> `expected`)
//   2 GET         key                               -> bytes (the client WAITs for the key first;
//                                                      a GET of a missing key drops the connection)
//   3 ADD         key, i64 delta                    -> i64 new value (stored as decimal text)
//   4 CHECK       u64 n, n keys                     -> u8 0 READY / 1 NOT_READY
//   5 WAIT        u64 n, n keys                     -> u8 0 STOP_WAITING once all keys exist
//   6 GETNUMKEYS                                    -> i64
//   7 WATCH_KEY   key                               -> u8 3 KEY_CALLBACK_REGISTERED, then per
//   change
//                                                      u8 type (0 UPDATED 1 CREATED 2 DELETED
//                                                      4 APPENDED), string key, bytes old, bytes
//                                                      new
//   8 DELETE_KEY  key                               -> i64 number deleted
// Newer queries, numbered as the PyTorch 2.x releases that added them (WATCH_KEY still 7).
// PyTorch 1.13 never sends them: its wait timeout is a socket receive timeout.
//   9 APPEND      key, data                         -> (nothing)
//  10 MULTI_GET   u64 n, n keys                     -> n bytes (a missing key drops the connection)
//  11 MULTI_SET   u64 n, n (key, data)              -> (nothing)
//  12 CANCEL_WAIT                                   -> u8 1 WAIT_CANCELED (a STOP_WAITING may
//                                                      precede it if the keys had just arrived)
// PyTorch's client puts "/" in front of every key; StoreClient does the same, so a key
// written by a Python worker through TCPStore reads back here under the same name.
//
// dtrain's own query (v2 numbering only; PyTorch never sends it):
// 215 AUTH     token                              -> u8 0 ACCEPTED / 1 WRONG_TOKEN /
//                                                    2 NO_TOKEN_HERE (then the server closes)
// A server started with a token (StoreServer::Options::token) serves a connection only once it
// sent AUTH with that token: before that, anything but VALIDATE and AUTH closes it (named on
// stderr, like a client of neither protocol), and a request longer than 4 KiB is refused, so
// a stranger can neither read, write nor wait on a key, nor make the server buffer its bytes.
// PyTorch's own clients cannot send AUTH: a protected store serves dtrain's clients only
// (docs/security.md says what that means for jobs with Python workers).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/error.h"

namespace dtrain::store {

// The store refused this client's token, or this client has a token and the store none.
class StoreAuthError : public StoreError {
 public:
  using StoreError::StoreError;
};

// Serves the protocol above on one background thread (an epoll loop over non-blocking
// sockets), until destroyed. Thousands of connections are fine: a request costs the same
// whether 10 or 10,000 others are idle, and a slow client delays nobody else.
// Thread-safe: port() may be called from any thread; the data lives on the server thread.
class StoreServer {
 public:
  struct Options {
    // Address to bind; empty means every interface (IPv6 dual-stack, else IPv4).
    std::string bind_host = "";
    // Port to bind; 0 picks a free one (read it back with port()). Default: 0.
    std::uint16_t port = 0;
    // A client that has part of a request buffered, or a reply it does not read, and moves
    // no byte for this long is dropped. A large value over a slow link is fine as long as
    // bytes keep moving; other clients are served meanwhile. Default: 10 s.
    std::chrono::milliseconds stall_timeout{10000};
    // Non-empty: only clients that send this token (StoreClient::Options::token) are served;
    // see AUTH above. Default: empty (any client, as c10d's TCPStore).
    std::string token;
    // Told (one line: the peer and what it sent) when a client speaks neither protocol, or
    // lacks the token, and its connection is closed; at most 20 lines per 10 s, then one that
    // counts the rest. Default (empty): the lines go to stderr.
    std::function<void(const std::string&)> on_protocol_error;
  };

  // Binds, listens and starts serving. The socket is held until destruction, so the port
  // is never released and re-bound (no bind-release-rebind race). Raises the process's soft
  // open-file limit to its hard limit (each client is a file descriptor).
  // Throws AddressInUseError if the port is taken, NetworkError for other socket failures.
  static std::unique_ptr<StoreServer> start(const Options& options);

  virtual ~StoreServer() = default;

  // The bound port (the real one when Options::port was 0).
  virtual std::uint16_t port() const = 0;
};

// A blocking client over one connection. Not thread-safe: one caller at a time
// (use one client per thread).
class StoreClient {
 public:
  struct Options {
    // How long connect() keeps retrying while the server is not up yet. Default: 60 s.
    std::chrono::milliseconds connect_timeout{60000};
    // Default timeout of get() and wait(). Default: 300 s.
    std::chrono::milliseconds timeout{300000};
    // The protocol to speak. automatic: v2's VALIDATE + PING first; a server that drops
    // that or does not answer it within 2 s is reconnected to in v1.
    enum class Protocol { automatic, v1, v2 };
    Protocol protocol = Protocol::automatic;
    // Non-empty: proves this token to the server on connect (v2 only, so `automatic`
    // means v2). Default: empty.
    std::string token;
  };

  // Connects, retrying with a short backoff until connect_timeout.
  // Throws TimeoutError (naming host:port) when the server never answered;
  // StoreAuthError when the server refused the token or has none while this client has one
  // (never retried: a wrong token does not get right by waiting).
  static std::unique_ptr<StoreClient> connect(const std::string& host, std::uint16_t port,
                                              const Options& options);

  virtual ~StoreClient() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits for the key up to the default timeout, then returns its value.
  // Throws TimeoutError naming the key.
  virtual std::string get(const std::string& key) = 0;
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Atomically: if the stored value equals `expected` (or the key is absent and `expected`
  // is empty), store `desired`. Returns the value stored afterwards; c10d's quirk, kept for
  // compatibility: if the key is absent and `expected` is not empty, nothing is stored and
  // `expected` itself comes back.
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;
  // True if every key exists now. Never blocks on the keys.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Blocks until every key exists; false if `timeout` passed first (the connection stays
  // usable: the wait is cancelled on the server). True if the keys arrived as it timed out.
  virtual bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual bool delete_key(const std::string& key) = 0;
  virtual std::int64_t num_keys() = 0;
  // Every key that holds a value, named as this client names keys (queues are not keys).
  // v2 only (LIST_KEYS): throws StoreError on a v1 connection.
  virtual std::vector<std::string> list_keys() = 0;
  // The protocol this connection speaks (v1 or v2, never automatic).
  virtual Options::Protocol protocol() const = 0;
};

// The job's store token a worker inherits from its agent: $DTRAIN_STORE_TOKEN, "" when unset
// (dtrain run --store-token sets it for C++ workers).
std::string job_store_token();

}  // namespace dtrain::store
