// hvd's DistributedOptimizer against dtrain DDP, and fusion on vs off. Run it under the launcher:
//   dtrain run --nproc-per-node 2 build/bench/horovod_bench [--steps 200] [--batch 64] [--rounds 3]
//   [--rounds-only]
// 1. The example's MLP (784-512-256-10, float32, SGD, batch 64 per rank, synthetic data):
//    steps/s with hvd::DistributedOptimizer and with dtrain::DistributedDataParallel, in
//    alternating rounds (DDP first in even rounds, hvd first in odd ones) so both see the same
//    machine load; prints each round's hvd/DDP and the total (target >= 0.95), with the load
//    average (/proc/loadavg) before and after.
// 2. A 100-layer MLP (100 x Linear(32, 32): 200 small gradients): steps/s with fusion on
//    (HOROVOD_FUSION_THRESHOLD = 64 MiB) and off (0): one allreduce per gradient.
// Rank 0 prints the figures. Timing never fails anything.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/dtrain.h"
#include "dtrain/horovod.h"

namespace hvd = dtrain::hvd;
using Clock = std::chrono::steady_clock;

namespace {

torch::nn::Sequential example_mlp() {
  using namespace torch::nn;
  return Sequential(Linear(784, 512), ReLU(), Linear(512, 256), ReLU(), Linear(256, 10));
}

torch::nn::Sequential deep_mlp() {
  torch::nn::Sequential s;
  for (int i = 0; i < 100; ++i) {
    s->push_back(torch::nn::Linear(32, 32));
    s->push_back(torch::nn::ReLU());
  }
  return s;
}

// This process's CPU time (all threads) and context switches: what a step costs the machine,
// which wall time on a shared, loaded VM hides.
struct Usage {
  double cpu = 0;
  long switches = 0;
  static Usage now() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    Usage r;
    r.cpu =
        u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
    r.switches = u.ru_nvcsw + u.ru_nivcsw;
    return r;
  }
};
Usage g_hvd_usage, g_ddp_usage;  // summed over the timed loops

// Seconds for `steps` steps with hvd (hvd must be initialized).
double time_hvd(torch::nn::Sequential model, int in, int steps, int batch) {
  torch::optim::SGD sgd(model->parameters(), 0.01);
  hvd::DistributedOptimizer opt(sgd, model->named_parameters());
  auto x = torch::randn({batch, in});
  auto y = torch::randint(0, 10, {batch}, torch::kLong);
  auto run = [&](int n) {
    for (int s = 0; s < n; ++s) {
      opt.zero_grad();
      auto out = model->forward(x);
      torch::nn::functional::cross_entropy(out.narrow(1, 0, 10), y).backward();
      opt.step();
    }
  };
  run(5);  // warm-up
  hvd::barrier();
  auto t0 = Clock::now();
  const Usage u0 = Usage::now();
  run(steps);
  const Usage u1 = Usage::now();
  g_hvd_usage.cpu += u1.cpu - u0.cpu;
  g_hvd_usage.switches += u1.switches - u0.switches;
  hvd::barrier();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double time_ddp(torch::nn::Sequential model, int in, int steps, int batch) {
  dtrain::DistributedDataParallel ddp(model);
  torch::optim::SGD sgd(model->parameters(), 0.01);
  auto x = torch::randn({batch, in});
  auto y = torch::randint(0, 10, {batch}, torch::kLong);
  auto run = [&](int n) {
    for (int s = 0; s < n; ++s) {
      sgd.zero_grad();
      torch::nn::functional::cross_entropy(ddp(x).narrow(1, 0, 10), y).backward();
      sgd.step();
    }
  };
  run(5);
  dtrain::barrier();
  auto t0 = Clock::now();
  const Usage u0 = Usage::now();
  run(steps);
  const Usage u1 = Usage::now();
  g_ddp_usage.cpu += u1.cpu - u0.cpu;
  g_ddp_usage.switches += u1.switches - u0.switches;
  dtrain::barrier();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// DDP and hvd side by side in one process (each on its own group), alternating step by step
// (DDP first on even steps, hvd first on odd ones): both see the same load, moment to moment.
// Returns {DDP seconds, hvd seconds} over `steps` steps each.
std::pair<double, double> interleaved(int steps, int batch) {
  hvd::init();
  auto m1 = example_mlp();
  auto m2 = example_mlp();
  dtrain::DistributedDataParallel ddp(m1);
  torch::optim::SGD s1(m1->parameters(), 0.01);
  torch::optim::SGD s2(m2->parameters(), 0.01);
  hvd::DistributedOptimizer opt(s2, m2->named_parameters());
  auto x = torch::randn({batch, 784});
  auto y = torch::randint(0, 10, {batch}, torch::kLong);
  auto ddp_step = [&] {
    s1.zero_grad();
    torch::nn::functional::cross_entropy(ddp(x), y).backward();
    s1.step();
  };
  auto hvd_step = [&] {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(m2->forward(x), y).backward();
    opt.step();
  };
  for (int s = 0; s < 5; ++s) {
    ddp_step();
    hvd_step();
  }
  double td = 0, th = 0;
  auto timed = [](auto& f) {
    auto t0 = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  for (int s = 0; s < steps; ++s) {
    if (s % 2 == 0) {
      td += timed(ddp_step);
      th += timed(hvd_step);
    } else {
      th += timed(hvd_step);
      td += timed(ddp_step);
    }
  }
  hvd::shutdown();
  return {td, th};
}

std::string loadavg() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return "?";
  char buf[64] = {};
  const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  if (!ok) return "?";
  std::string s(buf);
  // The 1, 5 and 15 minute averages.
  size_t cut = 0;
  for (int k = 0; k < 3 && cut != std::string::npos; ++k) cut = s.find(' ', cut + 1);
  return s.substr(0, cut);
}

int arg(int argc, char** argv, const std::string& flag, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == flag) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = arg(argc, argv, "--steps", 200);
  const int batch = arg(argc, argv, "--batch", 64);
  const int rounds = arg(argc, argv, "--rounds", 3);
  bool only_ddp = false;
  bool rounds_only = false;  // --rounds-only: part 1 alone (profiling)
  for (int i = 1; i < argc; ++i) {
    only_ddp = only_ddp || std::string(argv[i]) == "--only-ddp";
    rounds_only = rounds_only || std::string(argv[i]) == "--rounds-only";
  }
  auto pg = dtrain::init_process_group();
  const bool root = pg->rank() == 0;
  torch::manual_seed(0);

  // 1. DistributedOptimizer vs DDP, alternating rounds.
  const std::string load_before = loadavg();
  double t_hvd = 0, t_ddp = 0;
  std::string per_round;
  std::vector<double> ratios;
  for (int r = 0; r < rounds; ++r) {
    double d = 0, h = 0;
    auto run_hvd = [&] {
      if (only_ddp) {  // --only-ddp: DDP twice per round (checks what one side does to the other)
        h = time_ddp(example_mlp(), 784, steps, batch);
        return;
      }
      hvd::init();
      h = time_hvd(example_mlp(), 784, steps, batch);
      hvd::shutdown();
    };
    if (r % 2 == 0) {
      d = time_ddp(example_mlp(), 784, steps, batch);
      run_hvd();
    } else {
      run_hvd();
      d = time_ddp(example_mlp(), 784, steps, batch);
    }
    t_ddp += d;
    t_hvd += h;
    ratios.push_back(d / h);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.2f", r ? " " : "", d / h);
    per_round += buf;
  }
  const double total = static_cast<double>(steps) * rounds;
  if (root) {
    std::printf(
        "example MLP, %d ranks, batch %d/rank, %d steps x %d rounds; load average %s before, %s "
        "after\n",
        pg->world_size(), batch, steps, rounds, load_before.c_str(), loadavg().c_str());
    std::sort(ratios.begin(), ratios.end());
    const double median = ratios.size() % 2
                              ? ratios[ratios.size() / 2]
                              : (ratios[ratios.size() / 2 - 1] + ratios[ratios.size() / 2]) / 2;
    std::printf("  hvd / DDP per round: %s (median %.3f)\n", per_round.c_str(), median);
    std::printf("  DDP                      %8.1f steps/s\n", total / t_ddp);
    std::printf("  hvd DistributedOptimizer %8.1f steps/s\n", total / t_hvd);
    std::printf("  hvd / DDP = %.3f (target >= 0.95)\n", t_ddp / t_hvd);
    std::printf(
        "  rank 0's CPU per step (all threads): DDP %.2f ms, %.1f context switches; hvd %.2f ms, "
        "%.1f "
        "context switches\n",
        1e3 * g_ddp_usage.cpu / total, g_ddp_usage.switches / total, 1e3 * g_hvd_usage.cpu / total,
        g_hvd_usage.switches / total);
  }
  g_hvd_usage = g_ddp_usage = Usage{};
  if (rounds_only) return 0;

  // 1b. The same comparison interleaved step by step.
  {
    const std::string before = loadavg();
    auto [td, th] = interleaved(steps * rounds, batch);
    if (root) {
      std::printf("interleaved step by step, %d steps each; load average %s before, %s after\n",
                  steps * rounds, before.c_str(), loadavg().c_str());
      std::printf("  DDP                      %8.1f steps/s\n", steps * rounds / td);
      std::printf("  hvd DistributedOptimizer %8.1f steps/s\n", steps * rounds / th);
      std::printf("  hvd / DDP = %.3f (target >= 0.95)\n", td / th);
    }
  }

  // 2. Fusion on vs off on 200 small gradients.
  double t_on = 0, t_off = 0;
  const int deep_steps = std::max(steps / 2, 10);
  for (int r = 0; r < rounds; ++r) {
    ::setenv("HOROVOD_FUSION_THRESHOLD", "67108864", 1);
    hvd::init();
    t_on += time_hvd(deep_mlp(), 32, deep_steps, batch);
    hvd::shutdown();
    ::setenv("HOROVOD_FUSION_THRESHOLD", "0", 1);
    hvd::init();
    t_off += time_hvd(deep_mlp(), 32, deep_steps, batch);
    hvd::shutdown();
  }
  if (root) {
    const double n = static_cast<double>(deep_steps) * rounds;
    std::printf("100-layer MLP (200 gradients of 32x32/32), %d steps x %d rounds\n", deep_steps,
                rounds);
    std::printf("  fusion on  (64 MiB)  %8.1f steps/s\n", n / t_on);
    std::printf("  fusion off (0)       %8.1f steps/s\n", n / t_off);
    std::printf("  fusion on / off = %.2fx\n", t_off / t_on);
  }
  return 0;
}
