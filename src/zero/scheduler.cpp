// DeepSpeed's learning-rate schedulers and dynamic loss scaler, as pure state machines.
#include <algorithm>
#include <cmath>

#include "dtrain/zero.h"

namespace dtrain::zero {

LossScaler::LossScaler(const Fp16Config& c)
    : c_(c), dynamic_(c.enabled && c.loss_scale == 0), hysteresis_(c.hysteresis) {
  scale_ = !c.enabled ? 1.0 : dynamic_ ? std::pow(2.0, c.initial_scale_power) : c.loss_scale;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (c_.hysteresis == 1 || hysteresis_ == 1) {
      scale_ = std::max(scale_ / 2.0, c_.min_loss_scale);
    } else {
      --hysteresis_;
    }
    last_overflow_ = iter_;
  } else {
    if (c_.consecutive_hysteresis) hysteresis_ = c_.hysteresis;
    if ((iter_ - last_overflow_) % c_.loss_scale_window == 0) {
      if (!c_.consecutive_hysteresis) hysteresis_ = c_.hysteresis;
      scale_ *= 2.0;
    }
  }
  ++iter_;
}

void LossScaler::set_state(const std::vector<double>& s) {
  if (s.size() != 4) return;
  scale_ = s[0];
  iter_ = static_cast<int64_t>(s[1]);
  last_overflow_ = static_cast<int64_t>(s[2]);
  hysteresis_ = static_cast<int>(s[3]);
}

LRScheduler::LRScheduler(const SchedulerConfig& c, double base_lr, double base_beta1)
    : c_(c), base_lr_(base_lr), base_beta1_(base_beta1) {
  // DeepSpeed clamps the warm-up to at least 2 steps (log(1) / log(1) otherwise).
  c_.warmup_num_steps = std::max<int64_t>(2, c_.warmup_num_steps);
  if (c_.cycle_second_step_size < 0) c_.cycle_second_step_size = c_.cycle_first_step_size;
}

// Fraction of the warm-up done at this iteration: log(i+1)/log(W) or i/W.
double LRScheduler::warmup_gamma() const {
  const double i = static_cast<double>(iteration_), w = static_cast<double>(c_.warmup_num_steps);
  if (c_.warmup_type == "log") return std::log(i + 1) / std::log(w);
  return i / w;
}

// OneCycle: position in the triangle of the current cycle, 0 at its ends, 1 at the peak.
double LRScheduler::cycle_scale() const {
  const double total = static_cast<double>(c_.cycle_first_step_size + c_.cycle_second_step_size);
  const double ratio = static_cast<double>(c_.cycle_first_step_size) / total;
  const double it = static_cast<double>(iteration_);
  const double cycle = std::floor(1 + it / total);
  const double x = 1.0 + it / total - cycle;
  return x <= ratio ? x / ratio : (x - 1) / (ratio - 1);
}

double LRScheduler::lr() const {
  const auto& t = c_.type;
  const int64_t i = iteration_;
  if (t.empty()) return base_lr_;
  if (t == "WarmupLR" || t == "WarmupDecayLR") {
    double gamma = 1.0;
    if (i < c_.warmup_num_steps) {
      gamma = warmup_gamma();
    } else if (t == "WarmupDecayLR") {
      gamma =
          std::max(0.0, double(c_.total_num_steps - i) /
                            double(std::max<int64_t>(1, c_.total_num_steps - c_.warmup_num_steps)));
    }
    return c_.warmup_min_lr + (c_.warmup_max_lr - c_.warmup_min_lr) * gamma;
  }
  if (t == "WarmupCosineLR") {
    double ratio;
    if (i < c_.warmup_num_steps) {
      ratio = c_.warmup_min_ratio + (1.0 - c_.warmup_min_ratio) * warmup_gamma();
    } else {
      const double real = double(i - c_.warmup_num_steps + 1),
                   total = double(c_.total_num_steps - c_.warmup_num_steps);
      const double cosv = (1 + std::cos(M_PI * real / total)) / 2;
      ratio = std::max(0.0, c_.cos_min_ratio + (1.0 - c_.cos_min_ratio) * cosv);
    }
    return base_lr_ * ratio;
  }
  if (t == "OneCycle") {
    const int64_t total = c_.cycle_first_step_size + c_.cycle_second_step_size;
    if (i <= total) return c_.cycle_min_lr + (c_.cycle_max_lr - c_.cycle_min_lr) * cycle_scale();
    if (c_.decay_step_size == 0) return c_.cycle_min_lr;
    const double interval = double(i - total) / double(c_.decay_step_size);
    return c_.cycle_min_lr / (1 + c_.decay_lr_rate * interval);
  }
  // LRRangeTest
  double interval = double(i + 1) / double(c_.lr_range_test_step_size);
  if (c_.lr_range_test_staircase) interval = std::floor(interval);
  return c_.lr_range_test_min_lr * (1 + c_.lr_range_test_step_rate * interval);
}

double LRScheduler::momentum() const {
  if (c_.type != "OneCycle" || !c_.cycle_momentum) return base_beta1_;
  const int64_t total = c_.cycle_first_step_size + c_.cycle_second_step_size;
  if (iteration_ <= total)
    return c_.cycle_max_mom - (c_.cycle_max_mom - c_.cycle_min_mom) * cycle_scale();
  if (c_.decay_step_size == 0) return c_.cycle_max_mom;
  const double interval = double(iteration_ - total) / double(c_.decay_step_size);
  return c_.cycle_max_mom * (1 + c_.decay_mom_rate * interval);
}

}  // namespace dtrain::zero
