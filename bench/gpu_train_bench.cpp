// One process training on one GPU: the example's MLP (784-512-256-10) and CNN (2 conv layers
// with BatchNorm and pooling), Adam lr 1e-3, cross-entropy, at a given batch size - the C++ side
// of bench/gpu_bench.py, whose Python peer (bench/gpu_train_peer.py) runs the same models in
// PyTorch eager mode. Inputs are Fashion-MNIST-shaped random tensors already on the GPU (no data
// loading on either side); the clock runs over --steps optimizer steps after --warmup, between
// two device synchronisations. Prints one JSON line per run.
//
//   gpu_train_bench --model mlp|cnn --batch 64 --steps 300 --optimizer torch|fused [--graph]
//   gpu_train_bench --runs mlp:64:300,cnn:1024:100 ...   several runs in one process, in turn
//                                                        (one start-up of CUDA for all)
//
// --optimizer torch: libtorch's torch::optim::Adam (a loop over parameters, ~10 kernels each).
// --optimizer fused: ATen's fused multi-tensor Adam kernel (_fused_adam_), what PyTorch's
// Adam(fused=True) calls - one launch for all parameters.
// --graph (with --optimizer fused; a CUDA build): the whole step - forward, backward, Adam -
// captured once as a CUDA graph (at::cuda::CUDAGraph) and replayed, one launch per step instead
// of one per kernel: what PyTorch's torch.cuda.graph "whole network capture" does in Python
// (the peer's --graph). The fused kernel keeps its step counts on the GPU, so a replayed step
// is a real step; libtorch's Adam counts on the CPU and cannot be captured.
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#ifdef DTRAIN_BENCH_CUDA_GRAPH
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

torch::nn::Sequential make(const std::string& kind) {
  using namespace torch::nn;
  if (kind == "mlp") {
    return Sequential(Flatten(), Linear(784, 512), ReLU(), Linear(512, 256), ReLU(),
                      Linear(256, 10));
  }
  return Sequential(Conv2d(Conv2dOptions(1, 32, 3).padding(1)), BatchNorm2d(32), ReLU(),
                    MaxPool2d(2), Conv2d(Conv2dOptions(32, 64, 3).padding(1)), BatchNorm2d(64),
                    ReLU(), MaxPool2d(2), Flatten(), Linear(64 * 7 * 7, 128), ReLU(),
                    Linear(128, 10));
}

// Adam through ATen's fused kernel: the state lives in flat lists, updated in one launch.
class FusedAdam {
 public:
  FusedAdam(std::vector<torch::Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
    for (auto& p : params_) {
      exp_avg_.push_back(torch::zeros_like(p));
      exp_avg_sq_.push_back(torch::zeros_like(p));
      steps_.push_back(torch::zeros({}, p.options()));
    }
  }
  void zero_grad() {
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  }
  void step() {
#if TORCH_VERSION_MAJOR >= 2
    std::vector<torch::Tensor> grads;
    for (auto& p : params_) grads.push_back(p.grad());
    torch::NoGradGuard no_grad;
    at::_fused_adam_(params_, grads, exp_avg_, exp_avg_sq_, {}, steps_, lr_, 0.9, 0.999, 0.0, 1e-8,
                     /*amsgrad=*/false, /*maximize=*/false);
#else
    throw std::runtime_error("--optimizer fused needs libtorch 2.x");
#endif
  }

 private:
  std::vector<torch::Tensor> params_, exp_avg_, exp_avg_sq_, steps_;
  double lr_;
};

struct Run {
  std::string model;
  int64_t batch = 64, steps = 300;
};

// "mlp:64:300,cnn:1024:100" -> runs; throws std::invalid_argument on a malformed entry.
std::vector<Run> parse_runs(const std::string& list) {
  std::vector<Run> runs;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    const std::string item = list.substr(start, end - start);
    const size_t a = item.find(':'), b = item.find(':', a == std::string::npos ? a : a + 1);
    if (a == std::string::npos || b == std::string::npos)
      throw std::invalid_argument("--runs entry '" + item + "' is not MODEL:BATCH:STEPS");
    runs.push_back({item.substr(0, a), std::stoll(item.substr(a + 1, b - a - 1)),
                    std::stoll(item.substr(b + 1))});
    start = end + 1;
  }
  return runs;
}

// One timed run; prints its JSON line.
void run_one(const Run& r, const std::string& optimizer, bool graph, int64_t warmup) {
  const std::string& model_kind = r.model;
  const int64_t batch = r.batch, steps = r.steps;
  torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(0);
  auto model = make(model_kind);
  model->to(dev);
  auto x = torch::randn({batch, 1, 28, 28}, torch::TensorOptions().device(dev));
  auto y = torch::randint(0, 10, {batch}, torch::TensorOptions(torch::kLong).device(dev));
  torch::optim::Adam torch_adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  FusedAdam fused(model->parameters(), 1e-3);
  auto one_step = [&] {
    if (optimizer == "fused") {
      fused.zero_grad();
    } else {
      torch_adam.zero_grad();
    }
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    if (optimizer == "fused") {
      fused.step();
    } else {
      torch_adam.step();
    }
  };
  std::function<void()> timed_step = one_step;
#ifdef DTRAIN_BENCH_CUDA_GRAPH
  at::cuda::CUDAGraph captured;
  if (graph) {
    // As torch.cuda.graph asks: warm up on a side stream (cuBLAS handles and workspaces, the
    // allocator's blocks), then capture on it. The gradients are unset before the capture, so
    // backward allocates them from the graph's own pool and every replay writes (not adds)
    // them there; Adam's state and step counts are ordinary tensors the graph updates in place.
    auto side = c10::cuda::getStreamFromPool();
    auto main_stream = c10::cuda::getCurrentCUDAStream();
    at::cuda::CUDAEvent ready;
    ready.record(main_stream);
    ready.block(side);
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      for (int i = 0; i < 3; ++i) one_step();
      fused.zero_grad();
      torch::cuda::synchronize();
      captured.capture_begin();
      auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      loss.backward();
      fused.step();
      captured.capture_end();
    }
    torch::cuda::synchronize();
    timed_step = [&captured] { captured.replay(); };
  }
#endif
  for (int64_t i = 0; i < warmup; ++i) timed_step();
  torch::cuda::synchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) timed_step();
  torch::cuda::synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "{\"side\": \"dtrain-cpp\", \"model\": \"%s\", \"batch\": %lld, \"optimizer\": \"%s\", "
      "\"graph\": %s, \"steps\": %lld, \"seconds\": %.4f, \"samples_per_s\": %.1f}\n",
      model_kind.c_str(), static_cast<long long>(batch), optimizer.c_str(),
      graph ? "true" : "false", static_cast<long long>(steps), secs,
      static_cast<double>(batch * steps) / secs);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_kind = "mlp", optimizer = "torch", runs_list;
  int64_t batch = 64, steps = 300, warmup = 30;
  bool graph = false;
  for (int i = 1; i < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--graph") {
      graph = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "gpu_train_bench: %s needs a value\n", k.c_str());
      return 2;
    }
    std::string v = argv[i + 1];
    if (k == "--model") {
      model_kind = v;
    } else if (k == "--batch") {
      batch = std::stoll(v);
    } else if (k == "--steps") {
      steps = std::stoll(v);
    } else if (k == "--warmup") {
      warmup = std::stoll(v);
    } else if (k == "--optimizer") {
      optimizer = v;
    } else if (k == "--runs") {
      runs_list = v;
    } else {
      std::fprintf(stderr, "gpu_train_bench: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  std::vector<Run> runs{{model_kind, batch, steps}};
  if (!runs_list.empty()) {
    try {
      runs = parse_runs(runs_list);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpu_train_bench: %s\n", e.what());
      return 2;
    }
  }
  if (graph && optimizer != "fused") {
    std::fprintf(stderr,
                 "gpu_train_bench: --graph needs --optimizer fused (libtorch's Adam keeps its "
                 "step count on the CPU, which a captured step would not advance)\n");
    return 2;
  }
#ifndef DTRAIN_BENCH_CUDA_GRAPH
  if (graph) {
    std::fprintf(stderr, "gpu_train_bench: --graph needs a CUDA build of dtrain\n");
    return 2;
  }
#endif
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "gpu_train_bench: no GPU visible (a CUDA build of dtrain is needed)\n");
    return 2;
  }
  for (const auto& r : runs) run_one(r, optimizer, graph, warmup);
  return 0;
}
