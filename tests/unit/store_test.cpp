// StoreServer + StoreClient over loopback: threads play the clients.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "dtrain/error.h"
#include "dtrain/store.h"
#include "launch/worker_keys.h"
#include "store/socket.h"

namespace dtrain::store {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<StoreServer> start_server() { return StoreServer::start({}); }

std::unique_ptr<StoreClient> connect(const StoreServer& server,
                                     std::chrono::milliseconds timeout = 10s) {
  StoreClient::Options options;
  options.connect_timeout = 5s;
  options.timeout = timeout;
  return StoreClient::connect("127.0.0.1", server.port(), options);
}

// Speaks the wire protocol by hand, to check the bytes themselves (and to misbehave).
class RawClient {
 public:
  explicit RawClient(std::uint16_t port)
      : socket_(net::connect("127.0.0.1", port, net::deadline_after(5s))) {}

  RawClient& u8(std::uint8_t v) { return put(v); }
  RawClient& u32(std::uint32_t v) { return put(v); }
  RawClient& u64(std::uint64_t v) { return put(v); }
  RawClient& str(const std::string& s) {
    u64(s.size());
    out_ += s;
    return *this;
  }
  RawClient& raw(const std::string& bytes) {
    out_ += bytes;
    return *this;
  }
  void send() {
    net::send_all(socket_.fd(), out_.data(), out_.size(), net::deadline_after(5s));
    out_.clear();
  }
  template <typename T>
  T recv() {
    T v{};
    net::recv_all(socket_.fd(), &v, sizeof(v), net::deadline_after(5s));
    return v;
  }
  std::string recv_str() {
    std::string s(recv<std::uint64_t>(), '\0');
    net::recv_all(socket_.fd(), s.data(), s.size(), net::deadline_after(5s));
    return s;
  }
  void close() { socket_.close(); }

 private:
  template <typename T>
  RawClient& put(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  net::Socket socket_;
  std::string out_;
};

TEST(StoreTest, SetThenGetReturnsTheValueIncludingBinaryBytes) {
  auto server = start_server();
  auto client = connect(*server);
  client->set("a", "1");
  const std::string binary("x\0y\xff", 4);
  client->set("bin", binary);
  EXPECT_EQ(client->get("a"), "1");
  EXPECT_EQ(client->get("bin"), binary);
  client->set("a", "2");
  EXPECT_EQ(client->get("a"), "2");
  // Another connection sees the same data.
  EXPECT_EQ(connect(*server)->get("a"), "2");
}

TEST(StoreTest, KeysGoOnTheWireWithPyTorchsSlashPrefix) {
  auto server = start_server();
  auto client = connect(*server);
  client->set("k", "v");
  RawClient raw(server->port());
  raw.u8(2 /*GET*/).str("/k").send();
  EXPECT_EQ(raw.recv_str(), "v");
  raw.u8(0 /*SET*/).str("/from_raw").str("hello").send();
  EXPECT_EQ(client->get("from_raw"), "hello");
}

TEST(StoreTest, AddFromEightThreadsCountsEveryIncrement) {
  auto server = start_server();
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      auto client = connect(*server);
      for (int i = 0; i < 100; ++i) client->add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  auto client = connect(*server);
  EXPECT_EQ(client->add("counter", 0), 800);
  EXPECT_EQ(client->get("counter"), "800");  // stored as decimal text, as c10d does
  EXPECT_EQ(client->add("counter", -1000), -200);
}

TEST(StoreTest, CompareSetFollowsC10dSemantics) {
  auto server = start_server();
  auto client = connect(*server);
  // Missing key + non-empty expected: nothing stored, `expected` echoed back.
  EXPECT_EQ(client->compare_set("k", "old", "new"), "old");
  EXPECT_FALSE(client->check({"k"}));
  // Missing key + empty expected: created.
  EXPECT_EQ(client->compare_set("k", "", "first"), "first");
  // Mismatch: unchanged, current value returned.
  EXPECT_EQ(client->compare_set("k", "wrong", "second"), "first");
  // Match: swapped.
  EXPECT_EQ(client->compare_set("k", "first", "second"), "second");
  EXPECT_EQ(client->get("k"), "second");
}

TEST(StoreTest, CheckNeverBlocksAndNeedsEveryKey) {
  auto server = start_server();
  auto client = connect(*server);
  EXPECT_FALSE(client->check({"x"}));
  client->set("x", "1");
  EXPECT_TRUE(client->check({"x"}));
  EXPECT_FALSE(client->check({"x", "y"}));
  EXPECT_TRUE(client->check({}));
}

TEST(StoreTest, WaitWakesWhenAnotherThreadSetsTheKeys) {
  auto server = start_server();
  auto waiter = connect(*server);
  auto done = std::async(std::launch::async, [&] { return waiter->wait({"a", "b"}, 10s); });
  EXPECT_EQ(done.wait_for(100ms), std::future_status::timeout) << "wait returned before the keys";
  auto setter = connect(*server);
  setter->set("a", "1");
  EXPECT_EQ(done.wait_for(100ms), std::future_status::timeout) << "wait needs both keys";
  setter->add("b", 1);
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(done.get());
  EXPECT_TRUE(waiter->wait({"a", "b"}, 0ms));  // already there: immediate
}

TEST(StoreTest, WaitTimeoutReturnsFalseAndLeavesTheConnectionUsable) {
  auto server = start_server();
  auto client = connect(*server);
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(client->wait({"never"}, 200ms));
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, 200ms);
  EXPECT_LT(elapsed, 2s);
  // The wait was cancelled on the server: setting the key now must not send this
  // connection a stray STOP_WAITING that would corrupt the next reply.
  connect(*server)->set("never", "now");
  EXPECT_EQ(client->add("n", 5), 5);
  EXPECT_EQ(client->num_keys(), 2);
  EXPECT_EQ(client->get("never"), "now");
}

TEST(StoreTest, GetOfAMissingKeyTimesOutNamingTheKey) {
  auto server = start_server();
  auto client = connect(*server, 200ms);
  try {
    client->get("missing_key");
    FAIL() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("missing_key"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("200 ms"), std::string::npos) << e.what();
  }
  client->set("missing_key", "here");
  EXPECT_EQ(client->get("missing_key"), "here");
}

TEST(StoreTest, DeleteKeyAndNumKeys) {
  auto server = start_server();
  auto client = connect(*server);
  EXPECT_EQ(client->num_keys(), 0);
  client->set("a", "1");
  client->set("b", "2");
  EXPECT_EQ(client->num_keys(), 2);
  EXPECT_TRUE(client->delete_key("a"));
  EXPECT_FALSE(client->delete_key("a"));
  EXPECT_EQ(client->num_keys(), 1);
  EXPECT_FALSE(client->check({"a"}));
}

TEST(StoreTest, WatchKeySendsC10dUpdates) {
  auto server = start_server();
  RawClient watcher(server->port());
  watcher.u8(7 /*WATCH_KEY*/).str("/w").send();
  EXPECT_EQ(watcher.recv<std::uint8_t>(), 3);  // KEY_CALLBACK_REGISTERED
  auto client = connect(*server);
  auto expect_update = [&](std::uint8_t type, const std::string& old_value,
                           const std::string& new_value) {
    EXPECT_EQ(watcher.recv<std::uint8_t>(), type);
    EXPECT_EQ(watcher.recv_str(), "/w");
    EXPECT_EQ(watcher.recv_str(), old_value);
    EXPECT_EQ(watcher.recv_str(), new_value);
  };
  client->set("w", "v1");
  expect_update(1 /*KEY_CREATED*/, "", "v1");
  client->set("w", "v2");
  expect_update(0 /*KEY_UPDATED*/, "v1", "v2");
  client->delete_key("w");
  expect_update(2 /*KEY_DELETED*/, "v2", "");
  // A watcher that vanishes is forgotten; updates keep working for everyone else.
  watcher.close();
  client->set("w", "v3");
  EXPECT_EQ(client->get("w"), "v3");
}

TEST(StoreTest, NewerQueriesAppendMultiGetMultiSetAndCancelWait) {
  auto server = start_server();
  RawClient raw(server->port());
  raw.u8(11 /*MULTI_SET*/).u64(2).str("/m1").str("a").str("/m2").str("b").send();
  raw.u8(9 /*APPEND*/).str("/m1").str("c").send();
  raw.u8(10 /*MULTI_GET*/).u64(2).str("/m1").str("/m2").send();
  EXPECT_EQ(raw.recv_str(), "ac");
  EXPECT_EQ(raw.recv_str(), "b");
  raw.u8(5 /*WAIT*/).u64(1).str("/absent").send();
  raw.u8(12 /*CANCEL_WAIT*/).send();
  EXPECT_EQ(raw.recv<std::uint8_t>(), 1);  // WAIT_CANCELED
}

// PyTorch 2.x's protocol (v2), byte for byte as its client sends it: VALIDATE + magic, PING,
// the renumbered queries, queues and LIST_KEYS.
TEST(StoreTest, ProtocolV2HandshakeRenumberedQueriesAndQueues) {
  auto server = start_server();
  RawClient v2(server->port());
  v2.u8(0 /*VALIDATE*/).u32(0x3C85F7CE).u8(13 /*PING*/).u32(0xABCD1234).send();
  EXPECT_EQ(v2.recv<std::uint32_t>(), 0xABCD1234u);
  v2.u8(1 /*SET*/).str("/k").str("v").send();
  v2.u8(3 /*GET*/).str("/k").send();
  EXPECT_EQ(v2.recv_str(), "v");
  v2.u8(3 /*GET*/).str("/missing").send();  // 2.x's daemon answers an empty value
  EXPECT_EQ(v2.recv_str(), "");
  v2.u8(4 /*ADD*/).str("/n").u64(5).send();
  EXPECT_EQ(v2.recv<std::int64_t>(), 5);
  v2.u8(2 /*COMPARE_SET*/).str("/k").str("v").str("w").send();
  EXPECT_EQ(v2.recv_str(), "w");
  v2.u8(5 /*CHECK*/).u64(2).str("/k").str("/n").send();
  EXPECT_EQ(v2.recv<std::uint8_t>(), 0);  // READY
  v2.u8(7 /*GETNUMKEYS*/).send();
  EXPECT_EQ(v2.recv<std::int64_t>(), 2);
  v2.u8(17 /*LIST_KEYS*/).send();
  ASSERT_EQ(v2.recv<std::int64_t>(), 2);
  std::set<std::string> keys{v2.recv_str(), v2.recv_str()};
  EXPECT_EQ(keys, (std::set<std::string>{"/k", "/n"}));

  // A WAIT on a queue's name is woken by QUEUE_PUSH (one waiter per item); QUEUE_POP answers
  // the length before the pop, then the item.
  RawClient waiter(server->port());
  waiter.u8(0).u32(0x3C85F7CE).u8(6 /*WAIT*/).u64(1).str("/q").send();
  v2.u8(16 /*QUEUE_LEN*/).str("/q").send();
  EXPECT_EQ(v2.recv<std::int64_t>(), 0);
  v2.u8(14 /*QUEUE_PUSH*/).str("/q").str("item1").u8(14).str("/q").str("item2").send();
  EXPECT_EQ(waiter.recv<std::uint8_t>(), 0);  // STOP_WAITING
  // The waiter wakes on item1 and runs on its own connection: wait until item2 is in as well
  // (QUEUE_PUSH has no reply; a QUEUE_LEN on the pushing connection orders after both).
  v2.u8(16 /*QUEUE_LEN*/).str("/q").send();
  EXPECT_EQ(v2.recv<std::int64_t>(), 2);
  waiter.u8(15 /*QUEUE_POP*/).str("/q").send();
  EXPECT_EQ(waiter.recv<std::int64_t>(), 2);
  EXPECT_EQ(waiter.recv_str(), "item1");
  v2.u8(16 /*QUEUE_LEN*/).str("/q").send();
  EXPECT_EQ(v2.recv<std::int64_t>(), 1);
  v2.u8(8 /*DELETE_KEY*/).str("/k").send();
  EXPECT_EQ(v2.recv<std::int64_t>(), 1);
}

// StoreClient negotiates v2 with our server; a v1 client (forced, as PyTorch 1.x speaks)
// shares the same keys.
TEST(StoreTest, ListKeysNamesEveryKeyAsTheClientNamesIt) {
  auto server = start_server();
  auto client = connect(*server);
  EXPECT_TRUE(client->list_keys().empty());
  client->set("a", "1");
  client->add("/dtrain/job/round_0/order", 1);
  client->set("", "empty name");
  auto keys = client->list_keys();
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()),
            (std::set<std::string>{"a", "/dtrain/job/round_0/order", ""}));
  StoreClient::Options options;
  options.connect_timeout = 5s;
  options.timeout = 5s;
  options.protocol = StoreClient::Options::Protocol::v1;
  EXPECT_THROW(StoreClient::connect("127.0.0.1", server->port(), options)->list_keys(),
               dtrain::StoreError);
}

// Between two attempts the launcher deletes the workers' keys and keeps its own.
TEST(StoreTest, ClearWorkerKeysKeepsOnlyTheAgentsNamespace) {
  auto server = start_server();
  auto client = connect(*server);
  const std::string agents = dtrain::launch::agents_key_prefix() + "job/round_0/node_0";
  client->set(agents, "info");
  client->set("rank_0", "gloo address");       // PyTorch 2.x env:// (no prefix)
  client->set("/worker/attempt_0/x", "1.13");  // PyTorch 1.13 / dtrain C++ workers
  client->add("init/", 2);
  EXPECT_EQ(dtrain::launch::clear_worker_keys(*client), 3);
  EXPECT_EQ(client->list_keys(), std::vector<std::string>{agents});
  EXPECT_EQ(client->get(agents), "info");
}

TEST(StoreTest, V1AndV2ClientsShareOneStore) {
  auto server = start_server();
  auto v2 = connect(*server);
  EXPECT_EQ(v2->protocol(), StoreClient::Options::Protocol::v2);
  StoreClient::Options options;
  options.connect_timeout = 5s;
  options.timeout = 5s;
  options.protocol = StoreClient::Options::Protocol::v1;
  auto v1 = StoreClient::connect("127.0.0.1", server->port(), options);
  EXPECT_EQ(v1->protocol(), StoreClient::Options::Protocol::v1);
  v1->set("from_v1", "a");
  v2->set("from_v2", "b");
  EXPECT_EQ(v2->get("from_v1"), "a");
  EXPECT_EQ(v1->get("from_v2"), "b");
  EXPECT_EQ(v1->add("n", 1) + v2->add("n", 1), 3);
  EXPECT_FALSE(v2->wait({"never"}, 50ms));
  EXPECT_EQ(v1->num_keys(), v2->num_keys());
}

// A client speaking neither protocol is closed at once (it fails now, not after its retry
// budget) and the server names it and what it sent.
TEST(StoreTest, AClientOfAnUnknownProtocolIsClosedAtOnceAndNamed) {
  std::mutex mutex;
  std::vector<std::string> errors;
  StoreServer::Options options;
  options.on_protocol_error = [&](const std::string& line) {
    std::lock_guard lock(mutex);
    errors.push_back(line);
  };
  auto server = StoreServer::start(options);
  RawClient stranger(server->port());
  stranger.u8(0xEE).u64(0).send();
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(stranger.recv<std::uint8_t>(), net::ConnectionClosed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  RawClient newer(server->port());
  newer.u8(0).u32(0x3C85F7CE).u8(99).send();  // validated v2, then a request v2 lacks
  EXPECT_THROW(newer.recv<std::uint8_t>(), net::ConnectionClosed);
  EXPECT_EQ(connect(*server)->add("still_serving", 1), 1);
  std::lock_guard lock(mutex);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find("127.0.0.1:"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("type 238"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("neither"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("type 99"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("PyTorch 2.x (v2)"), std::string::npos) << errors[1];
}

TEST(StoreTest, PortZeroBindsARealPort) {
  auto server = start_server();
  EXPECT_NE(server->port(), 0);
  StoreServer::Options options;
  options.bind_host = "127.0.0.1";
  auto ipv4 = StoreServer::start(options);
  EXPECT_NE(ipv4->port(), 0);
  connect(*ipv4)->set("k", "v");
  // The dual-stack default also accepts "localhost", whichever family it resolves to.
  StoreClient::Options client_options;
  client_options.connect_timeout = 5s;
  EXPECT_EQ(StoreClient::connect("localhost", server->port(), client_options)->num_keys(), 0);
}

TEST(StoreTest, BindingAPortAlreadyHeldThrowsAddressInUse) {
  auto server = start_server();
  for (std::string host : {"", "127.0.0.1"}) {
    StoreServer::Options options;
    options.bind_host = host;
    options.port = server->port();
    try {
      StoreServer::start(options);
      FAIL() << "second bind of port " << server->port() << " on '" << host << "' succeeded";
    } catch (const AddressInUseError& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(server->port())), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("--master-port"), std::string::npos) << e.what();
    }
  }
}

TEST(StoreTest, ConnectToNothingTimesOutNamingHostAndPort) {
  std::uint16_t port = start_server()->port();  // released at once: nobody listens there
  StoreClient::Options options;
  options.connect_timeout = 200ms;
  auto start = std::chrono::steady_clock::now();
  try {
    StoreClient::connect("127.0.0.1", port, options);
    FAIL() << "connected to a closed port";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(StoreTest, GarbageAndHalfRequestsDoNotDisturbOtherClients) {
  auto server = start_server();
  auto good = connect(*server);
  good->set("k", "v");
  auto waiter = connect(*server);
  auto woke = std::async(std::launch::async, [&] { return waiter->wait({"later"}, 10s); });

  RawClient garbage(server->port());
  garbage.u8('G').u8('E').u8('T').u8(' ').u8('/').send();  // unknown query type 71
  RawClient half(server->port());
  half.u8(0 /*SET*/).u64(1000).u8('x').send();  // promises 1000 bytes, sends 1, leaves
  RawClient huge(server->port());
  huge.u8(0 /*SET*/).u64(~0ull).send();  // absurd length must not be allocated up front
  RawClient missing(server->port());
  missing.u8(2 /*GET*/).str("/nope").send();  // c10d drops a GET of a missing key
  half.close();
  huge.close();

  EXPECT_EQ(good->get("k"), "v");
  EXPECT_EQ(connect(*server)->add("c", 2), 2);
  good->set("later", "1");
  ASSERT_EQ(woke.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(woke.get());
  // The server hung up on the misbehaving ones.
  EXPECT_THROW(garbage.recv<std::uint8_t>(), net::ConnectionClosed);
  EXPECT_THROW(missing.recv<std::uint8_t>(), net::ConnectionClosed);
}

// Server-side connections on `port` in CLOSE-WAIT (the client closed, the server did not):
// /proc/net/tcp's state 08.
int close_wait_on(std::uint16_t port) {
  int n = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      auto colon = local.rfind(':');
      if (colon != std::string::npos && std::stoul(local.substr(colon + 1), nullptr, 16) == port &&
          state == "08")
        ++n;
    }
  }
  return n;
}

TEST(StoreTest, AClientThatSendsItsLastRequestAndExitsIsClosed) {
  // The request and the FIN arrive together: edge-triggered epoll reports them once, and the
  // server must read on to the EOF (a worker's last SET before it exits, in every job).
  auto server = start_server();
  constexpr int kClients = 200;
  for (int i = 0; i < kClients; ++i) {
    RawClient last(server->port());
    last.u8(0 /*SET*/).str("/last" + std::to_string(i)).str("v").send();
    last.close();
  }
  auto client = connect(*server);
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (client->num_keys() < kClients && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(client->num_keys(), kClients);  // every last request was served
  int stuck = close_wait_on(server->port());
  while (stuck > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    stuck = close_wait_on(server->port());
  }
  EXPECT_EQ(stuck, 0) << "connections left in CLOSE-WAIT: the server never saw their EOF";
}

TEST(StoreTest, ASlowButMovingRequestIsServedAndAStalledOneIsDropped) {
  StoreServer::Options options;
  options.stall_timeout = 400ms;
  auto server = StoreServer::start(options);
  // 256 KiB in 8 pieces, 200 ms apart: 1.4 s in all, far past the stall timeout, but bytes
  // never stop moving for longer than 200 ms.
  const std::string value(256 << 10, 'v');
  RawClient slow(server->port());
  slow.u8(0 /*SET*/).str("/big").u64(value.size()).send();
  for (size_t i = 0; i < 8; ++i) {
    std::this_thread::sleep_for(200ms);
    slow.raw(value.substr(i * value.size() / 8, value.size() / 8)).send();
  }
  EXPECT_EQ(connect(*server)->get("big"), value);

  RawClient stalled(server->port());
  stalled.u8(0 /*SET*/).str("/k").u64(1000).u8('x').send();  // then nothing for 1 s
  std::this_thread::sleep_for(1s);
  EXPECT_THROW(stalled.recv<std::uint8_t>(), net::ConnectionClosed);
  auto other = connect(*server);
  other->set("k", "fine");
  EXPECT_EQ(other->get("k"), "fine");
}

TEST(StoreTest, DestroyingTheServerFailsWaitingClientsInsteadOfHanging) {
  auto server = start_server();
  auto client = connect(*server, 60s);
  auto pending = std::async(std::launch::async, [&] { return client->get("never"); });
  EXPECT_EQ(pending.wait_for(100ms), std::future_status::timeout);
  server.reset();
  ASSERT_EQ(pending.wait_for(5s), std::future_status::ready) << "client hung after server exit";
  try {
    pending.get();
    FAIL() << "get returned after the server went away";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("went away"), std::string::npos) << e.what();
  }
  // Later calls fail fast too.
  EXPECT_THROW(client->num_keys(), NetworkError);
}

// --- the store token ------------------------------------------------------------------

struct ProtectedStore {
  std::mutex mutex;
  std::vector<std::string> refusals;
  std::unique_ptr<StoreServer> server;

  ProtectedStore() {
    StoreServer::Options options;
    options.bind_host = "127.0.0.1";
    options.token = "job-secret";
    options.on_protocol_error = [this](const std::string& line) {
      std::lock_guard lock(mutex);
      refusals.push_back(line);
    };
    server = StoreServer::start(options);
  }
  std::unique_ptr<StoreClient> member() {
    StoreClient::Options options;
    options.connect_timeout = 5s;
    options.timeout = 5s;
    options.token = "job-secret";
    return StoreClient::connect("127.0.0.1", server->port(), options);
  }
  std::size_t refused() {
    std::lock_guard lock(mutex);
    return refusals.size();
  }
};

// Whatever a stranger sends first - a v2 or v1 SET, a GET, a WAIT, a PING, a huge request -
// closes its connection before the server reads or writes a key, and names it.
TEST(StoreTokenTest, AStrangerCannotSetGetOrWaitOnAProtectedStore) {
  ProtectedStore store;
  auto member = store.member();
  member->set("rank0", "10.0.0.1:1234");

  auto refused_at_once = [&](RawClient& stranger) {
    auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(stranger.recv<std::uint8_t>(), net::ConnectionClosed);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  };
  RawClient v2_set(store.server->port());
  v2_set.u8(0).u32(0x3C85F7CE).u8(1 /*SET*/).str("/rank0").str("forged").send();
  refused_at_once(v2_set);
  RawClient v1_set(store.server->port());
  v1_set.u8(0 /*SET*/).str("/rank0").str("forged").send();
  refused_at_once(v1_set);
  RawClient v2_get(store.server->port());
  v2_get.u8(0).u32(0x3C85F7CE).u8(3 /*GET*/).str("/rank0").send();
  refused_at_once(v2_get);
  RawClient v2_wait(store.server->port());
  v2_wait.u8(0).u32(0x3C85F7CE).u8(6 /*WAIT*/).u64(1).str("/later").send();
  refused_at_once(v2_wait);
  RawClient v1_add(store.server->port());
  v1_add.u8(3 /*ADD*/).str("/count").u64(1).send();
  refused_at_once(v1_add);
  RawClient ping(store.server->port());
  ping.u8(0).u32(0x3C85F7CE).u8(13 /*PING*/).u32(7).send();
  refused_at_once(ping);
  // A token-sized request is all a stranger may make the server buffer.
  RawClient huge(store.server->port());
  huge.u8(0).u32(0x3C85F7CE).u8(0xD7 /*AUTH*/).u64(1ull << 30).send();
  refused_at_once(huge);

  EXPECT_EQ(member->get("rank0"), "10.0.0.1:1234");
  EXPECT_FALSE(member->check({"later"}));
  EXPECT_FALSE(member->check({"count"}));
  EXPECT_EQ(member->num_keys(), 1);
  std::lock_guard lock(store.mutex);
  ASSERT_EQ(store.refusals.size(), 7u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_NE(store.refusals[i].find("127.0.0.1:"), std::string::npos) << store.refusals[i];
    EXPECT_NE(store.refusals[i].find("store token"), std::string::npos) << store.refusals[i];
  }
  EXPECT_NE(store.refusals[6].find("4096 bytes"), std::string::npos) << store.refusals[6];
}

TEST(StoreTokenTest, AWrongTokenFailsAtOnceSayingWhatToDo) {
  ProtectedStore store;
  StoreClient::Options options;
  options.connect_timeout = 30s;  // refused long before: a refusal is not retried
  options.token = "guessed";
  auto start = std::chrono::steady_clock::now();
  try {
    StoreClient::connect("127.0.0.1", store.server->port(), options);
    FAIL() << "a client with the wrong token was served";
  } catch (const StoreAuthError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("refused this process's store token"), std::string::npos) << what;
    EXPECT_NE(what.find("--store-token"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(store.refused(), 1u);
  EXPECT_EQ(store.member()->num_keys(), 0);
}

TEST(StoreTokenTest, ATokenAgainstAnOpenStoreAndNoTokenAgainstAProtectedOneAreNamed) {
  auto open = start_server();
  StoreClient::Options options;
  options.connect_timeout = 5s;
  options.token = "job-secret";
  try {
    StoreClient::connect("127.0.0.1", open->port(), options);
    FAIL() << "a token was accepted by a store without one";
  } catch (const StoreAuthError& e) {
    EXPECT_NE(std::string(e.what()).find("started without a store token"), std::string::npos)
        << e.what();
  }

  ProtectedStore store;
  auto tokenless = connect(*store.server, 5s);
  auto start = std::chrono::steady_clock::now();
  try {
    tokenless->add("count", 1);
    FAIL() << "a client without the token was served";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("DTRAIN_STORE_TOKEN"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_FALSE(store.member()->check({"count"}));
}

}  // namespace
}  // namespace dtrain::store
