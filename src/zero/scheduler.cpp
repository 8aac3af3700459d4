// DeepSpeed's learning-rate schedulers and dynamic loss scaler, as pure state machines.
#include <algorithm>
#include <cmath>
#include <sstream>

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
      if (scale_ == c_.min_loss_scale) {
        std::ostringstream min;
        min << c_.min_loss_scale;
        throw Error(
            "zero fp16: the gradients overflowed again with the loss scale already at "
            "min_loss_scale (" +
            min.str() +
            "): it cannot go lower, so the run stops here, as DeepSpeed's does (\"Current loss "
            "scale already at minimum\"). The loss has diverged or the model overflows fp16: "
            "lower the learning rate, clip gradients, train in bf16, or lower "
            "fp16.min_loss_scale");
      }
      scale_ = std::max(scale_ / 2.0, c_.min_loss_scale);
    } else {
      --hysteresis_;
    }
    last_overflow_ = iter_;
  } else {
    if (c_.consecutive_hysteresis) hysteresis_ = c_.hysteresis;
    // DeepSpeed's stable interval: the clean updates since the last overflow, before this one.
    const int64_t stable = iter_ - last_overflow_ - 1;
    if (stable > 0 && stable % c_.loss_scale_window == 0) {
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

LRScheduler::LRScheduler(const SchedulerConfig& c, double base_lr, double base_beta1,
                         double base_beta2)
    : c_(c), base_lr_(base_lr), base_beta1_(base_beta1), base_beta2_(base_beta2) {
  // DeepSpeed clamps the warm-up to at least 2 steps (log(1) / log(1) otherwise).
  c_.warmup_num_steps = std::max<int64_t>(2, c_.warmup_num_steps);
  if (c_.cycle_second_step_size < 0) c_.cycle_second_step_size = c_.cycle_first_step_size;
  if (c_.cycle_second_stair_count < 0) c_.cycle_second_stair_count = c_.cycle_first_stair_count;
  if (c_.is_torch()) {
    // torch's constructor: the group's rate (OneCycleLR: initial_lr) and its initial step.
    if (c_.type == "OneCycleLR") base_lr_ = c_.torch_params.max_lr / c_.torch_params.div_factor;
    ts_.lr = base_lr_;
    ts_.momentum = c_.type == "OneCycleLR" ? c_.torch_params.max_momentum : base_beta1_;
    torch_update(true);
  }
}

void LRScheduler::step() {
  if (c_.is_torch())
    torch_update(false);
  else
    ++last_batch_iteration_;
}

void LRScheduler::set_torch_state(const TorchState& s) {
  ts_ = s;
  last_batch_iteration_ = s.last_epoch - 1;
}

bool LRScheduler::cycles_momentum() const {
  return c_.type == "OneCycleLR" ? c_.torch_params.cycle_momentum
                                 : c_.type == "OneCycle" && c_.cycle_momentum;
}

double LRScheduler::momentum() const {
  if (c_.type == "OneCycleLR" && c_.torch_params.cycle_momentum) return ts_.momentum;
  return betas().first;
}

namespace {

// The warm-up's fraction done at iteration k (< W): log(k+1)/log(W), or k/W.
double warmup_gamma(const SchedulerConfig& c, int64_t k) {
  const double w = static_cast<double>(c.warmup_num_steps);
  if (c.warmup_type == "log") return (1.0 / std::log(w)) * std::log(static_cast<double>(k) + 1);
  return static_cast<double>(k) / w;
}

}  // namespace

// OneCycle: the position in the current cycle's triangle at batch iteration k + 1 (0 at the
// ends, 1 at the peak), held flat over stairs when a stair count is given.
double LRScheduler::cycle_scale() const {
  const double first = static_cast<double>(c_.cycle_first_step_size),
               second = static_cast<double>(c_.cycle_second_step_size), total = first + second;
  const double ratio = first / total;
  const double it = static_cast<double>(last_batch_iteration_ + 1);
  const double cycle = std::floor(1 + it / total);
  const double x = 1. + it / total - cycle;
  double scale;
  int64_t stairs;
  if (x <= ratio) {
    scale = x / ratio;
    stairs = c_.cycle_first_stair_count;
  } else {
    scale = (x - 1) / (ratio - 1);
    stairs = c_.cycle_second_stair_count;
  }
  if (stairs > 0) {
    const double in_cycle = std::fmod(it, total);
    const double position = in_cycle <= first ? in_cycle * double(stairs) / first
                                              : (total - in_cycle) * double(stairs) / second;
    scale = std::floor(position) / double(stairs);
  }
  return scale;
}

double LRScheduler::lr() const {
  const auto& t = c_.type;
  const int64_t k = last_batch_iteration_;
  if (t.empty()) return base_lr_;
  if (c_.is_torch()) return ts_.lr;
  if (t == "WarmupLR" || t == "WarmupDecayLR") {
    const double max_lr = c_.warmup_max_lr ? *c_.warmup_max_lr : t == "WarmupLR" ? base_lr_ : 0.001;
    if (k < 0) return c_.warmup_min_lr;
    double gamma = 1.0;
    if (k < c_.warmup_num_steps) {
      gamma = warmup_gamma(c_, k);
    } else if (t == "WarmupDecayLR") {
      gamma = std::max(0.0, double(c_.total_num_steps - k) /
                                std::max(1.0, double(c_.total_num_steps - c_.warmup_num_steps)));
    }
    return c_.warmup_min_lr + (max_lr - c_.warmup_min_lr) * gamma;
  }
  if (t == "WarmupCosineLR") {
    if (k < 0) return 0.0;
    double ratio;
    if (k < c_.warmup_num_steps) {
      ratio = c_.warmup_min_ratio + warmup_gamma(c_, k) * (1. - c_.warmup_min_ratio);
    } else {
      // The progress is clamped: past total_num_steps the rate stays at its floor.
      const double real_last = double(k - c_.warmup_num_steps + 1),
                   real_total =
                       std::max<double>(1, double(c_.total_num_steps - c_.warmup_num_steps));
      const double progress = std::min(1.0, real_last / real_total);
      const double cosv = (1 + std::cos(M_PI * progress)) / 2;
      ratio = std::max(0.0, c_.cos_min_ratio + (1. - c_.cos_min_ratio) * cosv);
    }
    return base_lr_ * ratio;
  }
  if (t == "OneCycle") {
    const int64_t total = c_.cycle_first_step_size + c_.cycle_second_step_size;
    if (k < 0) return c_.cycle_min_lr;
    if (k < total) return c_.cycle_min_lr + (c_.cycle_max_lr - c_.cycle_min_lr) * cycle_scale();
    if (c_.decay_step_size == 0 || c_.decay_lr_rate == 0) return c_.cycle_min_lr;
    const double interval = double(k - total + 1) / double(c_.decay_step_size);
    return c_.cycle_min_lr / (1 + c_.decay_lr_rate * interval);
  }
  // LRRangeTest
  double interval = double(k + 1) / double(c_.lr_range_test_step_size);
  if (c_.lr_range_test_staircase) interval = std::floor(interval);
  return c_.lr_range_test_min_lr * (1 + c_.lr_range_test_step_rate * interval);
}

std::pair<double, double> LRScheduler::betas() const {
  if (c_.type == "OneCycleLR" && c_.torch_params.cycle_momentum)
    return {ts_.momentum, base_beta2_};  // group["betas"] = (momentum, *betas[1:])
  if (c_.type != "OneCycle" || !c_.cycle_momentum) return {base_beta1_, base_beta2_};
  const int64_t k = last_batch_iteration_;
  const int64_t total = c_.cycle_first_step_size + c_.cycle_second_step_size;
  if (k < 0) return {c_.cycle_min_mom, 0.99};
  if (k < total)
    return {c_.cycle_max_mom - (c_.cycle_max_mom - c_.cycle_min_mom) * cycle_scale(), 0.99};
  if (c_.decay_step_size == 0 || c_.decay_mom_rate == 0) return {c_.cycle_max_mom, 0.99};
  const double interval = double(k - total + 1) / double(c_.decay_step_size);
  return {c_.cycle_max_mom * (1 + c_.decay_mom_rate * interval), 0.99};
}

}  // namespace dtrain::zero
