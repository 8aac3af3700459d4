// Cost of collective diagnosis (dtrain/debug.h): the always-on flight recorder and stall
// watchdog (level info, the default) and DETAIL mode, against level off, in one run.
// Run it under a launcher:
//
//   dtrain run --nproc-per-node 2 build/bench/diagnosis_bench [--rounds 5] [--machine TEXT]
//
// Workloads, each timed at every level in turn (off, info, detail, off, info, ...), each
// round started by a barrier; a round's time is the slowest rank's; the figure is the
// median round:
//   small   all_reduce of 256 float32 (1 KiB): latency-bound, the worst case for a per-call cost
//   bucket  all_reduce of 1 Mi float32 (4 MiB): a DDP gradient bucket
//   step    a training step: MLP 784-256-128-10 on a batch of 64 (forward, backward, SGD)
//           with its gradients all-reduced as one flat bucket
// Rank 0 prints one line per workload and level with the time per iteration and the ratio
// to off, and names the machine.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/collectives.h"
#include "dtrain/debug.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string default_machine() {
  std::string os = "Linux";
  std::ifstream in("/etc/os-release");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("PRETTY_NAME=", 0) == 0) {
      os = line.substr(12);
      os.erase(std::remove(os.begin(), os.end(), '"'), os.end());
    }
  }
  return std::to_string(std::thread::hardware_concurrency()) + " cores, " + os;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  std::string machine = default_machine();
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--rounds")
      rounds = std::max(1, std::atoi(argv[i + 1]));
    else if (k == "--machine")
      machine = argv[i + 1];
    else {
      std::fprintf(stderr, "diagnosis_bench: unknown flag %s (use --rounds N, --machine TEXT)\n",
                   k.c_str());
      return 2;
    }
  }
  torch::manual_seed(0);
  auto group = dtrain::init_process_group();
  const int rank = group->rank();
  const dtrain::DebugLevel levels[] = {dtrain::DebugLevel::kOff, dtrain::DebugLevel::kInfo,
                                       dtrain::DebugLevel::kDetail};

  torch::nn::Sequential mlp(torch::nn::Linear(784, 256), torch::nn::ReLU(),
                            torch::nn::Linear(256, 128), torch::nn::ReLU(),
                            torch::nn::Linear(128, 10));
  torch::optim::SGD sgd(mlp->parameters(), 0.01);
  auto x = torch::randn({64, 784});
  auto y = torch::randint(0, 10, {64});
  auto small = torch::ones({256});
  auto bucket = torch::ones({1 << 20});

  struct Workload {
    const char* name;
    int iters;
    std::function<void()> run;
  };
  std::vector<Workload> workloads = {
      {"small", 400, [&] { dtrain::all_reduce(small); }},
      {"bucket", 40, [&] { dtrain::all_reduce(bucket); }},
      {"step", 100,
       [&] {
         sgd.zero_grad();
         auto loss = torch::nn::functional::cross_entropy(mlp->forward(x), y);
         loss.backward();
         std::vector<torch::Tensor> grads;
         for (auto& p : mlp->parameters()) grads.push_back(p.grad().view(-1));
         auto flat = torch::cat(grads);
         dtrain::AllReduceOptions o;
         o.op = dtrain::ReduceOp::kAvg;
         dtrain::all_reduce(flat, o);
         int64_t off = 0;
         for (auto& p : mlp->parameters()) {
           auto n = p.numel();
           p.grad().view(-1).copy_(flat.slice(0, off, off + n));
           off += n;
         }
         sgd.step();
       }},
  };

  if (rank == 0) {
    std::printf("diagnosis_bench: %d ranks, %d rounds per level, machine: %s\n",
                group->world_size(), rounds, machine.c_str());
  }
  for (auto& w : workloads) {
    for (int i = 0; i < w.iters / 10 + 1; ++i) w.run();  // warm-up
    std::vector<double> per_level[3];
    for (int r = 0; r < rounds; ++r) {
      for (int l = 0; l < 3; ++l) {
        dtrain::set_debug_level(*group, levels[l]);
        dtrain::barrier();
        auto t0 = Clock::now();
        for (int i = 0; i < w.iters; ++i) w.run();
        double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / w.iters;
        // The slowest rank's time (measured with recording off, so it costs nothing itself).
        dtrain::set_debug_level(*group, dtrain::DebugLevel::kOff);
        auto slowest = torch::full({1}, us, torch::kFloat64);
        dtrain::AllReduceOptions mx;
        mx.op = dtrain::ReduceOp::kMax;
        dtrain::all_reduce(slowest, mx);
        per_level[l].push_back(slowest.item<double>());
      }
    }
    const double off = median(per_level[0]);
    for (int l = 0; l < 3; ++l) {
      const double t = median(per_level[l]);
      if (rank == 0) {
        std::printf("  %-6s %-6s %9.1f us/iter  x%.3f vs off  (%+.1f us; machine: %s)\n", w.name,
                    dtrain::to_string(levels[l]), t, t / off, t - off, machine.c_str());
      }
    }
  }
  std::fflush(stdout);
  return 0;
}
