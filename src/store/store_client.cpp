// StoreClient: the requests c10d::TCPStore sends, over one blocking connection.
#include <unistd.h>

#include <string>
#include <utility>

#include "core/memory.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/socket.h"

namespace dtrain::store {

namespace {

using Protocol = StoreClient::Options::Protocol;

// The requests this client sends, numbered per protocol (store.h has both tables).
enum class Query { SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, CANCEL_WAIT };

std::uint8_t wire_code(Protocol p, Query q) {
  switch (q) {
    case Query::DELETE_KEY:
      return 8;
    case Query::CANCEL_WAIT:
      return 12;
    default: {
      // SET..GETNUMKEYS are 0..6 in v1 and 1..7 in v2 (VALIDATE took 0).
      auto n = static_cast<std::uint8_t>(q);
      return p == Protocol::v2 ? n + 1 : n;
    }
  }
}

constexpr std::uint8_t kValidate = 0, kPing = 13, kListKeys = 17;  // v2 only
constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;
constexpr std::uint8_t kReady = 0, kNotReady = 1;
constexpr std::uint8_t kStopWaiting = 0, kWaitCanceled = 1;

// c10d::TCPStore prefixes every user key with "/" (its keyPrefix_); doing the same makes
// keys written by PyTorch workers readable here under the names they used.
std::string wire_key(const std::string& key) { return "/" + key; }

// One request, sent in a single write like c10d's SendBuffer.
class Request {
 public:
  Request(Protocol p, Query q) { value(wire_code(p, q)); }
  Request() = default;
  template <typename T>
  Request& value(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  Request& bytes(const std::string& s) {
    value<std::uint64_t>(s.size());
    if (s.size() >= (std::size_t{4} << 20)) {
      out_.reserve(out_.size() + s.size());
      detail::advise_huge_pages(out_.data(), out_.capacity());
    }
    out_ += s;
    return *this;
  }
  Request& keys(const std::vector<std::string>& keys) {
    value<std::uint64_t>(keys.size());
    for (const auto& k : keys) bytes(wire_key(k));
    return *this;
  }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

std::string ms_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

class Client final : public StoreClient {
 public:
  Client(const std::string& host, std::uint16_t port, const Options& options, net::Socket socket,
         Protocol protocol)
      : where_(host + ":" + std::to_string(port)),
        options_(options),
        socket_(std::move(socket)),
        protocol_(protocol) {}

  Protocol protocol() const override { return protocol_; }

  void set(const std::string& key, const std::string& value) override {
    io("set", [&] { send(Request(protocol_, Query::SET).bytes(wire_key(key)).bytes(value)); });
  }

  std::string get(const std::string& key) override {
    if (!wait({key}, options_.timeout)) {
      throw TimeoutError("store key '" + key + "' did not appear within " +
                         ms_text(options_.timeout) + " (store at " + where_ +
                         "); the process that should set it may have failed or not started");
    }
    return io("get", [&] {
      send(Request(protocol_, Query::GET).bytes(wire_key(key)));
      return recv_bytes();
    });
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return io("add", [&] {
      send(Request(protocol_, Query::ADD).bytes(wire_key(key)).value(delta));
      return recv_value<std::int64_t>();
    });
  }

  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    return io("compare_set", [&] {
      send(Request(protocol_, Query::COMPARE_SET)
               .bytes(wire_key(key))
               .bytes(expected)
               .bytes(desired));
      return recv_bytes();
    });
  }

  bool check(const std::vector<std::string>& keys) override {
    return io("check", [&] {
      send(Request(protocol_, Query::CHECK).keys(keys));
      auto reply = recv_value<std::uint8_t>();
      if (reply != kReady && reply != kNotReady) unexpected("CHECK", reply);
      return reply == kReady;
    });
  }

  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    return io("wait", [&] {
      send(Request(protocol_, Query::WAIT).keys(keys));
      if (net::wait_readable(socket_.fd(), net::deadline_after(timeout))) {
        auto reply = recv_value<std::uint8_t>();
        if (reply != kStopWaiting) unexpected("WAIT", reply);
        return true;
      }
      // Withdraw the wait so the connection stays in step. The keys may have arrived just
      // before the server saw the cancel: then STOP_WAITING comes first, and they exist.
      send(Request(protocol_, Query::CANCEL_WAIT));
      auto reply = recv_value<std::uint8_t>();
      bool arrived = reply == kStopWaiting;
      if (arrived) reply = recv_value<std::uint8_t>();
      if (reply != kWaitCanceled) unexpected("CANCEL_WAIT", reply);
      return arrived;
    });
  }

  bool delete_key(const std::string& key) override {
    return io("delete_key", [&] {
      send(Request(protocol_, Query::DELETE_KEY).bytes(wire_key(key)));
      return recv_value<std::int64_t>() == 1;
    });
  }

  std::vector<std::string> list_keys() override {
    if (protocol_ != Protocol::v2) {
      throw StoreError("the store at " + where_ +
                       " speaks TCPStore v1, which cannot list its keys (LIST_KEYS is v2's)");
    }
    return io("list_keys", [&] {
      send(Request().value(kListKeys));
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
      send(Request(protocol_, Query::GETNUMKEYS));
      return recv_value<std::int64_t>();
    });
  }

 private:
  // Runs one exchange. Any transport or protocol failure leaves the stream at an unknown
  // position, so the connection is closed and every later call fails fast.
  template <typename F>
  auto io(const char* op, F&& exchange) -> decltype(exchange()) {
    if (!socket_.valid()) {
      throw NetworkError("the store connection to " + where_ +
                         " failed earlier; this client can no longer be used");
    }
    try {
      return exchange();
    } catch (const TimeoutError& e) {
      socket_.close();
      throw TimeoutError("the store at " + where_ + " did not answer " + op + " within " +
                         ms_text(options_.timeout) + " (" + e.what() + ")");
    } catch (const NetworkError& e) {
      socket_.close();
      throw NetworkError("the store at " + where_ + " went away during " + op + " (" + e.what() +
                         "); the process hosting it (the agent) probably exited");
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
  void send(const Request& r) {
    net::send_all(socket_.fd(), r.str().data(), r.str().size(), net::Stall{options_.timeout});
  }

  template <typename T>
  T recv_value() {
    T v{};
    net::recv_all(socket_.fd(), &v, sizeof(v), reply_deadline());
    return v;
  }

  std::string recv_bytes() {
    std::uint64_t n = 0;
    net::recv_all(socket_.fd(), &n, sizeof(n), reply_deadline());
    std::string s = detail::large_string(n);
    net::recv_all(socket_.fd(), s.data(), s.size(), net::Stall{options_.timeout});
    return s;
  }

  std::string where_;
  Options options_;
  net::Socket socket_;
  Protocol protocol_;
};

// v2's opening: VALIDATE, then PING with a nonce the server must echo. True if it did within
// `limit`; false if the server closed the connection or stayed silent (a v1 server reads the
// bytes as the start of a SET with an absurd key length and drops or waits).
bool handshake_v2(int fd, std::chrono::milliseconds limit) {
  auto nonce = static_cast<std::uint32_t>(::getpid());
  Request hello;
  hello.value(kValidate).value(kValidationMagic).value(kPing).value(nonce);
  auto deadline = net::deadline_after(limit);
  try {
    net::send_all(fd, hello.str().data(), hello.str().size(), deadline);
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

std::unique_ptr<StoreClient> StoreClient::connect(const std::string& host, std::uint16_t port,
                                                  const Options& options) {
  auto deadline = net::deadline_after(options.connect_timeout);
  auto socket = net::connect(host, port, deadline);
  if (options.protocol == Protocol::v1) {
    return std::make_unique<Client>(host, port, options, std::move(socket), Protocol::v1);
  }
  auto limit =
      options.protocol == Protocol::v2 ? options.connect_timeout : std::chrono::milliseconds(2000);
  if (handshake_v2(socket.fd(), limit)) {
    return std::make_unique<Client>(host, port, options, std::move(socket), Protocol::v2);
  }
  std::string where = host + ":" + std::to_string(port);
  if (options.protocol == Protocol::v2) {
    throw StoreError("the store at " + where +
                     " did not answer the TCPStore v2 handshake "
                     "(VALIDATE + PING); is it a PyTorch 2.x-compatible TCPStore?");
  }
  socket.close();
  socket = net::connect(host, port, deadline);
  return std::make_unique<Client>(host, port, options, std::move(socket), Protocol::v1);
}

}  // namespace dtrain::store
