#include "parallel/grad_hooks.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include "dtrain/error.h"

namespace dtrain::detail {

void add_grad_ready_hooks(const std::vector<torch::Tensor>& params,
                          const std::vector<std::string>& names,
                          std::function<void(size_t)> on_ready, GradHooks& hooks) {
  auto shared = std::make_shared<std::function<void(size_t)>>(std::move(on_ready));
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    DTRAIN_ASSERT(acc != nullptr, "parameter '" + names[i] + "' has no gradient accumulator");
    auto key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [shared, i](const torch::autograd::variable_list& outputs,
                    const torch::autograd::variable_list&) {
          (*shared)(i);
          return outputs;
        }));
    hooks.emplace_back(std::move(acc), key);
  }
}

void remove_grad_hooks(GradHooks& hooks) noexcept {
  for (auto& [node, key] : hooks) node->del_post_hook(key);
  hooks.clear();
}

}  // namespace dtrain::detail
