// The training of the elastic test (hvd_elastic_worker.cpp runs it on real ranks,
// hvd_elastic_test.cpp replays it in one process to know the values to expect).
#pragma once

#include <torch/torch.h>

namespace hvd_elastic_test {

inline constexpr int kSteps = 8;        // optimizer steps in all
inline constexpr int kCommitEvery = 2;  // state.commit() after steps 2, 4, 6, 8
inline constexpr int kKillStep = 5;
inline constexpr int kAdasumSteps = 3;
inline constexpr int kGrowStep =
    3;  // grow mode: a third host is listed after this step  // DistributedOptimizer with op Adasum
        // // the victim SIGKILLs itself before this step (first attempt)

inline torch::nn::Linear make_model() {
  torch::manual_seed(7);
  torch::nn::Linear model(4, 1);
  model->to(torch::kFloat64);
  return model;
}

inline torch::optim::SGD make_optimizer(torch::nn::Linear& model) {
  // Momentum: the optimizer's state matters, so a restore that lost it would show.
  return torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
}

// Rank `rank`'s batch at `step`: depends on both, so the world size changes the average.
inline std::pair<torch::Tensor, torch::Tensor> batch(int step, int rank) {
  auto x = torch::arange(16, torch::kFloat64).reshape({4, 4}) / 16.0 + 0.1 * step - 0.3 * rank;
  auto y = x.sum(1, true) * (1.0 + 0.5 * rank) - step * 0.01;
  return {x, y};
}

inline torch::Tensor loss(torch::nn::Linear& model, int step, int rank) {
  auto [x, y] = batch(step, rank);
  return torch::mse_loss(model->forward(x), y);
}

inline double param_sum(torch::nn::Linear& model) {
  double s = 0;
  for (auto& p : model->parameters()) s += p.sum().item<double>();
  return s;
}

}  // namespace hvd_elastic_test
