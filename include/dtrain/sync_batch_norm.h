// SyncBatchNorm: batch normalisation whose statistics are computed over the global batch
// (every rank of the group), forward and backward, as torch.nn.SyncBatchNorm does.
//
// In training mode each forward all-reduces the per-channel sum, sum of squares and count,
// normalises with the global mean and (biased) variance, and updates the running statistics
// with the unbiased global variance; backward all-reduces the two per-channel gradient sums.
// In eval mode it is plain batch norm with the running statistics. With world size 1 (or no
// process group) it equals torch::nn::BatchNorm1d/2d.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>

#include "dtrain/process_group.h"

namespace dtrain {

struct SyncBatchNormOptions {
  explicit SyncBatchNormOptions(int64_t num_features) : num_features(num_features) {}
  int64_t num_features;
  double eps = 1e-5;                     // Default: 1e-5.
  std::optional<double> momentum = 0.1;  // Default: 0.1; nullopt = cumulative average.
  bool affine = true;                    // Default: true.
  bool track_running_stats = true;       // Default: true.
  // The group to synchronise over. Default: the default group at forward time; with no
  // default group either, training-mode forward is plain BatchNorm (nothing to sync with).
  std::shared_ptr<ProcessGroup> group;
};

// Works on inputs of rank 2 or 3 (N, C[, L]) and 4 (N, C, H, W), i.e. where BatchNorm1d and
// BatchNorm2d do. Parameters and buffers have BatchNorm's names (weight, bias, running_mean,
// running_var, num_batches_tracked), so state dicts load across the two.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(const SyncBatchNormOptions& options);
  explicit SyncBatchNormImpl(int64_t num_features)
      : SyncBatchNormImpl(SyncBatchNormOptions(num_features)) {}
  void reset() override;
  // As torch::nn::BatchNorm's: running_mean 0, running_var 1, num_batches_tracked 0; and
  // additionally weight 1, bias 0.
  void reset_running_stats();
  void reset_parameters();
  // Training mode with a group of more than one rank: synchronised over the group (every rank
  // must call it, in the same order). Otherwise exactly torch::nn::BatchNorm's forward.
  // Throws UsageError for an input that is not (N, C[, L]) or (N, C, H, W) with C channels.
  // The weight/bias gradients are this rank's share only (as in PyTorch): DDP all-reduces them.
  torch::Tensor forward(const torch::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  SyncBatchNormOptions options;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};
TORCH_MODULE(SyncBatchNorm);

// Returns `module` with every torch::nn::BatchNorm1d/BatchNorm2d replaced by a SyncBatchNorm
// holding copies of its parameters and buffers (same dtype, device, requires_grad) and its
// options and train/eval mode. Works through nn::Sequential (and subclasses of it, such as
// the typed-forward Sequential C++ needs for nesting one in another), nn::ModuleList and
// nn::ModuleDict at any depth, also inside custom modules: the containers are modified in place (as
// PyTorch does), so a custom module's Sequential member sees the change; a BatchNorm passed as
// `module` itself is returned as a new SyncBatchNorm. A BatchNorm held by a custom module's
// member field cannot be swapped from outside in C++: that throws UsageError naming its path,
// saying to construct dtrain::SyncBatchNorm there instead; BatchNorm3d throws UsageError too.
// Everything is checked before anything is changed, so a throw leaves the model untouched.
// Build optimizers after converting: the new modules' parameters are new tensors.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group = nullptr);
torch::nn::Sequential convert_sync_batchnorm(torch::nn::Sequential module,
                                             std::shared_ptr<ProcessGroup> group = nullptr);
// Without this, a std::shared_ptr<SequentialImpl> (e.g. `seq.ptr()`) would be ambiguous
// between the two overloads above.
std::shared_ptr<torch::nn::SequentialImpl> convert_sync_batchnorm(
    std::shared_ptr<torch::nn::SequentialImpl> module,
    std::shared_ptr<ProcessGroup> group = nullptr);

}  // namespace dtrain
