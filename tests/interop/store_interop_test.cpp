// Our StoreServer against PyTorch's own clients: c10d::TCPStore from C++ (the libtorch this
// build links: 1.13 speaks protocol v1, 2.x v2), a real ProcessGroupGloo rendezvousing
// through it, and torch.distributed.TCPStore from Python - Debian's PyTorch 1.13 and the
// venv's PyTorch 2.x, in every build (the server needs no libtorch).
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <thread>

#include "comm/c10d_compat.h"
#include "comm/gloo/gloo.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/socket.h"
#include "support/paths.h"

namespace dtrain::store {
namespace {

using namespace std::chrono_literals;

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

c10::intrusive_ptr<c10d::TCPStore> torch_client(std::uint16_t port,
                                                c10::optional<std::size_t> num_workers = {}) {
  c10d::TCPStoreOptions options;
  options.port = port;
  options.isServer = false;
  options.numWorkers = num_workers;
  options.waitWorkers = num_workers.has_value();
  options.timeout = 30s;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

std::unique_ptr<StoreClient> our_client(const StoreServer& server) {
  StoreClient::Options options;
  options.connect_timeout = 5s;
  options.timeout = 30s;
  return StoreClient::connect("127.0.0.1", server.port(), options);
}

// GET of a raw wire key (no "/" prefix), e.g. c10d's "init/" worker counter.
std::string raw_get(std::uint16_t port, const std::string& key) {
  auto socket = net::connect("127.0.0.1", port, net::deadline_after(5s));
  std::string request(1, '\x02');  // GET
  std::uint64_t n = key.size();
  request.append(reinterpret_cast<const char*>(&n), sizeof(n)).append(key);
  net::send_all(socket.fd(), request.data(), request.size(), net::deadline_after(5s));
  net::recv_all(socket.fd(), &n, sizeof(n), net::deadline_after(5s));
  std::string value(n, '\0');
  net::recv_all(socket.fd(), value.data(), n, net::deadline_after(5s));
  return value;
}

TEST(StoreInteropTest, C10dTcpStoreClientWorksAgainstOurServer) {
  auto server = StoreServer::start({});
  auto torch = torch_client(server->port());
  auto ours = our_client(*server);

  torch->set("a", bytes("1"));
  EXPECT_EQ(text(torch->get("a")), "1");
  EXPECT_EQ(ours->get("a"), "1");
  ours->set("b", "from dtrain");
  EXPECT_EQ(text(torch->get("b")), "from dtrain");

  EXPECT_EQ(torch->add("n", 5), 5);
  EXPECT_EQ(ours->add("n", 2), 7);
  EXPECT_EQ(torch->add("n", 0), 7);

  EXPECT_EQ(text(torch->compareSet("cas", bytes(""), bytes("first"))), "first");
  EXPECT_EQ(text(torch->compareSet("cas", bytes("wrong"), bytes("x"))), "first");
  EXPECT_EQ(text(torch->compareSet("cas", bytes("first"), bytes("second"))), "second");
  EXPECT_EQ(ours->get("cas"), "second");

  EXPECT_TRUE(torch->check({"a", "b"}));
  EXPECT_FALSE(torch->check({"a", "nope"}));

  auto waited = std::async(std::launch::async, [&] { torch->wait({"late"}); });
  EXPECT_EQ(waited.wait_for(100ms), std::future_status::timeout);
  ours->set("late", "now");
  ASSERT_EQ(waited.wait_for(10s), std::future_status::ready);
  waited.get();

  EXPECT_EQ(torch->getNumKeys(), ours->num_keys());
  EXPECT_TRUE(torch->deleteKey("a"));
  EXPECT_FALSE(torch->deleteKey("a"));
  EXPECT_FALSE(ours->check({"a"}));
}

TEST(StoreInteropTest, PrefixStoreKeysReadBackUnderTheirFullName) {
  auto server = StoreServer::start({});
  auto prefixed =
      c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_0", torch_client(server->port()));
  prefixed->set("rank0", bytes("hello"));
  EXPECT_EQ(our_client(*server)->get("/worker/attempt_0/rank0"), "hello");
  our_client(*server)->set("/worker/attempt_0/rank1", "back");
  EXPECT_EQ(text(prefixed->get("rank1")), "back");
}

TEST(StoreInteropTest, ClientsWaitingForWorkersAllGetThrough) {
  auto server = StoreServer::start({});
  constexpr std::size_t kWorkers = 4;
  std::vector<std::future<void>> workers;
  for (std::size_t i = 0; i < kWorkers; ++i) {
    workers.push_back(std::async(std::launch::async, [&, i] {
      auto store = torch_client(server->port(), kWorkers);
      store->set("worker" + std::to_string(i), bytes("up"));
    }));
  }
  for (auto& w : workers) {
    ASSERT_EQ(w.wait_for(30s), std::future_status::ready);
    w.get();
  }
  EXPECT_EQ(raw_get(server->port(), "init/"), std::to_string(kWorkers));
  EXPECT_TRUE(our_client(*server)->check({"worker0", "worker1", "worker2", "worker3"}));
}

TEST(StoreInteropTest, ProcessGroupGlooAllreducesOverOurStore) {
  auto server = StoreServer::start({});
  constexpr int kWorldSize = 2;
  std::vector<std::future<at::Tensor>> ranks;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    ranks.push_back(std::async(std::launch::async, [&, rank] {
      auto store = c10::make_intrusive<c10d::PrefixStore>("/pg", torch_client(server->port()));
      auto gloo = comm::make_gloo(store, rank, kWorldSize, 30s, "127.0.0.1");
      auto& pg = *gloo;
      std::vector<at::Tensor> tensors{at::full({4}, static_cast<float>(rank + 1))};
      pg.allreduce(tensors)->wait();
      return tensors[0];
    }));
  }
  for (auto& r : ranks) {
    ASSERT_EQ(r.wait_for(60s), std::future_status::ready);
    auto sum = r.get();
    EXPECT_TRUE(at::allclose(sum, at::full({4}, 3.0f))) << sum;
  }
}

constexpr const char* kPythonScript = R"PY(
import sys
from datetime import timedelta
try:
    import torch
    import torch.distributed as dist
except Exception as e:
    print("IMPORT_FAILED", repr(e))
    sys.exit(3)

def check(ok, what):
    if not ok:
        print("CHECK_FAILED", what)
        sys.exit(1)

s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=30))
s.set("py_key", "py_value")
check(s.get("cpp_key") == b"cpp_value", "get cpp_key")
check(s.add("py_counter", 5) == 5, "add 5")
check(s.add("py_counter", 3) == 8, "add 3")
check(s.compare_set("py_cas", "", "first") == b"first", "compare_set create")
check(s.compare_set("py_cas", "wrong", "x") == b"first", "compare_set mismatch")
check(s.compare_set("py_cas", "first", "second") == b"second", "compare_set swap")
s.set("py_tmp", "x")
check(s.delete_key("py_tmp") is True, "delete existing")
check(s.delete_key("py_tmp") is False, "delete missing")
check(s.num_keys() >= 4, "num_keys")
s.wait(["cpp_key", "py_key"], timedelta(seconds=5))
s.set("py_ready", "1")
s.wait(["cpp_late"])  # set by the C++ side only after it saw py_ready
check(s.get("cpp_late") == b"late", "get cpp_late")
if int(torch.__version__.split(".")[0]) >= 2:
    # Requests only PyTorch 2.x sends (protocol v2's queues and key listing among them).
    s.append("py_log", "a")
    s.append("py_log", "b")
    check(s.get("py_log") == b"ab", "append")
    s.multi_set(["py_m1", "py_m2"], ["1", "2"])
    check(s.multi_get(["py_m1", "py_m2"]) == [b"1", b"2"], "multi_set/multi_get")
    s.queue_push("py_q", "first")
    s.queue_push("py_q", "second")
    check(s.queue_len("py_q") == 2, "queue_len")
    check(s.queue_pop("py_q") == b"first", "queue_pop first")
    check(s.queue_pop("py_q") == b"second", "queue_pop second")
    check(s.queue_len("py_q") == 0, "queue_len after pops")
    keys = s.list_keys()
    check("/py_m1" in keys or "py_m1" in keys, "list_keys: %r" % (keys,))
    check(s.check(["py_m1"]) and not s.check(["py_never"]), "check")
    try:
        s.wait(["py_never"], timedelta(milliseconds=200))
        check(False, "wait on a missing key returned")
    except Exception:
        pass
    check(s.get("py_key") == b"py_value", "connection usable after a timed-out wait")
    print("PY_V2_OK")
print("PY_OK", torch.__version__)
)PY";

struct Result {
  int status = -1;
  std::string output;
};

Result run_python(const std::string& python, std::uint16_t port) {
  char path[] = "/tmp/dtrain_store_interop_XXXXXX";
  int fd = ::mkstemp(path);
  if (fd < 0) return {-1, "mkstemp failed"};
  ::close(fd);
  std::ofstream(path) << kPythonScript;
  // `timeout` bounds a wedged interpreter; the script's own store timeouts are 30 s.
  std::string command = "timeout 60 " + python + " " + path + " " + std::to_string(port) + " 2>&1";
  Result result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof(buffer), pipe))
    result.output.append(buffer, n);
  int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  ::unlink(path);
  return result;
}

// Debian's PyTorch 1.13 (protocol v1) and the venv's PyTorch 2.x (v2), both in every build.
class PythonStoreInterop : public ::testing::TestWithParam<const char*> {};

TEST_P(PythonStoreInterop, PythonTcpStoreWorksAgainstOurServer) {
  const std::string python = GetParam();
  ASSERT_EQ(::access(python.c_str(), X_OK), 0)
      << python << " is missing: run scripts/setup.sh (it installs python3-torch and the venv)";

  auto server = StoreServer::start({});
  auto ours = our_client(*server);
  ours->set("cpp_key", "cpp_value");

  auto result_future =
      std::async(std::launch::async, [&] { return run_python(python, server->port()); });
  // Poll instead of one long get(): if Python dies early we fail now, not in 30 s.
  bool ready = false;
  while (!ready && result_future.wait_for(0ms) == std::future_status::timeout) {
    ready = ours->wait({"py_ready"}, 100ms);
  }
  if (ready) ours->set("cpp_late", "late");
  ASSERT_EQ(result_future.wait_for(60s), std::future_status::ready);
  Result result = result_future.get();
  ASSERT_NE(result.status, 3) << python << " cannot import torch: " << result.output;
  ASSERT_EQ(result.status, 0) << "python TCPStore client failed:\n" << result.output;
  EXPECT_NE(result.output.find("PY_OK"), std::string::npos) << result.output;
  if (python != "/usr/bin/python3") {
    EXPECT_NE(result.output.find("PY_V2_OK"), std::string::npos) << result.output;
  }
  EXPECT_TRUE(ready);

  EXPECT_EQ(ours->get("py_key"), "py_value");
  EXPECT_EQ(ours->get("py_counter"), "8");
  EXPECT_EQ(ours->get("py_cas"), "second");
  EXPECT_FALSE(ours->check({"py_tmp"}));
}

INSTANTIATE_TEST_SUITE_P(Versions, PythonStoreInterop,
                         ::testing::Values("/usr/bin/python3", DTRAIN_VENV_PYTHON),
                         [](const auto& info) {
                           return std::string(info.index == 0 ? "Debian_torch1" : "Venv_torch2");
                         });

// StoreClient against PyTorch's own TCPStore server (the libtorch this build links): it
// negotiates v2 with 2.x's daemon and falls back to v1 with 1.13's.
TEST(StoreInteropTest, OurClientSpeaksTheProtocolOfTorchsServer) {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = 30s;
  auto master = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  master->set("from_torch", bytes("hello"));
  StoreClient::Options client_options;
  client_options.connect_timeout = 10s;
  client_options.timeout = 10s;
  auto client = StoreClient::connect("127.0.0.1", master->getPort(), client_options);
  const bool torch2 = std::string(DTRAIN_TORCH_VERSION).rfind("1.", 0) != 0;
  EXPECT_EQ(client->protocol(),
            torch2 ? StoreClient::Options::Protocol::v2 : StoreClient::Options::Protocol::v1);
  EXPECT_EQ(client->get("from_torch"), "hello");
  client->set("from_dtrain", "hi");
  EXPECT_EQ(text(master->get("from_dtrain")), "hi");
  EXPECT_EQ(client->add("n", 2), 2);
  if (torch2) {
    // 1.13's daemon has no CANCEL_WAIT (its clients time out on the socket): a timed-out
    // wait() is for 2.x's daemon and ours.
    EXPECT_FALSE(client->wait({"never"}, 100ms));
  }
  EXPECT_EQ(client->get("from_dtrain"), "hi");
}

}  // namespace
}  // namespace dtrain::store
