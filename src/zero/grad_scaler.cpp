#include "zero/grad_scaler.h"

#include <cmath>

namespace dtrain::zero::detail {

torch::Tensor AmpGradScaler::scale(const torch::Tensor& loss) const {
  return loss * torch::scalar_tensor(scale_, loss.options().dtype(torch::kFloat32));
}

bool AmpGradScaler::unscale(torch::Tensor& grads) const {
  torch::NoGradGuard ng;
  const bool found_inf = !grads.isfinite().all().item<bool>();
  const float inv = static_cast<float>(1.0 / static_cast<double>(scale_));
  if (inv != 1.0f) grads.mul_(static_cast<double>(inv));
  return found_inf;
}

void AmpGradScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ = static_cast<float>(scale_ * kBackoffFactor);
    tracker_ = 0;
    return;
  }
  if (++tracker_ < kGrowthInterval) return;
  const auto grown = static_cast<float>(scale_ * kGrowthFactor);
  if (std::isfinite(grown)) scale_ = grown;
  tracker_ = 0;
}

}  // namespace dtrain::zero::detail
