// torch_autocast's parameter marks (DeepSpeed 0.19.8's init_autocast_params).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace dtrain::zero::detail {

// The parameters DeepSpeed marks with the autocast dtype for communication: the direct
// parameters of every submodule of `module` whose class is exactly one of `classes` (Python
// names, "torch.nn.Linear" or "torch.nn.modules.linear.Linear"; empty: DeepSpeed's default,
// Linear and Conv1d-3d). UsageError: a name that is not a torch.nn class libtorch has.
std::unordered_set<const c10::TensorImpl*> lower_precision_safe_parameters(
    torch::nn::Module& module, const std::vector<std::string>& classes);

// The dtype ops on `device` are autocast to on this thread (torch.autocast on there), or
// nullopt.
std::optional<c10::ScalarType> autocast_dtype(c10::DeviceType device);

}  // namespace dtrain::zero::detail
