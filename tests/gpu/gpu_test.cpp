// GPU end to end (label gpu; registered only where the build has CUDA and a GPU is visible,
// see tests/gpu.cmake): NCCL at world size 1, 2-4 ranks sharing the one GPU (CUDA tensors
// through shared memory), DDP, SyncBatchNorm, hvd and checkpoints on CUDA (tests/gpu/gpu_worker.cpp
// checks its own results), the example on CUDA, an unchanged PyTorch NCCL script under
// `dtrain run`, FusedAdam on CUDA parameters, the Distributor with use_gpu, ZeRO's optimizers and
// fp16 overflow check on the device against the CPU, Tune trials on their GPUs and `dtrain
// deepspeed` on the GPU node. This binary is also the Distributor's and Tune's worker.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "dtrain/dtrain.h"
#include "dtrain/tune.h"
#include "launcher/subprocess.h"
#include "support/paths.h"
#include "support/scoped_env.h"

namespace {

using namespace std::chrono_literals;
using dtrain::test::run_command;
using dtrain::test::RunResult;

std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.timed_out ? " (timed out)" : "") +
         "\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

int count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

RunResult run_worker(int nproc, const std::vector<std::string>& args) {
  std::vector<std::string> argv{DTRAIN_BIN, "run", "--nproc-per-node", std::to_string(nproc),
                                GPU_WORKER_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, {.timeout = 240s});
}

TEST(Gpu, NcclAtWorldSizeOne) {
  auto r = run_worker(1, {"collectives", "--backend", "nccl"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("collectives ok backend=cpu:shm,cuda:nccl device=cuda:0"), std::string::npos)
      << describe(r);
}

TEST(Gpu, TwoToFourRanksShareOneGpu) {
  for (int n : {2, 3, 4}) {
    auto r = run_worker(n, {"collectives"});
    ASSERT_EQ(r.exit_code, 0) << n << " ranks: " << describe(r);
    EXPECT_EQ(count(r.out, "collectives ok"), n) << describe(r);
    if (dtrain::cuda_device_count() == 1) {
      // One GPU for all: NCCL cannot, so CUDA tensors go through the shared-memory backend.
      EXPECT_EQ(count(r.out, "backend=shm device=cuda:0"), n) << describe(r);
    }
  }
}

// A CPU job on a GPU machine never starts CUDA: "auto" decides the CUDA backend at the first
// CUDA collective, as PyTorch's init_process_group asks nothing of CUDA (each of 16 workers
// paid cuInit at launch before: 1.33 s vs 0.96 s with no GPU visible, H100, 2026-11-27).
TEST(Gpu, ACpuJobOnAGpuMachineNeverStartsCuda) {
  auto r = run_worker(2, {"cpu_job"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(count(r.out, "cpu_job ok backend=cpu:shm,cuda:auto"), 2) << describe(r);
}

TEST(Gpu, ExplicitNcclOnASharedGpuSaysWhy) {
  if (dtrain::cuda_device_count() != 1) GTEST_SKIP() << "needs exactly one GPU";
  auto r = run_worker(2, {"collectives", "--backend", "nccl"});
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("backend 'nccl' is not available: ranks 0 and 1 share GPU"),
            std::string::npos)
      << describe(r);
}

TEST(Gpu, DdpMatchesOneProcess) {
  for (int n : {1, 2, 4}) {
    auto r = run_worker(n, {"ddp"});
    ASSERT_EQ(r.exit_code, 0) << n << " ranks: " << describe(r);
    EXPECT_NE(r.out.find("ddp ok world=" + std::to_string(n)), std::string::npos) << describe(r);
  }
}

TEST(Gpu, SyncBatchNormMatchesBatchNormOnTheWholeBatch) {
  auto r = run_worker(2, {"syncbn"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("syncbn ok"), std::string::npos) << describe(r);
}

TEST(Gpu, CheckpointFromAGpuLoadsOnTheCpuAndBack) {
  auto r = run_worker(1, {"checkpoint"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("checkpoint ok"), std::string::npos) << describe(r);
}

TEST(Gpu, HorovodOnCudaTensors) {
  auto r = run_worker(2, {"hvd"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(count(r.out, "hvd ok"), 2) << describe(r);
}

// ZeRO-3 with the optimizer and the parameters offloaded: a model whose fp32 Adam state (268 MB)
// is more than the GPU memory each rank allows itself (200 MB) trains, and its losses are the
// CPU engine's (the same config, data and initial weights on the CPU).
TEST(Gpu, Zero3OffloadTrainsMoreThanTheGpuHoldsAsTheCpuEngineDoes) {
  auto losses = [&](const std::string& where) {
    auto r = run_worker(2, {"zero", where, "200"});
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.out, m, std::regex("\\{\"adam_state_mb\".*\\}")))
        << describe(r);
    return m.empty() ? nlohmann::json() : nlohmann::json::parse(m[0].str());
  };
  auto gpu = losses("cuda");
  auto cpu = losses("cpu");
  ASSERT_TRUE(gpu.is_object() && cpu.is_object());
  EXPECT_GT(gpu["adam_state_mb"].get<double>(), 200.0);
  EXPECT_LE(gpu["peak_gpu_mb"].get<double>(), 200.0);
  ASSERT_EQ(gpu["losses"].size(), cpu["losses"].size());
  for (size_t i = 0; i < gpu["losses"].size(); ++i) {
    const double g = gpu["losses"][i].get<double>(), c = cpu["losses"][i].get<double>();
    EXPECT_NEAR(g, c, 1e-4 * std::abs(c) + 1e-6) << "step " << i;
  }
}

TEST(Gpu, FashionMnistTrainsOnTheGpu) {
  auto r = run_command({DTRAIN_BIN, "run", "--nproc-per-node", "2", FASHION_MNIST_BIN, "--device",
                        "cuda", "--epochs", "1", "--log-every", "0"},
                       {.timeout = 300s});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("\"test_accuracy\":([0-9.]+)")))
      << describe(r);
  EXPECT_GE(std::stod(m[1]), 0.84) << describe(r);
  EXPECT_NE(r.out.find("\"device\":\"cuda:0\""), std::string::npos) << describe(r);
}

// dtrain::FusedAdam on CUDA parameters (ATen's fused CUDA kernel, one launch per dtype) steps as
// torch::optim::Adam does on the CPU, amsgrad and weight decay included.
TEST(Gpu, FusedAdamOnCudaStepsAsTorchAdamOnTheCpu) {
  for (bool amsgrad : {false, true}) {
    torch::manual_seed(5);
    torch::nn::Sequential cpu(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 8));
    auto gpu = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(cpu->clone());
    gpu->to(torch::kCUDA);
    const auto o = torch::optim::AdamOptions(1e-2).weight_decay(0.01).amsgrad(amsgrad);
    torch::optim::Adam cpu_opt(cpu->parameters(), o);
    dtrain::FusedAdam gpu_opt(gpu->parameters(), o);
    for (int s = 0; s < 20; ++s) {
      auto x = torch::randn({16, 32});
      auto y = torch::randint(0, 8, {16}, torch::kLong);
      cpu_opt.zero_grad();
      torch::nn::functional::cross_entropy(cpu->forward(x), y).backward();
      // The same gradients on both sides: what differs is the optimizer alone (Adam's update
      // of a gradient near zero would amplify the devices' rounding of their own backward).
      auto cp = cpu->parameters(), gp = gpu->parameters();
      for (size_t i = 0; i < cp.size(); ++i) gp[i].mutable_grad() = cp[i].grad().cuda();
      cpu_opt.step();
      gpu_opt.step();
    }
    auto a = cpu->parameters(), b = gpu->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(b[i].is_cuda());
      EXPECT_TRUE(torch::allclose(a[i], b[i].cpu(), 1e-4, 1e-6))
          << "parameter " << i << (amsgrad ? " (amsgrad)" : "") << " differs by "
          << (a[i] - b[i].cpu()).abs().max().item<double>();
    }
  }
}

TEST(Gpu, PytorchNcclScriptUnderDtrainRun) {
  auto r =
      run_command({DTRAIN_BIN, "run", "--nproc-per-node", "1",
                   std::string(DTRAIN_SOURCE_DIR) + "/tests/gpu/nccl_script.py"},
                  {.env = {std::string("DTRAIN_PYTHON=") + DTRAIN_NATIVE_PYTHON}, .timeout = 240s});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("nccl script rank 0 of 1 ok on cuda:0"), std::string::npos) << describe(r);
}

// ZeRO's optimizers on the GPU as on the CPU (gpu_worker optim): Lion at stage 0 (FusedLion's
// update on CUDA tensors), CPU Lion offloaded, fp16 Adam with an infinite loss at one step (the
// inf/NaN check on the device's gradients skips it and lowers the scale as on the CPU), fp16
// torch_autocast likewise (DeepSpeed's GradScaler: at stage 0 the update skipped, not counted,
// the scale halved; at stage 2 the step skipped for its norm, counted, the scale kept), bf16
// offloaded; 2 ranks each.
TEST(Gpu, ZeroOptimizersAndOverflowCheckOnTheGpuAsOnTheCpu) {
  auto results = [&](const std::string& where) {
    auto r = run_worker(2, {"optim", where});
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.out, m, std::regex("\\{\"optim\":.*\\}"))) << describe(r);
    return m.empty() ? nlohmann::json() : nlohmann::json::parse(m[0].str())["optim"];
  };
  const auto gpu = results("cuda");
  const auto cpu = results("cpu");
  ASSERT_TRUE(gpu.is_object() && cpu.is_object() && gpu.size() == 6u) << gpu.dump();
  for (const auto& [name, c] : cpu.items()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(gpu.contains(name));
    const auto& g = gpu[name];
    EXPECT_EQ(g["skipped"], c["skipped"]);
    EXPECT_EQ(g["loss_scale"], c["loss_scale"]);
    if (name.find("(GradScaler)") != std::string::npos) {
      EXPECT_EQ(g["skipped"], 0);
      EXPECT_EQ(g["loss_scale"], 32768.0);
    } else if (name.find("infinite") != std::string::npos) {
      EXPECT_EQ(g["skipped"], 1);
    }
    if (name.find("(the norm)") != std::string::npos) EXPECT_EQ(g["loss_scale"], 65536.0);
    // Lion's update is lr x sign: a gradient within rounding of 0 may take the other sign on
    // the other device (2 x lr = 2e-4 apart); 16-bit parameters may round the other way (bf16
    // ~4e-3, fp16 ~5e-4), and the losses follow.
    const bool bf16 = name.find("bf16") != std::string::npos;
    const bool fp16 = name.find("fp16") != std::string::npos;
    const double loss_bound = bf16 ? 1e-2 : fp16 ? 2e-3 : 1e-3;
    ASSERT_EQ(g["losses"].size(), c["losses"].size());
    for (size_t i = 0; i < c["losses"].size(); ++i) {
      const double a = g["losses"][i], b = c["losses"][i];
      EXPECT_NEAR(a, b, loss_bound * std::abs(b) + 1e-6) << "step " << i + 1;
    }
    const double bound = bf16 ? 1e-2 : 1e-3;
    ASSERT_EQ(g["params"].size(), c["params"].size());
    double worst = 0;
    for (size_t i = 0; i < c["params"].size(); ++i)
      worst =
          std::max(worst, std::abs(g["params"][i].get<double>() - c["params"][i].get<double>()));
    EXPECT_LE(worst, bound);
  }
}

// `dtrain deepspeed` on a GPU node, as DeepSpeed's launcher: one worker per visible GPU, each
// with CUDA_VISIBLE_DEVICES = the node's list and LOCAL_RANK its index in it.
TEST(Gpu, DeepspeedLauncherStartsOneWorkerPerGpu) {
  const int n = dtrain::cuda_device_count();
  std::string list;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
    list = v;
  } else {
    for (int i = 0; i < n; ++i) list += (i ? "," : "") + std::to_string(i);
  }
  auto r = run_command({DTRAIN_BIN, "deepspeed", "--no_local_rank", "/bin/sh", "-c",
                        "echo ds-env $RANK $LOCAL_RANK $WORLD_SIZE $CUDA_VISIBLE_DEVICES"},
                       {.timeout = 120s});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(count(r.out, "ds-env "), n) << describe(r);
  for (int i = 0; i < n; ++i) {
    const std::string line = "ds-env " + std::to_string(i) + " " + std::to_string(i) + " " +
                             std::to_string(n) + " " + list;
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << describe(r);
  }
}

// ---- Tune trials on their GPUs: this binary is the trials' worker ----------------------------

// A trial: every process all-reduces on its device and reports what it saw.
void tune_gpu_trial(dtrain::tune::Config) {
  auto pg = dtrain::init_process_group();
  auto dev = dtrain::local_device();
  auto t = torch::full({4}, pg->rank() + 1.0, torch::TensorOptions().device(dev));
  dtrain::all_reduce(t);
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  dtrain::tune::report({{"cvd", cvd ? cvd : "unset"},
                        {"device", dev.str()},
                        {"devices", dtrain::cuda_device_count()},
                        {"sum", t[0].item<double>()}});
}

// GPUs per trial on a real GPU: half a GPU per trial of 2 processes, GPUs counted as Ray counts
// them (TuneOptions::num_gpus unset): Ray packs both halves onto the first GPU, and each
// trial's processes see only it, train on it and all-reduce there.
TEST(Gpu, TuneTrialsSeeAndUseTheirGpu) {
  namespace fs = std::filesystem;
  using namespace dtrain::tune;
  const fs::path dir =
      fs::temp_directory_path() / ("dtrain_gpu_tune_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string first = "0";
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v)
    first = std::string(v).substr(0, std::string(v).find(','));
  Tuner tuner(tune_gpu_trial, Config{{"i", grid_search({0, 1})}},
              {.metric = "sum",
               .mode = "max",
               .num_cpus = 4,
               .trial_resources = {.processes = 2, .gpus = 0.5},
               .storage_path = dir.string(),
               .verbose = false});
  const ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 2u);
  for (const auto& t : grid.trials()) {
    SCOPED_TRACE(t.id);
    EXPECT_EQ(t.status, TrialStatus::Terminated) << t.error;
    EXPECT_EQ(t.last_result.value("cvd", Config("")), first);
    EXPECT_EQ(t.last_result.value("devices", Config(0)), 1);
    EXPECT_EQ(t.last_result.value("device", Config("")), "cuda:0");
    EXPECT_EQ(t.last_result.value("sum", Config(0.0)), 3.0);
  }
  fs::remove_all(dir);
}

// ---- the Distributor with use_gpu: this binary is its own worker ----------------------------

// MLflow's system metrics read the GPU through NVML as MLflow's GPUMonitor does (pynvml):
// gpu_0_* under MLflow's names, the memory in use as NVML v1 (nvidia-smi's used + reserved) has it
// around the run.
TEST(Gpu, MlflowSystemMetricsReadTheGpu) {
  namespace fs = std::filesystem;
  auto smi_used_mb = [] {
    // MLflow's GPUMonitor reads pynvml's nvmlDeviceGetMemoryInfo (v1), whose "used" counts the
    // driver's reserved memory; nvidia-smi's memory.used is v2's, without it. In MiB.
    auto r = run_command({"/usr/bin/env", "nvidia-smi", "--query-gpu=memory.used,memory.reserved",
                          "--format=csv,noheader,nounits", "--id=0"},
                         {.timeout = 60s});
    const auto comma = r.out.find(',');
    if (r.exit_code != 0 || comma == std::string::npos) {
      ADD_FAILURE() << "nvidia-smi: " << describe(r);
      return std::nan("");
    }
    const double mib = std::stod(r.out.substr(0, comma)) + std::stod(r.out.substr(comma + 1));
    return mib * 1048576.0 / 1e6;
  };
  const fs::path dir =
      fs::temp_directory_path() / ("dtrain_gpu_sysmetrics_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const double before = smi_used_mb();
  std::string run_id;
  {
    dtrain::test::ScopedEnv env;
    env.set("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.25");
    auto run = dtrain::mlflow::Run::start(
        {.tracking_uri = "file:" + dir.string(), .experiment = "gpu", .log_system_metrics = true});
    run_id = run.id();
    std::this_thread::sleep_for(1200ms);
    run.end();
  }
  const double after = smi_used_mb();
  std::map<std::string, std::vector<double>> metrics;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const auto rel = e.path().generic_string();
    const auto at = rel.find("/metrics/system/");
    if (!e.is_regular_file() || at == std::string::npos) continue;
    std::ifstream in(e.path());
    std::string ts;
    double value = 0;
    int64_t step = 0;
    while (in >> ts >> value >> step) metrics[rel.substr(at + 16)].push_back(value);
  }
  for (const char* name : {"gpu_0_memory_usage_percentage", "gpu_0_memory_usage_megabytes",
                           "gpu_0_utilization_percentage", "gpu_0_power_usage_watts",
                           "gpu_0_power_usage_percentage"}) {
    ASSERT_TRUE(metrics.count(name)) << name << " not logged; run " << run_id;
    for (double v : metrics[name]) {
      EXPECT_GE(v, 0) << name;
      if (std::string(name).find("percentage") != std::string::npos) EXPECT_LE(v, 100) << name;
    }
  }
  const double used = metrics["gpu_0_memory_usage_megabytes"].back();
  EXPECT_GE(used, std::min(before, after) * 0.95 - 64) << before << " " << after;
  EXPECT_LE(used, std::max(before, after) * 1.05 + 64) << before << " " << after;
  EXPECT_GT(metrics["gpu_0_power_usage_watts"].back(), 0);
  fs::remove_all(dir);
}

std::string gpu_identity() {
  auto pg = dtrain::init_process_group();
  auto dev = dtrain::local_device();
  auto t = torch::full({3}, pg->rank() + 1.0, torch::TensorOptions().device(dev));
  dtrain::all_reduce(t);
  return dev.str() + " " + pg->backend_name() + " " + std::to_string(t[0].item<double>());
}

TEST(Gpu, DistributorWithUseGpu) {
  auto out = dtrain::Distributor({.num_processes = 1, .use_gpu = true}).run(gpu_identity);
  EXPECT_EQ(out, "cuda:0 cpu:shm,cuda:nccl 1.000000");
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);  // a Distributor worker runs its function here and exits
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
