// FusedAdam: torch::optim::Adam whose step is one fused pass over each parameter - what
// PyTorch's `torch.optim.Adam(params, fused=True)` is for Python, for the C++ frontend.
//
//   dtrain::FusedAdam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
//   optimizer.zero_grad();
//   loss.backward();
//   optimizer.step();
//
// It IS a torch::optim::Adam: the same AdamOptions (lr, betas, eps, weight_decay as L2 added to
// the gradient, amsgrad), param groups, per-parameter state (AdamParamState: step, exp_avg,
// exp_avg_sq, max_exp_avg_sq) and serialisation. So learning-rate changes through
// param_groups(), save_checkpoint/load_checkpoint, ElasticState and torch::save work unchanged,
// and a checkpoint of one resumes the other.
//
// Why: libtorch's Adam runs about eight tensor operations per parameter, each a pass over memory
// and several allocating a temporary; on the CPU that is most of a small model's step (the
// example's MLP at batch 64: Adam ~2x its forward and backward together). FusedAdam reads and
// writes each element of the parameter, gradient and moments once:
//   - libtorch 2.x: ATen's fused kernel (`at::_fused_adam_`, what Adam(fused=True) runs), for
//     CPU and CUDA parameters of any floating type, amsgrad included, one call per device and
//     dtype;
//   - libtorch 1.13 (no such kernel): dtrain's vectorised CPU Adam (zero::cpu_adam_step) for
//     contiguous float32/float64 CPU parameters.
// The values agree with torch::optim::Adam to floating-point rounding, not bit for bit (the same
// formula, operations in another order). Where a step holds a parameter neither path takes (1.13:
// amsgrad, another device or dtype, a non-contiguous tensor), that whole step is
// torch::optim::Adam::step. A sparse gradient throws, as in torch::optim::Adam.
//
// Threads: libtorch's intra-op threads (1 under `dtrain run` and torchrun, which set
// OMP_NUM_THREADS=1). Not safe for concurrent use (as any torch::optim::Optimizer).
#pragma once

#include <torch/torch.h>

#include <utility>
#include <vector>

namespace dtrain {

class FusedAdam : public torch::optim::Adam {
 public:
  // The checks and defaults of torch::optim::Adam's constructors.
  explicit FusedAdam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                     torch::optim::AdamOptions defaults = {})
      : torch::optim::Adam(param_groups, std::move(defaults)) {}
  explicit FusedAdam(std::vector<torch::Tensor> params, torch::optim::AdamOptions defaults = {})
      : torch::optim::Adam(std::move(params), std::move(defaults)) {}

  // One Adam step on every parameter that has a gradient; `closure` as in torch::optim::Adam
  // (called with gradients enabled, its loss returned).
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace dtrain
