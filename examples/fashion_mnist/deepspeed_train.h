// Fashion-MNIST under the ZeRO engine, driven by a DeepSpeed config (--deepspeed CONFIG).
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

namespace fashion_mnist {

struct DeepSpeedRun {
  std::string config;  // path to the DeepSpeed JSON (or JSON text)
  int epochs = 3;
  std::string model = "mlp";
  std::string data_dir;
  uint64_t seed = 0;
  int64_t max_steps = 0;
  bool no_eval = false;
  int log_every = 100;
  std::string backend = "auto";
};

// The model of main.cpp's --model (mlp, cnn, wide).
torch::nn::Sequential make_model(const std::string& kind);

int train_deepspeed(const DeepSpeedRun& run);

}  // namespace fashion_mnist
