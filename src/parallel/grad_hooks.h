// The gradient-ready hook DDP, hvd::DistributedOptimizer and ZeRO install on each parameter:
// a post hook on the parameter's gradient accumulator (libtorch's internal
// torch::autograd::impl::grad_accumulator, the node DDP's reducer hooks too). It runs once
// `.grad` holds this backward pass's sum, which a tensor hook would not see.
//
//     GradHooks hooks_;                                     // a member of the owner
//     add_grad_ready_hooks(params, names, [this](size_t i) { mark_ready(i); }, hooks_);
//     ...
//     remove_grad_hooks(hooks_);                            // in the owner's destructor
//
// REQUIRES: every parameter requires grad (a leaf). Not thread-safe: install and remove from
// the owner's thread; the callback runs on autograd's thread during backward().
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::detail {

// The installed hooks: each accumulator node and its hook's key.
using GradHooks = std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>>;

// Installs `on_ready(i)` for each params[i], appending to `hooks`. DTRAIN_ASSERT (our bug)
// when a parameter has no gradient accumulator; names[i] names it.
void add_grad_ready_hooks(const std::vector<torch::Tensor>& params,
                          const std::vector<std::string>& names,
                          std::function<void(size_t)> on_ready, GradHooks& hooks);
// Removes them (what a destructor does). Never throws.
void remove_grad_hooks(GradHooks& hooks) noexcept;

}  // namespace dtrain::detail
