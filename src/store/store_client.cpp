// StoreClient: the requests c10d::TCPStore sends, over one blocking connection.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/memory.h"
#include "core/params.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/client_over.h"
#include "store/socket.h"
#include "store/wire.h"

namespace dtrain::store {

namespace {

using Protocol = StoreClient::Options::Protocol;
using wire::Encoder;
using wire::Op;

wire::Protocol on_wire(Protocol p) {
  return p == Protocol::v2 ? wire::Protocol::V2 : wire::Protocol::V1;
}

// c10d::TCPStore prefixes every user key with "/" (its keyPrefix_); doing the same makes
// keys written by PyTorch workers readable here under the names they used.
constexpr std::string_view kKeyPrefix = "/";
std::string wire_key(const std::string& key) { return std::string(kKeyPrefix) + key; }

std::string ms_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

class Client final : public StoreClient {
 public:
  Client(std::string where, const Options& options, net::Socket socket, Protocol protocol)
      : where_(std::move(where)),
        options_(options),
        socket_(std::move(socket)),
        protocol_(protocol) {}

  Protocol protocol() const override { return protocol_; }

  void set(const std::string& key, const std::string& value) override {
    io("set", [&] { send(request(Op::SET).bytes(wire_key(key)).bytes(value)); });
  }

  std::string get(const std::string& key) override {
    if (!wait({key}, options_.timeout)) {
      throw TimeoutError("store key '" + key + "' did not appear within " +
                         ms_text(options_.timeout) + " (store at " + where_ +
                         "); the process that should set it may have failed or not started");
    }
    return io("get", [&] {
      send(request(Op::GET).bytes(wire_key(key)));
      return recv_bytes();
    });
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return io("add", [&] {
      send(request(Op::ADD).bytes(wire_key(key)).value(delta));
      return recv_value<std::int64_t>();
    });
  }

  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    return io("compare_set", [&] {
      send(request(Op::COMPARE_SET).bytes(wire_key(key)).bytes(expected).bytes(desired));
      return recv_bytes();
    });
  }

  bool check(const std::vector<std::string>& keys) override {
    return io("check", [&] {
      send(request(Op::CHECK).keys(keys, kKeyPrefix));
      auto reply = recv_value<std::uint8_t>();
      if (reply != wire::kReady && reply != wire::kNotReady) unexpected("CHECK", reply);
      return reply == wire::kReady;
    });
  }

  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    return io("wait", [&] {
      send(request(Op::WAIT).keys(keys, kKeyPrefix));
      if (net::wait_readable(socket_.fd(), net::deadline_after(timeout))) {
        auto reply = recv_value<std::uint8_t>();
        if (reply != wire::kStopWaiting) unexpected("WAIT", reply);
        return true;
      }
      // Withdraw the wait so the connection stays in step. The keys may have arrived just
      // before the server saw the cancel: then STOP_WAITING comes first, and they exist.
      send(request(Op::CANCEL_WAIT));
      auto reply = recv_value<std::uint8_t>();
      bool arrived = reply == wire::kStopWaiting;
      if (arrived) reply = recv_value<std::uint8_t>();
      if (reply != wire::kWaitCanceled) unexpected("CANCEL_WAIT", reply);
      return arrived;
    });
  }

  bool delete_key(const std::string& key) override {
    return io("delete_key", [&] {
      send(request(Op::DELETE_KEY).bytes(wire_key(key)));
      return recv_value<std::int64_t>() == 1;
    });
  }

  std::vector<std::string> list_keys() override {
    if (protocol_ != Protocol::v2) {
      throw StoreError("the store at " + where_ +
                       " speaks TCPStore v1, which cannot list its keys (LIST_KEYS is v2's)");
    }
    return io("list_keys", [&] {
      send(request(Op::LIST_KEYS));
      const auto n = recv_value<std::int64_t>();
      if (n < 0) unexpected("LIST_KEYS", 0);
      std::vector<std::string> keys;
      for (std::int64_t i = 0; i < n; ++i) {
        std::string k = recv_bytes();
        // A key named without c10d's "/" (a raw protocol client) has no name here; skipped.
        if (!k.empty() && k[0] == '/') keys.push_back(k.substr(1));
      }
      return keys;
    });
  }

  std::int64_t num_keys() override {
    return io("num_keys", [&] {
      send(request(Op::GETNUMKEYS));
      return recv_value<std::int64_t>();
    });
  }

 private:
  Encoder request(Op op) {
    Encoder e;
    e.value(wire::code_of(on_wire(protocol_), op));
    return e;
  }

  // Runs one exchange. Any transport or protocol failure leaves the stream at an unknown
  // position, so the connection is closed and every later call fails fast.
  template <typename F>
  auto io(const char* op, F&& exchange) -> decltype(exchange()) {
    if (!socket_.valid()) {
      throw NetworkError("the store connection to " + where_ +
                         " failed earlier; this client can no longer be used");
    }
    bool first = first_;
    first_ = false;
    try {
      return exchange();
    } catch (const TimeoutError& e) {
      socket_.close();
      throw TimeoutError("the store at " + where_ + " did not answer " + op + " within " +
                         ms_text(options_.timeout) + " (" + e.what() + ")");
    } catch (const NetworkError& e) {
      socket_.close();
      // A store that requires a token closes a client without one at its first request.
      std::string hint = first && options_.token.empty()
                             ? "; or it serves only clients with the job's store token, which "
                               "this process lacks (set DTRAIN_STORE_TOKEN as the job does)"
                             : "";
      throw NetworkError("the store at " + where_ + " went away during " + op + " (" + e.what() +
                         "); the process hosting it (the agent) probably exited" + hint);
    } catch (const StoreError&) {
      socket_.close();
      throw;
    }
  }

  [[noreturn]] void unexpected(const char* request, std::uint8_t reply) {
    throw StoreError("the store at " + where_ + " answered " + request + " with unexpected code " +
                     std::to_string(reply) + "; is it a PyTorch-compatible TCPStore?");
  }

  net::Deadline reply_deadline() const { return net::deadline_after(options_.timeout); }

  // Request and reply bodies may be large: they fail when bytes stop moving for the
  // timeout, not when the whole transfer takes longer.
  void send(const Encoder& r) {
    net::send_all(socket_.fd(), r.str().data(), r.str().size(), net::Stall{options_.timeout});
  }

  template <typename T>
  T recv_value() {
    T v{};
    net::recv_all(socket_.fd(), &v, sizeof(v), reply_deadline());
    return v;
  }

  // The length comes from the server: memory grows with the bytes that actually arrive, so
  // a confused (or hostile) server announcing 2^63 bytes cannot make us allocate them.
  std::string recv_bytes() {
    std::uint64_t n = 0;
    net::recv_all(socket_.fd(), &n, sizeof(n), reply_deadline());
    constexpr std::uint64_t kFirst = std::uint64_t{64} << 10;
    std::string s = detail::large_string(static_cast<std::size_t>(std::min(n, kFirst)));
    std::size_t at = 0;
    for (;;) {
      net::recv_all(socket_.fd(), s.data() + at, s.size() - at, net::Stall{options_.timeout});
      at = s.size();
      if (at == n) return s;
      std::size_t next = static_cast<std::size_t>(std::min<std::uint64_t>(n, 4 * at));
      s.reserve(next);
      detail::advise_huge_pages(s.data(), s.capacity());
      s.resize(next);
    }
  }

  std::string where_;
  Options options_;
  net::Socket socket_;
  Protocol protocol_;
  bool first_ = true;
};

// v2's opening: VALIDATE, AUTH if we have a token, then PING with a nonce the server must
// echo. True if it did within `limit`; false if the server closed the connection or stayed
// silent (a v1 server reads the bytes as the start of a SET with an absurd key length and
// drops or waits). Throws StoreAuthError when the server answered AUTH with a refusal.
bool handshake_v2(int fd, const std::string& token, const std::string& where,
                  std::chrono::milliseconds limit) {
  auto nonce = static_cast<std::uint32_t>(::getpid());
  Encoder hello;
  hello.value(wire::code_of(wire::Protocol::V2, Op::VALIDATE)).value(wire::kValidationMagic);
  if (!token.empty()) hello.value(wire::kAuthCode).bytes(token);
  hello.value(wire::code_of(wire::Protocol::V2, Op::PING)).value(nonce);
  auto deadline = net::deadline_after(limit);
  std::uint8_t auth = wire::kAuthAccepted;
  try {
    net::send_all(fd, hello.str().data(), hello.str().size(), deadline);
    if (!token.empty()) net::recv_all(fd, &auth, sizeof(auth), deadline);
  } catch (const TimeoutError&) {
    if (!token.empty()) {
      throw StoreAuthError("the store at " + where + " did not answer this process's store token " +
                           "within " + ms_text(limit) +
                           "; is it a dtrain store (PyTorch's own TCPStore cannot check a "
                           "token)? Start it with dtrain, or drop DTRAIN_STORE_TOKEN here");
    }
    return false;
  } catch (const NetworkError&) {
    if (!token.empty()) {
      throw StoreAuthError("the store at " + where +
                           " closed the connection when this process "
                           "sent its store token; is it a dtrain store (PyTorch's own TCPStore "
                           "cannot check a token)? Start it with dtrain, or drop "
                           "DTRAIN_STORE_TOKEN here");
    }
    return false;
  }
  if (auth == wire::kAuthWrongToken) {
    throw StoreAuthError("the store at " + where +
                         " refused this process's store token: it was "
                         "started with a different one. Give every agent and worker of the job "
                         "the same --store-token / DTRAIN_STORE_TOKEN");
  }
  if (auth == wire::kAuthNoTokenHere) {
    throw StoreAuthError("the store at " + where +
                         " was started without a store token, but "
                         "this process has one (--store-token / DTRAIN_STORE_TOKEN): either "
                         "start the job's store with the same token or drop it here");
  }
  if (auth != wire::kAuthAccepted) {
    throw StoreAuthError("the store at " + where + " answered the store token with unknown code " +
                         std::to_string(auth) + "; is it a dtrain store?");
  }
  try {
    std::uint32_t echo = 0;
    net::recv_all(fd, &echo, sizeof(echo), deadline);
    return echo == nonce;
  } catch (const TimeoutError&) {
    return false;
  } catch (const NetworkError&) {
    return false;
  }
}

}  // namespace

std::string job_store_token() { return param::kStoreToken.get(); }

std::unique_ptr<StoreClient> client_over(net::Socket socket, std::string where,
                                         const StoreClient::Options& options, Protocol protocol) {
  return std::make_unique<Client>(std::move(where), options, std::move(socket), protocol);
}

std::unique_ptr<StoreClient> StoreClient::connect(const std::string& host, std::uint16_t port,
                                                  const Options& options) {
  std::string where = host + ":" + std::to_string(port);
  auto deadline = net::deadline_after(options.connect_timeout);
  auto socket = net::connect(host, port, deadline);
  if (options.protocol == Protocol::v1) {
    if (!options.token.empty()) {
      throw UsageError("StoreClient: a store token needs the v2 protocol (Protocol::v1 given)");
    }
    return client_over(std::move(socket), where, options, Protocol::v1);
  }
  bool v2_only = options.protocol == Protocol::v2 || !options.token.empty();
  auto limit = v2_only ? options.connect_timeout : std::chrono::milliseconds(2000);
  if (handshake_v2(socket.fd(), options.token, where, limit)) {
    return client_over(std::move(socket), where, options, Protocol::v2);
  }
  if (v2_only) {
    throw StoreError("the store at " + where +
                     " did not answer the TCPStore v2 handshake "
                     "(VALIDATE + PING); is it a PyTorch 2.x-compatible TCPStore?");
  }
  socket.close();
  socket = net::connect(host, port, deadline);
  return client_over(std::move(socket), where, options, Protocol::v1);
}

}  // namespace dtrain::store
