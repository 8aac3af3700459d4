// Model parallelism benchmarks (#16), ranks as threads of this process over loopback Gloo.
//
// 1. Pipeline bubble. Every stage is a synthetic layer that sleeps tf ms forward and tb ms
//    backward (one custom autograd function, which also does the stage's product with its
//    weight and its gradients, all timed as busy; --stage spin busy-waits instead of
//    sleeping), so a stage's busy time is known exactly and the
//    figure measures the schedule and its send/recv, not how many cores the machine has. For
//    P stages and M micro-batches GPipe and 1F1B ideally take (M + P - 1)(tf + tb) per step,
//    a bubble fraction of (P - 1)/(M + P - 1); interleaved 1F1B with V chunks per rank
//    (each chunk tf/V, tb/V) ideally M(tf + tb) + (P - 1)(tf + tb)/V. Printed: measured step
//    time (first stage's start to the last rank's return from train_step, one clock since
//    ranks are threads), ideal, their ratio, and the measured bubble fraction 1 - M(tf+tb)/step
//    next to the ideal one; then the busy time the stages really took (sleeps overrun on a
//    loaded machine) and 1 - busy/step, both bubbles over the ideal one (meas/ideal,
//    busy/ideal), and the old barrier-to-barrier step time. The machine (cores, CPU, OS) and
//    the load average before and after are printed with the figures.
// 2. Memory per rank under tensor parallelism: a transformer block's parameters, gradients
//    and Adam state, counted from the tensors each rank holds after one step, for T = 1, 2, 4.
//
//   build/bench/model_parallel_bench [--steps N] [--tf MS] [--tb MS] [--p 2,4] [--m 1,4,8,16]
//   [--stage sleep|spin] [--no-memory]
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/prctl.h>

#include "dtrain/pipeline.h"
#include "dtrain/process_group.h"
#include "dtrain/tensor_parallel.h"

namespace {

using Clock = std::chrono::steady_clock;
int g_port = 29650;

// Runs fn(group) on `world` threads, each rank joining a Gloo group through tcp://.
void run_ranks(int world, const std::function<void(std::shared_ptr<dtrain::ProcessGroup>)>& fn) {
  const int port = g_port++;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      dtrain::ProcessGroupOptions o;
      o.backend = "gloo";
      o.init_method = "tcp://127.0.0.1:" + std::to_string(port);
      o.rank = r;
      o.world_size = world;
      o.timeout = std::chrono::seconds(60);
      fn(dtrain::init_process_group(o));
    });
  }
  for (auto& t : threads) t.join();
}

// Busy time of one rank: what its stages' forwards and backwards really took (a sleep
// overruns its request, more so on a loaded machine), added up in nanoseconds.
using Busy = std::atomic<int64_t>;

void add_busy(Busy* busy, Clock::time_point since) {
  busy->fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count());
}

bool g_spin = false;  // --stage spin: stages compute (busy-wait) instead of sleeping

// A stage's work of `ms`: sleep, or spin on the CPU until the time is up (--stage spin).
void stage_work(double ms) {
  if (!g_spin) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
    return;
  }
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double, std::milli>(ms));
  while (Clock::now() < until) {
  }
}

// The whole stage is this one function, so that everything it does (the product with its
// weight, the sleep, the copy; in backward the sleep and both gradients) counts as its busy
// time: the rest of a rank's step is the pipeline's own (sends, receives, autograd's engine).
struct Sleep : torch::autograd::Function<Sleep> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w, double f_ms, double b_ms, int64_t busy) {
    const auto t0 = Clock::now();
    ctx->saved_data["b"] = b_ms;
    ctx->saved_data["busy"] = busy;
    ctx->save_for_backward({x, w});
    stage_work(f_ms);
    torch::Tensor y = x * w;
    add_busy(reinterpret_cast<Busy*>(busy), t0);
    return y;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list g) {
    const auto t0 = Clock::now();
    stage_work(ctx->saved_data["b"].toDouble());
    auto saved = ctx->get_saved_variables();
    torch::Tensor gx = g[0] * saved[1], gw = (g[0] * saved[0]).sum().reshape({1});
    add_busy(reinterpret_cast<Busy*>(ctx->saved_data["busy"].toInt()), t0);
    return {gx, gw, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class SleepStageImpl : public torch::nn::Module {
 public:
  SleepStageImpl(double f, double b, Busy* busy) : f_(f), b_(b), busy_(busy) {
    w = register_parameter("w", torch::ones({1}));
  }
  // A function of w too: stage 0's input needs no gradient, and autograd skips the backward
  // of a function none of whose inputs needs one.
  torch::Tensor forward(const torch::Tensor& x) {
    return Sleep::apply(x, w, f_, b_, static_cast<int64_t>(reinterpret_cast<intptr_t>(busy_)));
  }
  torch::Tensor w;

 private:
  double f_, b_;
  Busy* busy_;
};
TORCH_MODULE(SleepStage);

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

void bubble(int steps, double tf, double tb, const std::vector<int>& Ps,
            const std::vector<int>& Ms) {
  std::printf(
      "# pipeline bubble: synthetic stages (forward %.0f ms, backward %.0f ms per micro-batch and "
      "rank), median of %d steps\n",
      tf, tb, steps);
  std::printf(
      "# bubble_meas = 1 - M(tf+tb)/step (the requested stage time); bubble_busy = 1 - busy/step "
      "with busy the\n"
      "# time the rank's stages really took (mean over ranks; sleeps overrun), the rest being "
      "waits on the pipeline\n");
  std::printf(
      "# step_ms: first stage's start to the last rank's end of train_step; barrier_ms: rank 0 "
      "from barrier to\n"
      "# barrier around train_step (median; includes the bench's barrier after the step)\n");
  std::printf(
      "# meas/ideal = bubble_meas / bubble_ideal; busy/ideal = bubble_busy / bubble_ideal (the "
      "bubble counted from\n"
      "# the compute the stages really did: the ideal step for those stage times is busy (M + "
      "(P-1)/V) / M)\n");
  std::printf("%-17s %2s %3s %2s %10s %10s %7s %13s %11s %9s %12s %10s %10s %10s\n", "schedule",
              "P", "M", "V", "step_ms", "ideal_ms", "ratio", "bubble_meas", "bubble_ideal",
              "busy_ms", "bubble_busy", "meas/ideal", "busy/ideal", "barrier_ms");
  struct Case {
    dtrain::Schedule s;
    int P, M, V;
  };
  std::vector<Case> cases;
  for (int P : Ps) {
    for (int M : Ms) {
      cases.push_back({dtrain::Schedule::kGPipe, P, M, 1});
      cases.push_back({dtrain::Schedule::kOneFOneB, P, M, 1});
      if (M % P == 0) cases.push_back({dtrain::Schedule::kInterleavedOneFOneB, P, M, 2});
    }
  }
  for (const Case& c : cases) {
    // Per step: rank 0's start, the last rank's end of train_step, busy time summed over
    // ranks, and rank 0's time from one barrier to the next (the old figure).
    std::vector<Clock::time_point> start(steps + 1), end(steps + 1);
    std::vector<double> busy_ms(steps + 1, 0.0), with_barrier(steps + 1, 0.0);
    std::mutex mu;
    run_ranks(c.P, [&](std::shared_ptr<dtrain::ProcessGroup> g) {
      // The stages sleep on this thread (autograd runs a CPU backward on the caller's thread):
      // the least timer slack the kernel allows, so a sleep ends when asked rather than up
      // to 50 us later (the default slack), which would count as bubble in bubble_meas.
      prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
      Busy busy{0};
      std::vector<torch::nn::Sequential> stages;
      for (int i = 0; i < c.P * c.V; ++i)
        stages.push_back(torch::nn::Sequential(SleepStage(tf / c.V, tb / c.V, &busy)));
      dtrain::Pipeline pipe(stages, g, {c.s, c.M, c.V});
      auto loss = [](const torch::Tensor& out, const torch::Tensor&) { return out.sum(); };
      torch::Tensor x = torch::ones({c.M, 4});
      for (int s = 0; s < steps + 1; ++s) {
        g->barrier();
        busy = 0;
        auto t0 = Clock::now();
        pipe.train_step(x, x, loss);
        const auto t1 = Clock::now();
        g->barrier();
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        std::lock_guard<std::mutex> lock(mu);
        busy_ms[s] += busy.load() / 1e6;
        end[s] = std::max(end[s], t1);
        if (g->rank() == 0) {
          start[s] = t0;
          with_barrier[s] = ms;
        }
      }
    });
    // A step runs from the moment the first stage starts (rank 0 leaves the barrier; the
    // others have nothing to do before its first send) to the moment the last rank returns
    // from train_step: ranks are threads, so one clock times them all. The median over the
    // steps after the first (which also exchanges the shapes), and that step's busy time.
    std::vector<double> times;
    for (int s = 1; s <= steps; ++s)
      times.push_back(std::chrono::duration<double, std::milli>(end[s] - start[s]).count());
    std::vector<size_t> order(times.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return times[a] < times[b]; });
    const size_t mid = order[order.size() / 2];
    const double step = times[mid];
    const double busy = busy_ms[mid + 1] / c.P;
    std::vector<double> wb(with_barrier.begin() + 1, with_barrier.end());
    std::sort(wb.begin(), wb.end());
    const double work = c.M * (tf + tb);
    const double ideal = work + (c.P - 1) * (tf + tb) / c.V;
    const double bubble_ideal = 1.0 - work / ideal;
    std::printf(
        "%-17s %2d %3d %2d %10.1f %10.1f %7.3f %13.3f %11.3f %9.1f %12.3f %10.3f %10.3f %10.1f\n",
        dtrain::schedule_name(c.s).c_str(), c.P, c.M, c.V, step, ideal, step / ideal,
        1.0 - work / step, bubble_ideal, busy, 1.0 - busy / step,
        (1.0 - work / step) / bubble_ideal, (1.0 - busy / step) / bubble_ideal, wb[wb.size() / 2]);
    std::fflush(stdout);
  }
}

void memory() {
  const int64_t d = 512;
  std::printf(
      "# tensor-parallel memory per rank: one transformer MLP + attention projections, d_model "
      "%lld, Adam\n",
      static_cast<long long>(d));
  std::printf("%2s %14s %14s %12s\n", "T", "params_per_rank", "bytes_per_rank", "vs_T1");
  double t1 = 0;
  for (int T : {1, 2, 4}) {
    int64_t bytes = 0, params = 0;
    run_ranks(T, [&](std::shared_ptr<dtrain::ProcessGroup> g) {
      torch::nn::Sequential block;
      block->push_back(std::string("qkv"), dtrain::ColumnParallelLinear(d, 3 * d, g, true, false));
      block->push_back(std::string("proj"), dtrain::RowParallelLinear(3 * d, d, g, true, true));
      block->push_back(std::string("fc1"), dtrain::ColumnParallelLinear(d, 4 * d, g, true, false));
      block->push_back(std::string("act"), torch::nn::GELU());
      block->push_back(std::string("fc2"), dtrain::RowParallelLinear(4 * d, d, g, true, true));
      torch::optim::Adam opt(block->parameters(), 1e-3);
      torch::Tensor x = torch::randn({8, d});
      block->forward(x).sum().backward();
      opt.step();
      if (g->rank() != 0) return;
      int64_t b = 0, n = 0;
      for (const auto& p : block->parameters()) {
        n += p.numel();
        b += p.numel() * 4 + p.grad().numel() * 4;
      }
      for (const auto& st : opt.state()) {
        auto& s = static_cast<torch::optim::AdamParamState&>(*st.second);
        b += s.exp_avg().numel() * 4 + s.exp_avg_sq().numel() * 4;
      }
      bytes = b;
      params = n;
    });
    if (T == 1) t1 = static_cast<double>(bytes);
    std::printf("%2d %14lld %14lld %12.3f\n", T, static_cast<long long>(params),
                static_cast<long long>(bytes), bytes / t1);
  }
}

// The first line of `path` that starts with `prefix` (after it), or "" when there is none.
std::string first_line(const char* path, const std::string& prefix = "") {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, prefix.size(), prefix) == 0) return line.substr(prefix.size());
  }
  return "";
}

// What the figures were measured on: CPU model, cores, OS, whether it is a VM.
std::string machine() {
  std::string cpu = first_line("/proc/cpuinfo", "model name");
  cpu = cpu.substr(
      std::min(cpu.size(), cpu.find(':') == std::string::npos ? cpu.size() : cpu.find(':') + 2));
  std::string os = first_line("/etc/os-release", "PRETTY_NAME=");
  os.erase(std::remove(os.begin(), os.end(), '"'), os.end());
  const bool vm = first_line("/proc/cpuinfo", "flags").find(" hypervisor") != std::string::npos;
  return std::to_string(std::thread::hardware_concurrency()) + " cores (" +
         (cpu.empty() ? "unknown CPU" : cpu) + "), " + (os.empty() ? "unknown OS" : os) +
         (vm ? ", a VM" : "");
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5;
  double tf = 10, tb = 20;
  std::vector<int> Ps = {2, 4}, Ms = {1, 4, 8, 16};
  bool mem = true;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--no-memory"))
      mem = false;
    else if (has_value && !std::strcmp(argv[i], "--stage")) {
      const std::string v = argv[++i];
      if (v != "sleep" && v != "spin") {
        std::fprintf(stderr,
                     "model_parallel_bench: --stage %s: use sleep (the stages sleep) or spin (they "
                     "busy-wait)\n",
                     v.c_str());
        return 2;
      }
      g_spin = v == "spin";
    } else if (has_value && !std::strcmp(argv[i], "--steps"))
      steps = std::atoi(argv[++i]);
    else if (has_value && !std::strcmp(argv[i], "--tf"))
      tf = std::atof(argv[++i]);
    else if (has_value && !std::strcmp(argv[i], "--tb"))
      tb = std::atof(argv[++i]);
    else if (has_value && !std::strcmp(argv[i], "--p"))
      Ps = parse_list(argv[++i]);
    else if (has_value && !std::strcmp(argv[i], "--m"))
      Ms = parse_list(argv[++i]);
    else {
      std::fprintf(stderr,
                   "model_parallel_bench: unknown or incomplete option '%s'; use --steps N --tf MS "
                   "--tb MS --p 2,4 --m 1,4,8,16 --stage sleep|spin --no-memory\n",
                   argv[i]);
      return 2;
    }
  }
  torch::set_num_threads(1);
  std::printf("# machine: %s; ranks are threads of one process, Gloo over loopback\n",
              machine().c_str());
  std::printf("# load average at the start: %s\n", first_line("/proc/loadavg").c_str());
  bubble(steps, tf, tb, Ps, Ms);
  std::printf("# load average after the pipeline cases: %s\n", first_line("/proc/loadavg").c_str());
  if (mem) memory();
  return 0;
}
