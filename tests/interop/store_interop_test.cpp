// Our StoreServer against PyTorch 1.13's own clients: c10d::TCPStore from C++, a real
// ProcessGroupGloo rendezvousing through it, and torch.distributed.TCPStore from Python.
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
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/socket.h"

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
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_0",
                                                         torch_client(server->port()));
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

constexpr const char* kPython = "/usr/bin/python3";

constexpr const char* kPythonScript = R"PY(
import sys
from datetime import timedelta
try:
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
print("PY_OK")
)PY";

struct Result {
  int status = -1;
  std::string output;
};

Result run_python(std::uint16_t port) {
  char path[] = "/tmp/dtrain_store_interop_XXXXXX";
  int fd = ::mkstemp(path);
  if (fd < 0) return {-1, "mkstemp failed"};
  ::close(fd);
  std::ofstream(path) << kPythonScript;
  // `timeout` bounds a wedged interpreter; the script's own store timeouts are 30 s.
  std::string command =
      "timeout 60 " + std::string(kPython) + " " + path + " " + std::to_string(port) + " 2>&1";
  Result result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) result.output.append(buffer, n);
  int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  ::unlink(path);
  return result;
}

TEST(StoreInteropTest, PythonTcpStoreWorksAgainstOurServer) {
  ASSERT_EQ(::access(kPython, X_OK), 0)
      << kPython << " is missing: install python3 and python3-torch (Debian) to run this test";

  auto server = StoreServer::start({});
  auto ours = our_client(*server);
  ours->set("cpp_key", "cpp_value");

  auto python = std::async(std::launch::async, [&] { return run_python(server->port()); });
  // Poll instead of one long get(): if Python dies early we fail now, not in 30 s.
  bool ready = false;
  while (!ready && python.wait_for(0ms) == std::future_status::timeout) {
    ready = ours->wait({"py_ready"}, 100ms);
  }
  if (ready) ours->set("cpp_late", "late");
  ASSERT_EQ(python.wait_for(60s), std::future_status::ready);
  Result result = python.get();
  ASSERT_NE(result.status, 3) << kPython << " cannot import torch (install python3-torch): "
                              << result.output;
  ASSERT_EQ(result.status, 0) << "python TCPStore client failed:\n" << result.output;
  EXPECT_NE(result.output.find("PY_OK"), std::string::npos) << result.output;
  EXPECT_TRUE(ready);

  EXPECT_EQ(ours->get("py_key"), "py_value");
  EXPECT_EQ(ours->get("py_counter"), "8");
  EXPECT_EQ(ours->get("py_cas"), "second");
  EXPECT_FALSE(ours->check({"py_tmp"}));
}

}  // namespace
}  // namespace dtrain::store
