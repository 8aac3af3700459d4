// The optimizer the ZeRO engine runs on a rank's flat partition (or on everything at stage 0):
// its state tensors, its step, and the names they carry in checkpoints. The engine owns the
// partition, its averaged gradient, the learning-rate schedule and where the state lives
// (offload); an optimizer only updates `w` from `g`.
//
// make_partition_optimizer is the one place that maps the config's optimizer type to code:
//   Adam, AdamW   PyTorch's formulas; a fused, vectorised CPU pass (cpu_adam_step) whenever the
//                 partition and its state are flat CPU arrays. State: exp_avg, exp_avg_sq.
//   SGD           momentum, dampening, nesterov as torch::optim::SGD. State: momentum_buffer
//                 (only with momentum > 0).
//   RMSprop       torch.optim.RMSprop's single-tensor step (alpha, eps, momentum, centered).
//                 State: square_avg, momentum_buffer (momentum > 0), grad_avg (centered).
//   Lamb          Adam's moments with a per-parameter trust ratio; its norms cover whole
//                 parameters, summed over the ranks holding pieces of them. State: exp_avg,
//                 exp_avg_sq.
//   Adagrad       torch.optim.Adagrad's formula (lr_decay, initial_accumulator_value); state: sum.
//                 With offload_optimizer DeepSpeed's CPU Adagrad instead (cpu_optimizers.h); state:
//                 exp_avg_sq. The names are the ones DeepSpeed's checkpoints carry.
//   Lion          With offload_optimizer DeepSpeed's CPU Lion (cpu_optimizers.h). State: exp_avg,
//                 and the exp_avg_sq DeepSpeed's allocates and never reads (zeros). Without it
//                 DeepSpeed's FusedLion (a CUDA kernel), as float32 tensor ops on any device.
//                 State: exp_avg.
//   client        InitOptions::optimizer (any torch::optim optimizer with one group), re-pointed
//                 at the partition; its state is opaque (torch::serialize bytes).
// Not thread-safe; the engine calls it from the thread that calls step().
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/zero_config.h"

namespace dtrain::zero::detail {

// The checkpoint "type" of InitOptions::optimizer's state.
inline constexpr const char* kClientOptimizerType = "client";

class PartitionOptimizer {
 public:
  // What a step sees besides the partition and its gradient.
  struct StepArgs {
    int64_t step = 0;  // 1-based number of this update
    // This update's values (the scheduler's, or the configured ones).
    double lr = 0, beta1 = 0, beta2 = 0;
    bool scheduled = false;  // a config scheduler sets the rate (the client's group lr follows it)
    // OneCycle's cycled momentum: the client's betas follow beta1, beta2 (torch's Adam, AdamW).
    bool cycled_betas = false;
    // torch's OneCycleLR with cycle_momentum: this update's "momentum" (SGD, RMSprop, and a
    // client SGD or RMSprop); negative: the optimizer's own.
    double momentum = -1;
    // The flat layout of the trainable parameters and where `w` starts in it (Lamb's
    // per-parameter norms).
    const std::vector<int64_t>* offsets = nullptr;
    const std::vector<int64_t>* numels = nullptr;
    int64_t base = 0;
    // Sums a small float64 tensor over the ranks whose partitions make up the parameters (a
    // no-op when this rank updates everything).
    std::function<void(torch::Tensor&)> sum_over_ranks;
  };

  virtual ~PartitionOptimizer() = default;
  // The checkpoint's "type": the config's optimizer type, or kClientOptimizerType.
  virtual std::string type() const = 0;
  // The checkpoint names of state(), in order.
  virtual std::vector<std::string> state_names() const = 0;
  // InitOptions::optimizer, or null for the config's optimizer.
  virtual const torch::optim::Optimizer* client() const { return nullptr; }
  // The learning rate when no scheduler sets it.
  virtual double lr() const = 0;
  // One update of `w` (the partition, or the fp32 master) with its averaged gradient `g`.
  virtual void step(const torch::Tensor& w, const torch::Tensor& g, const StepArgs& a) = 0;
  // State kept as opaque bytes per partition (the client optimizer's): it loads only at the
  // world size that saved it. Built-in optimizers' state is state(), re-cut at any world size.
  virtual bool opaque() const { return false; }
  virtual torch::Tensor save_opaque() { return {}; }
  virtual void load_opaque(const torch::Tensor& /*bytes*/) {}

  // The state tensors, each shaped like the partition it updates.
  std::vector<torch::Tensor>& state() { return state_; }
  const std::vector<torch::Tensor>& state() const { return state_; }

 protected:
  std::vector<torch::Tensor> state_;
};

// True when a client optimizer holds no state but what its constructor made: none, or
// torch::optim::Adagrad's (step 0, sum = initial_accumulator_value for every parameter), which
// the re-pointed optimizer makes again for the partition.
bool has_only_constructor_state(const torch::optim::Optimizer& client);

// `partition`: the tensor the optimizer will update (its state is made like it; a client
// optimizer's one group is re-pointed at it for good, since it keys its state by tensor).
// `offload_optimizer`: ZeRO-Offload's CPU optimizer is the one DeepSpeed builds (Adagrad's
// differs from torch's).
// REQUIRES: exactly one of config.given and client.
std::unique_ptr<PartitionOptimizer> make_partition_optimizer(
    const OptimizerConfig& config, std::shared_ptr<torch::optim::Optimizer> client,
    const torch::Tensor& partition, bool offload_optimizer);

}  // namespace dtrain::zero::detail
