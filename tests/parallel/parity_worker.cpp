// Trains a model for a few steps on deterministic synthetic data and saves rank 0's final
// parameters, so a test can compare DDP on N ranks (per-rank batch b) with one process
// (batch N*b) over the same samples.
//   parity_worker --model mlp|cnn --steps S --batch B --global-batch G --out FILE [--float32]
// Rank r of a world of W reads rows [s*G + r*B, s*G + r*B + B) at step s (G = W*B under DDP,
// and G = B for the single-process reference).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "dtrain/dtrain.h"

int main(int argc, char** argv) {
  CLI::App app{"DDP parity worker"};
  std::string model_kind = "mlp", out;
  int steps = 20, batch = 8, global_batch = 8;
  bool float32 = false;
  app.add_option("--model", model_kind)->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--steps", steps);
  app.add_option("--batch", batch);
  app.add_option("--global-batch", global_batch);
  app.add_option("--out", out)->required();
  app.add_flag("--float32", float32);
  CLI11_PARSE(app, argc, argv);

  auto pg = dtrain::init_process_group();
  const auto dtype = float32 ? torch::kFloat32 : torch::kFloat64;
  torch::manual_seed(1234);
  using namespace torch::nn;
  Sequential model;
  torch::Tensor x_all;
  if (model_kind == "mlp") {
    model = Sequential(Linear(784, 512), ReLU(), Linear(512, 256), ReLU(), Linear(256, 10));
    x_all = torch::randn({static_cast<int64_t>(steps) * global_batch, 784});
  } else {
    model = Sequential(Conv2d(Conv2dOptions(1, 4, 3).padding(1)), dtrain::SyncBatchNorm(4), ReLU(),
                       MaxPool2d(2), Conv2d(Conv2dOptions(4, 8, 3).padding(1)),
                       dtrain::SyncBatchNorm(8), ReLU(), MaxPool2d(2), Flatten(),
                       Linear(8 * 7 * 7, 10));
    x_all = torch::randn({static_cast<int64_t>(steps) * global_batch, 1, 28, 28});
  }
  auto y_all = torch::randint(0, 10, {static_cast<int64_t>(steps) * global_batch}, torch::kLong);
  model->to(dtype);
  x_all = x_all.to(dtype);
  dtrain::DistributedDataParallel ddp(model);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  for (int s = 0; s < steps; ++s) {
    int64_t start =
        static_cast<int64_t>(s) * global_batch + static_cast<int64_t>(pg->rank()) * batch;
    auto x = x_all.narrow(0, start, batch);
    auto y = y_all.narrow(0, start, batch);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(ddp(x), y).backward();
    opt.step();
  }
  if (pg->rank() == 0) {
    std::vector<torch::Tensor> params;
    for (auto& p : model->parameters()) params.push_back(p.detach().clone());
    for (auto& b : model->buffers()) params.push_back(b.detach().clone());
    torch::save(params, out);
    std::printf("saved %zu tensors to %s\n", params.size(), out.c_str());
  }
  return 0;
}
