// FusedAdam::step (include/dtrain/fused_adam.h): torch::optim::Adam's state and bookkeeping,
// the arithmetic in one fused pass - ATen's kernel on libtorch 2.x, dtrain's CPU Adam on 1.13.
#include "dtrain/fused_adam.h"

#include <torch/version.h>

#include <cmath>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "dtrain/zero.h"
#include "optim/state_key.h"

namespace dtrain {
namespace {

using torch::optim::AdamOptions;
using torch::optim::AdamParamState;

constexpr bool kAtenKernel = TORCH_VERSION_MAJOR >= 2;

// Whether this build's fused path takes `p` (whose gradient is defined) with these options.
bool fusable(const torch::Tensor& p, const AdamOptions& o) {
  const torch::Tensor& g = p.grad();
  if (g.is_sparse()) return false;  // torch::optim::Adam's own error, from its step
  if (kAtenKernel) {
    return (p.is_cpu() || p.is_cuda()) && at::isFloatingType(p.scalar_type()) &&
           g.scalar_type() == p.scalar_type() && g.device() == p.device();
  }
  const auto t = p.scalar_type();
  return !o.amsgrad() && p.is_cpu() && (t == torch::kFloat || t == torch::kDouble) &&
         g.scalar_type() == t && g.is_cpu() && p.is_contiguous() && g.is_contiguous();
}

}  // namespace

torch::Tensor FusedAdam::step(LossClosure closure) {
  // The closure makes the gradients that decide the path, so it runs first, and the fallback
  // below steps without it.
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const AdamOptions&>(group.options());
    for (const auto& p : group.params()) {
      if (p.grad().defined() && !fusable(p, o)) {
        torch::optim::Adam::step();
        return loss;
      }
    }
  }

  torch::NoGradGuard no_grad;
  auto& states = state();
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const AdamOptions&>(group.options());
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    // ATen's kernel takes one device and dtype per call: the group's parameters by both.
    struct Lists {
      std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
      std::vector<float> steps;
    };
    std::map<std::pair<std::string, int>, Lists> by_kind;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto key = dtrain::optim::state_key(states, p);
      auto it = states.find(key);
      if (it == states.end()) {  // as torch::optim::Adam makes it on a parameter's first step
        auto s = std::make_unique<AdamParamState>();
        s->step(0);
        s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (o.amsgrad()) s->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = states.emplace(key, std::move(s)).first;
      }
      auto& s = static_cast<AdamParamState&>(*it->second);
      s.step(s.step() + 1);
      // State loaded from elsewhere (another device, a strided tensor) is brought to the
      // parameter's device, type and layout, as the fused pass reads both side by side.
      auto like_p = [&](const torch::Tensor& t) {
        return t.device() == p.device() && t.scalar_type() == p.scalar_type() && t.is_contiguous()
                   ? t
                   : t.to(p.options()).contiguous();
      };
      s.exp_avg(like_p(s.exp_avg()));
      s.exp_avg_sq(like_p(s.exp_avg_sq()));
      if (o.amsgrad()) {
        s.max_exp_avg_sq(s.max_exp_avg_sq().defined()
                             ? like_p(s.max_exp_avg_sq())
                             : torch::zeros_like(p, torch::MemoryFormat::Preserve));
      }
      if constexpr (kAtenKernel) {
        auto& l = by_kind[{p.device().str(), static_cast<int>(p.scalar_type())}];
        l.params.push_back(p);
        l.grads.push_back(p.grad());
        l.exp_avgs.push_back(s.exp_avg());
        l.exp_avg_sqs.push_back(s.exp_avg_sq());
        if (o.amsgrad()) l.max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
        l.steps.push_back(static_cast<float>(s.step()));
      } else {
        // torch's bias corrections folded into the step size and eps (m / (sqrt(v) / sqrt(bc2)
        // + eps) * lr / bc1 = m / (sqrt(v) + eps * sqrt(bc2)) * lr * sqrt(bc2) / bc1), so the
        // kernel runs without its own.
        const double bc1 = 1 - std::pow(beta1, static_cast<double>(s.step()));
        const double sqrt_bc2 = std::sqrt(1 - std::pow(beta2, static_cast<double>(s.step())));
        const double lr = o.lr() * sqrt_bc2 / bc1, eps = o.eps() * sqrt_bc2;
        if (p.scalar_type() == torch::kFloat) {
          zero::cpu_adam_step(p.data_ptr<float>(), p.grad().data_ptr<float>(),
                              s.exp_avg().data_ptr<float>(), s.exp_avg_sq().data_ptr<float>(),
                              p.numel(), s.step(), lr, beta1, beta2, eps, o.weight_decay(),
                              /*adamw=*/false, /*threads=*/0, /*bias_correction=*/false);
        } else {
          zero::cpu_adam_step(p.data_ptr<double>(), p.grad().data_ptr<double>(),
                              s.exp_avg().data_ptr<double>(), s.exp_avg_sq().data_ptr<double>(),
                              p.numel(), s.step(), lr, beta1, beta2, eps, o.weight_decay(),
                              /*adamw=*/false, /*threads=*/0, /*bias_correction=*/false);
        }
      }
    }
#if TORCH_VERSION_MAJOR >= 2
    for (auto& [kind, l] : by_kind) {
      // The kernel reads each step already counted (PyTorch adds 1 to its step tensors before
      // the call), as a float32 scalar on the parameters' device: one copy of them all there,
      // a view per parameter.
      const auto all = torch::tensor(l.steps).to(l.params.front().device());
      std::vector<torch::Tensor> steps;
      for (int64_t i = 0; i < all.numel(); ++i) steps.push_back(all[i]);
      at::_fused_adam_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, steps,
                       o.lr(), beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(),
                       /*maximize=*/false);
    }
#endif
  }
  return loss;
}

}  // namespace dtrain
