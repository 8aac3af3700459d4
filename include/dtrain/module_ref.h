// The module behind what the wrappers (DistributedDataParallel, zero::Engine, ...) accept: a
// module holder (torch::nn::Linear, a TORCH_MODULE type), a shared_ptr to a module, or a
// module itself.
#pragma once

#include <torch/torch.h>

#include <memory>

namespace dtrain::detail {

inline torch::nn::Module& module_ref(torch::nn::Module& m) { return m; }
template <typename T>
torch::nn::Module& module_ref(const std::shared_ptr<T>& m) {
  return *m;
}
template <typename T>
torch::nn::Module& module_ref(const torch::nn::ModuleHolder<T>& m) {
  return *m.ptr();
}

}  // namespace dtrain::detail
