// The backend factory (src/comm/backend.h) with ranks as threads over one HashStore: which
// backends a spec gives per device type, the errors for specs it cannot give (named, before
// anything hangs), and the collectives' front end checking a tensor against the traits of the
// backend that would run it. In a CUDA build on a machine without a GPU (CI's libtorch 2.x
// build) "auto" must leave the group CPU-only and "nccl" must say why it cannot run.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/backend.h"
#include "comm/cuda/device.h"
#include "dtrain/collectives.h"
#include "dtrain/device.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;

template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// Runs fn(rank, request) on `world` threads; request has the spec, a shared store, the rank.
void run_ranks(int world, const std::string& spec,
               const std::function<void(int, const comm::GroupRequest&)>& fn) {
  static int generation = 0;
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("g" + std::to_string(generation++), store);
  std::vector<std::thread> threads;
  std::mutex mu;
  std::vector<std::string> failures;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      comm::GroupRequest req;
      req.spec = spec;
      req.store = prefixed;
      req.rank = r;
      req.world = world;
      req.timeout = 20s;
      req.gloo_hostname = "127.0.0.1";
      try {
        fn(r, req);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
}

TEST(BackendFactory, SpecsGiveTheirBackendsPerDevice) {
  struct Case {
    std::string spec, description, cpu;
  };
  // All ranks are threads of this process: one host, so "auto" is the shared-memory backend.
  for (const Case& c : {Case{"auto", "shm", "shm"}, Case{"gloo", "gloo", "gloo"},
                        Case{"shm", "shm", "shm"}, Case{"cpu:gloo", "gloo", "gloo"},
                        Case{"cpu:shm", "shm", "shm"}, Case{"cpu:auto", "shm", "shm"}}) {
    run_ranks(2, c.spec, [&](int rank, const comm::GroupRequest& req) {
      auto made = std::make_shared<comm::GroupBackends>(comm::make_group_backends(req));
      ProcessGroup group(req.store, made);
      EXPECT_EQ(group.backend_name(), c.description) << c.spec;
      EXPECT_EQ(group.backend_name(c10::DeviceType::CPU), c.cpu) << c.spec;
      // No GPU here (the CI machines have none): no CUDA backend, whatever the spec allowed.
      if (!comm::cuda::available()) {
        EXPECT_EQ(group.backend_name(c10::DeviceType::CUDA), "") << c.spec;
        EXPECT_EQ(group.cuda_device(), -1);
      }
      EXPECT_EQ(group.timeout(), 20s);
      // And it runs collectives.
      auto t = torch::full({5}, static_cast<float>(rank + 1));
      AllReduceOptions o;
      o.group = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
      all_reduce(t, o);
      EXPECT_TRUE(torch::equal(t, torch::full({5}, 3.0f))) << c.spec;
    });
  }
}

TEST(BackendFactory, BadSpecsAreNamedWithTheChoices) {
  struct Case {
    std::string spec, expected;
  };
  for (const Case& c : {Case{"nccx", "unknown backend 'nccx'"}, Case{"", "unknown backend ''"},
                        Case{"cpu:nccl", "NCCL takes CUDA tensors only"},
                        Case{"gpu:gloo", "does not name a device type (cpu or cuda)"},
                        Case{"cpu:gloo,cpu:shm", "names cpu twice"},
                        Case{"cpu:mpi", "'mpi' cannot run cpu tensors"}}) {
    run_ranks(1, c.spec, [&](int, const comm::GroupRequest& req) {
      std::string msg = message_of<UsageError>([&] { comm::make_group_backends(req); });
      EXPECT_TRUE(contains(msg, c.expected)) << c.spec << ": " << msg;
      EXPECT_TRUE(contains(msg, "\"cpu:gloo,cuda:nccl\"")) << c.spec << ": " << msg;
    });
  }
}

// "nccl" where it cannot run fails on every rank alike, saying why - never a hang.
TEST(BackendFactory, NcclWithoutAGpuForEveryRankSaysWhy) {
  if (comm::cuda::available()) GTEST_SKIP() << "this process sees a GPU (the gpu tests cover it)";
  run_ranks(2, "nccl", [&](int, const comm::GroupRequest& req) {
    std::string msg = message_of<UsageError>([&] { comm::make_group_backends(req); });
    EXPECT_TRUE(contains(msg, "backend 'nccl' is not available")) << msg;
    if (comm::built_with_cuda()) {
      EXPECT_TRUE(contains(msg, "rank 0 sees no GPU")) << msg;
    } else {
      EXPECT_TRUE(contains(msg, "this build of dtrain has no CUDA")) << msg;
    }
    EXPECT_TRUE(contains(msg, "\"gloo\"")) << msg;
  });
  // CUDA only, explicitly: nothing is left for any tensor here.
  if (comm::built_with_cuda()) {
    run_ranks(1, "cuda:gloo", [&](int, const comm::GroupRequest& req) {
      std::string msg = message_of<UsageError>([&] { comm::make_group_backends(req); });
      EXPECT_TRUE(contains(msg, "leaves no backend for any tensor")) << msg;
    });
  }
}

// The front end checks a tensor against the backend of its device type, naming what the
// group takes.
TEST(BackendFactory, ATensorOnADeviceTheGroupDoesNotTakeIsRefusedByName) {
  run_ranks(1, "gloo", [&](int, const comm::GroupRequest& req) {
    auto made = std::make_shared<comm::GroupBackends>(comm::make_group_backends(req));
    auto group = std::make_shared<ProcessGroup>(req.store, made);
    AllReduceOptions o;
    o.group = group;
    auto meta = torch::empty({4}, torch::TensorOptions().device(torch::kMeta));
    std::string msg = message_of<UsageError>([&] { all_reduce(meta, o); });
    EXPECT_TRUE(contains(msg,
                         "tensor is on meta, but this group's backend ('gloo') takes tensors "
                         "on cpu (gloo) only"))
        << msg;
    // A dtype the backend does not take names the backend and its dtypes.
    auto flags = torch::ones({4}, torch::kBool);
    msg = message_of<UsageError>([&] { all_reduce(flags, o); });
    EXPECT_TRUE(contains(msg, "has dtype Bool, which Gloo does not support; use Float, Double"))
        << msg;
  });
}

TEST(BackendFactory, TraitsAndNames) {
  auto gloo = comm::backend_traits("gloo", c10::DeviceType::CPU);
  ASSERT_TRUE(gloo.has_value());
  EXPECT_TRUE(gloo->supports(comm::kOpAlltoall));
  EXPECT_FALSE(gloo->native_avg);
  EXPECT_FALSE(gloo->supports(at::kBFloat16));
  auto shm = comm::backend_traits("shm", c10::DeviceType::CPU);
  ASSERT_TRUE(shm.has_value());
  EXPECT_TRUE(shm->native_avg);
  EXPECT_FALSE(comm::backend_traits("nccl", c10::DeviceType::CPU).has_value());
  EXPECT_FALSE(comm::backend_traits("auto", c10::DeviceType::CPU).has_value());
  auto names = comm::backend_names();
  EXPECT_EQ(names.size(), comm::built_with_cuda() ? 3u : 2u);
  if (comm::built_with_cuda()) {
    auto nccl = comm::backend_traits("nccl", c10::DeviceType::CUDA);
    ASSERT_TRUE(nccl.has_value());
    EXPECT_TRUE(nccl->supports(at::kBFloat16));
    EXPECT_EQ(nccl->cuda_path, "nccl");
    EXPECT_EQ(comm::backend_traits("shm", c10::DeviceType::CUDA)->cuda_path, "host staging");
  }
  // Without a GPU every worker trains on the CPU.
  if (!cuda_available()) {
    EXPECT_EQ(local_device(), torch::Device(torch::kCPU));
    EXPECT_EQ(cuda_device_count(), 0);
  }
}

// A CUDA build's programs export the hook with which `dtrain run`'s fork server loads the CUDA
// plugin once, before it forks the workers, instead of once in every worker (on a 2-core VM, 16
// workers on a machine counted as a GPU one started in 0.74-0.87 s with it, 2.0-2.45 s without).
TEST(BackendFactory, ACudaBuildsProgramExportsTheForkServerPrepareHook) {
  void* hook = ::dlsym(RTLD_DEFAULT, "dtrain_forkserver_prepare");
  if (comm::built_with_cuda()) {
    EXPECT_NE(hook, nullptr) << "dtrain::runtime's link options export it from every program";
  } else {
    EXPECT_EQ(hook, nullptr) << "a CPU build has nothing to prepare";
  }
}

// On a machine that may show a GPU, "auto" leaves the CUDA backend undecided until the group's
// first CUDA use, so a job that keeps to the CPU never starts CUDA (cuInit) nor exchanges its
// GPUs; at init the ranks only tell each other whether they may see one (so all take the same
// path); the first use decides on every rank, from one exchange. DTRAIN_CUDA_AUTOLOAD=1 makes
// this machine count as one that may show a GPU; none is visible, so the decision is "none".
TEST(BackendFactory, AutoDecidesTheCudaBackendAtItsFirstUseWhereAGpuMayBe) {
  const char* before = std::getenv("DTRAIN_CUDA_AUTOLOAD");
  const std::string saved = before ? before : "";
  ::setenv("DTRAIN_CUDA_AUTOLOAD", "1", 1);
  struct Restore {
    bool had;
    std::string value;
    ~Restore() {
      if (had) {
        ::setenv("DTRAIN_CUDA_AUTOLOAD", value.c_str(), 1);
      } else {
        ::unsetenv("DTRAIN_CUDA_AUTOLOAD");
      }
    }
  } restore{before != nullptr, saved};
  for (const std::string cpu : {"shm", "gloo"}) {
    const std::string spec = cpu == "shm" ? "auto" : "gloo";
    run_ranks(2, spec, [&](int rank, const comm::GroupRequest& req) {
      auto made = std::make_shared<comm::GroupBackends>(comm::make_group_backends(req));
      auto group = std::shared_ptr<ProcessGroup>(new ProcessGroup(req.store, made));
      // At init the ranks exchange only whether their machine may show a GPU (no CUDA asked).
      const int64_t exchanges_at_init = req.store->add("dtrain_backend/joined", 0);
      if (comm::built_with_cuda()) {
        EXPECT_EQ(group->backend_name(), "cpu:" + cpu + ",cuda:auto") << spec;
        EXPECT_EQ(group->backend_name(c10::DeviceType::CUDA), "auto") << spec;
        EXPECT_EQ(group->cuda_device(), -1) << spec;
        EXPECT_EQ(exchanges_at_init, 2) << spec << ": one exchange per rank at init";
      } else {  // no CUDA in this build: nothing to decide, no CUDA part
        EXPECT_EQ(group->backend_name(), cpu) << spec;
        EXPECT_EQ(group->backend_name(c10::DeviceType::CUDA), "") << spec;
      }
      // CPU collectives run meanwhile (through the router, where it serves the CPU too).
      auto check_cpu = [&] {
        auto t = torch::full({5}, static_cast<float>(rank + 1));
        AllReduceOptions o;
        o.group = group;
        all_reduce(t, o);
        EXPECT_TRUE(torch::equal(t, torch::full({5}, 3.0f))) << spec;
        auto b = torch::full({3}, static_cast<double>(rank));
        BroadcastOptions bo;
        bo.group = group;
        bo.src = 1;
        broadcast(b, bo);
        EXPECT_TRUE(torch::equal(b, torch::full({3}, 1.0, torch::kDouble))) << spec;
        group->barrier();
      };
      check_cpu();
      // The first CUDA use (a CUDA tensor's collective asks the same) decides: no rank sees a
      // GPU here, so the group has no CUDA backend - and says so from then on.
      EXPECT_EQ(made->find(c10::DeviceType::CUDA), nullptr) << spec;
      EXPECT_EQ(group->backend_name(), cpu) << spec;
      EXPECT_EQ(group->backend_name(c10::DeviceType::CUDA), "") << spec;
      EXPECT_EQ(group->cuda_device(), -1) << spec;
      if (comm::built_with_cuda()) {
        EXPECT_EQ(made->find(c10::DeviceType::CUDA), nullptr) << spec;
        // The GPUs' exchange, once per rank however often it is asked.
        EXPECT_EQ(req.store->add("dtrain_backend/joined", 0), 4) << spec;
      }
      check_cpu();
    });
  }
}

// A job where only some hosts may show a GPU: every rank still takes the same path (the ranks
// tell each other at init), so none waits at init for an exchange the others make later.
TEST(BackendFactory, RanksOfWhichOnlySomeMaySeeAGpuAllDecideAtTheFirstCudaUse) {
  run_ranks(2, "auto", [&](int rank, const comm::GroupRequest& given) {
    comm::GroupRequest req = given;
    req.may_see_gpu = rank == 0;  // rank 0's host has a GPU, rank 1's none
    const auto t0 = std::chrono::steady_clock::now();
    auto made = std::make_shared<comm::GroupBackends>(comm::make_group_backends(req));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "rank " << rank << " waited at init";
    ProcessGroup group(req.store, made);
    if (comm::built_with_cuda()) {
      EXPECT_EQ(group.backend_name(), "cpu:shm,cuda:auto") << "rank " << rank;
      // The first CUDA use decides on both: here no rank sees a GPU, so none.
      EXPECT_EQ(made->find(c10::DeviceType::CUDA), nullptr) << "rank " << rank;
    }
    EXPECT_EQ(group.backend_name(), "shm") << "rank " << rank;
    EXPECT_EQ(group.backend_name(c10::DeviceType::CUDA), "") << "rank " << rank;
  });
}

// make_backend: one backend by name, the factory's single entry point.
TEST(BackendFactory, MakeBackendByName) {
  run_ranks(2, "", [&](int rank, const comm::GroupRequest& req) {
    auto b = comm::make_backend("gloo", req.store, rank, 2, 20s, c10::Device(c10::kCPU));
    ASSERT_TRUE(b);
    EXPECT_EQ(b->getBackendName(), "gloo");
    EXPECT_EQ(b->getRank(), rank);
    // Both ranks' meshes complete before either closes its sockets (a rank that returned at
    // once could close its side while the other's pair was still connecting: "Connection
    // closed by peer", seen under load).
    b->barrier()->wait();
  });
}

}  // namespace
}  // namespace dtrain
