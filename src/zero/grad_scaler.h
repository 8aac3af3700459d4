// torch.amp.GradScaler as DeepSpeed 0.19.8 runs it under fp16 torch_autocast: the loss scaled by
// a float32 scale that starts at 2^16, the gradients unscaled by its reciprocal and checked for
// inf/NaN, the scale halved after an inf (the step skipped) and doubled after 2000 updates
// without one. torch 2.11's defaults, which DeepSpeed keeps (GradScaler(device=...)), and its
// kernels' arithmetic (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace dtrain::zero::detail {

class AmpGradScaler {
 public:
  static constexpr float kInitScale = 65536.0f;
  static constexpr double kGrowthFactor = 2.0, kBackoffFactor = 0.5;
  static constexpr int64_t kGrowthInterval = 2000;

  // GradScaler.scale(loss): loss times the scale as a float32 0-dim tensor (a 16-bit scalar
  // loss comes back float32, as torch's type promotion makes it).
  torch::Tensor scale(const torch::Tensor& loss) const;
  // GradScaler.unscale_: `grads` times float32(1 / double(scale)), in place. True when any
  // value was inf or NaN before it (found_inf).
  bool unscale(torch::Tensor& grads) const;
  // GradScaler.update() after a step with found_inf or without.
  void update(bool found_inf);
  float value() const { return scale_; }
  int64_t growth_tracker() const { return tracker_; }

 private:
  float scale_ = kInitScale;
  int64_t tracker_ = 0;
};

}  // namespace dtrain::zero::detail
