// What a parsed DeepSpeed config means to a user: `dtrain zero check`'s table (describe), the
// per-rank memory of the model states (estimate_memory) and DeepSpeed's progress line.
#include <cmath>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "dtrain/zero_config.h"
#include "zero/data_types.h"

namespace dtrain::zero {

using nlohmann::json;

MemoryEstimate estimate_memory(const Config& c, int64_t n) {
  const bool mixed = c.fp16.enabled || c.bf16;
  const int64_t N = c.world_size;
  const int stage = c.zero.stage;
  auto part = [&](int64_t bytes) { return (bytes + N - 1) / N; };
  MemoryEstimate m;
  int64_t pbytes = (mixed ? 2 : 4) * n, gbytes = (mixed ? 2 : 4) * n;
  // fp32 master (mixed only) + the optimizer's fp32 state tensors: Adam's exp_avg and
  // exp_avg_sq (also a client optimizer's assumed), Adagrad's sum, SGD's momentum buffer.
  const auto& o = c.optimizer;
  const int states = !o.given              ? 2
                     : o.type == "Adagrad" ? 1
                     : o.type == "Lion"    ? (c.zero.offload_optimizer.enabled() ? 2 : 1)
                     : o.type == "SGD"     ? (o.momentum > 0 ? 1 : 0)
                     : o.type == "RMSprop" ? 1 + (o.momentum > 0 ? 1 : 0) + (o.centered ? 1 : 0)
                                           : 2;
  int64_t obytes = ((mixed ? 4 : 0) + 4 * states) * n;
  m.params = stage >= 3 ? part(pbytes) : pbytes;
  // grad_accum_dtype fp32 under fp16/bf16: fp32 partitions at stages 2-3; at stage 1 a full
  // fp32 buffer beside the 16-bit gradients (as DeepSpeed's BF16_Optimizer).
  const bool fp32_accum = mixed && c.data_types.grad_accum_dtype == "fp32";
  m.grads = stage >= 2 ? part(fp32_accum ? 4 * n : gbytes) : gbytes + (fp32_accum ? 4 * n : 0);
  m.optimizer = stage >= 1 ? part(obytes) : obytes;
  if (c.zero.offload_optimizer.enabled()) m.offloaded += m.optimizer, m.optimizer = 0;
  // Parameters are offloaded only where they are partitioned (offload_param is ignored below
  // stage 3, as DeepSpeed ignores it).
  if (c.zero.offload_param.enabled() && stage == 3) m.offloaded += m.params, m.params = 0;
  return m;
}

std::string progress_line(const Config& c, int64_t step, int64_t skipped, const std::string& lr,
                          const std::string& mom) {
  if (c.log_level != "info" && c.log_level != "debug") return "";
  // Step 0 (the engine just built): always. Then Python's `step % steps_per_print == 0`: fmod
  // is exact, and the sign Python gives the remainder does not change whether it is 0.
  if (step != 0 &&
      (!c.steps_per_print || std::fmod(static_cast<double>(step), *c.steps_per_print) != 0))
    return "";
  return "[Rank 0] step=" + std::to_string(step) + ", skipped=" + std::to_string(skipped) +
         ", lr=" + lr + ", mom=" + mom;
}

std::string describe(const Config& c, std::optional<int64_t> params) {
  std::ostringstream s;
  auto num = [](double v) { return json(v).dump(); };
  auto row = [&](const std::string& key, const std::string& value) {
    s << "  " << key << std::string(key.size() < 31 ? 31 - key.size() : 1, ' ') << value << "\n";
  };
  const auto& z = c.zero;
  const auto& f = c.fp16;
  const auto& o = c.optimizer;
  const auto& sc = c.scheduler;
  s << "config OK for world size " << c.world_size << "\n";
  row("train_batch_size", std::to_string(c.train_batch_size));
  row("train_micro_batch_size_per_gpu", std::to_string(c.train_micro_batch_size_per_gpu));
  row("gradient_accumulation_steps", std::to_string(c.gradient_accumulation_steps));
  row("zero stage",
      std::to_string(z.stage) +
          (z.offload_optimizer.enabled() ? " (optimizer offloaded to cpu)" : "") +
          (z.offload_param.enabled() && z.stage == 3 ? " (parameters offloaded to cpu)" : ""));
  row("precision", f.enabled ? "fp16" : c.bf16 ? "bf16" : "fp32");
  if (c.torch_autocast.enabled)
    row("torch_autocast", "the forward under torch.autocast in " +
                              (c.torch_autocast.dtype.empty()
                                   ? std::string("the device's default dtype (cpu bf16, cuda fp16)")
                                   : c.torch_autocast.dtype));
  if (c.torch_autocast.enabled && c.torch_autocast.dtype == "fp16")
    row("loss scaler",
        "torch.amp.GradScaler: initial scale 2^16 = 65536, x2 after 2000 steps "
        "without inf/NaN, x0.5 after one (the step skipped)");
  if (f.enabled) {
    if (f.loss_scale == 0)
      row("loss scaler", "dynamic: initial scale 2^" + std::to_string(f.initial_scale_power) +
                             " = " + num(std::ldexp(1.0, f.initial_scale_power)) + ", window " +
                             std::to_string(f.loss_scale_window) + ", hysteresis " +
                             std::to_string(f.hysteresis) +
                             (f.consecutive_hysteresis ? " (consecutive)" : "") + ", min " +
                             num(f.min_loss_scale));
    else
      row("loss scaler", "static: " + num(f.loss_scale));
  }
  if (!c.data_types.grad_accum_dtype.empty())
    row("grad_accum_dtype", c.data_types.grad_accum_dtype);
  if (!c.data_types.buffer_dtype.empty()) row("buffer_dtype", c.data_types.buffer_dtype);
  if (const std::string comm = communication_data_type(c); !comm.empty())
    row("communication_data_type", comm);
  row("gradient_clipping", c.gradient_clipping > 0 ? num(c.gradient_clipping) : "off");
  if (z.stage >= 1) {
    row("reduce_bucket_size",
        std::to_string(z.reduce_bucket_size) + " elements" +
            (z.stage >= 2 && z.reduce_bucket_size > 4000000 ? " (dtrain stages at most 4000000)"
                                                            : ""));
  }
  // Where dtrain's stage-3 default is not DeepSpeed's and the config leaves the key to it (absent,
  // or "auto"): the row says so, with DeepSpeed's value (the training is the same either way).
  const auto defaulted = [&](const char* key) {
    if (z.stage != 3) return false;
    if (!c.raw.is_object() || !c.raw.contains("zero_optimization")) return true;
    const auto& section = c.raw.at("zero_optimization");
    if (!section.is_object() || !section.contains(key)) return true;
    const auto& v = section.at(key);
    return v.is_string() && v.get<std::string>() == "auto";
  };
  const auto unlike_deepspeed = [&](const char* key, const std::string& theirs,
                                    const std::string& why) {
    return defaulted(key)
               ? " (dtrain's default; DeepSpeed 0.19.8's at stage 3 is " + theirs + ": " + why + ")"
               : std::string();
  };
  if (z.stage >= 1)
    row("overlap_comm", std::string(z.overlap_comm ? "true" : "false") +
                            unlike_deepspeed("overlap_comm", "true",
                                             "set it for the reductions overlapped with backward"));
  if (z.stage == 3) {
    const std::string memory = "dtrain releases each layer after use; docs/zero.md";
    row("stage3_prefetch_bucket_size",
        std::to_string(z.stage3_prefetch_bucket_size) +
            unlike_deepspeed("stage3_prefetch_bucket_size", "50000000", memory));
    row("stage3_param_persistence_threshold", std::to_string(z.stage3_param_persistence_threshold));
    row("stage3_max_live_parameters", std::to_string(z.stage3_max_live_parameters));
    row("stage3_max_reuse_distance",
        std::to_string(z.stage3_max_reuse_distance) +
            unlike_deepspeed("stage3_max_reuse_distance", "1000000000", memory));
    row("sub_group_size", std::to_string(z.sub_group_size));
  }
  if (z.offload_optimizer.enabled() || (z.offload_param.enabled() && z.stage == 3))
    row("offload pin_memory", z.offload_optimizer.enabled()
                                  ? (z.offload_optimizer.pin_memory ? "true" : "false")
                                  : (z.offload_param.pin_memory ? "true" : "false"));
  if (!o.given) {
    row("optimizer", "(the caller's, InitOptions::optimizer)");
  } else {
    std::string p = "lr " + num(o.lr) + ", weight_decay " + num(o.weight_decay);
    if (o.type == "SGD") {
      p += ", momentum " + num(o.momentum) + ", dampening " + num(o.dampening) +
           (o.nesterov ? ", nesterov" : "");
    } else if (o.type == "RMSprop") {
      p += ", alpha " + num(o.alpha) + ", eps " + num(o.eps) + ", momentum " + num(o.momentum) +
           (o.centered ? ", centered" : "") + " (torch.optim.RMSprop)";
    } else if (o.type == "Lion") {
      p += ", betas [" + num(o.beta1) + ", " + num(o.beta2) + "], decoupled decay (" +
           (z.offload_optimizer.enabled() ? "DeepSpeedCPULion" : "FusedLion") + ")";
    } else if (o.type == "Adagrad") {
      p += ", eps " + num(o.eps) + ", L2 decay";
      if (z.offload_optimizer.enabled())
        p += " (DeepSpeedCPUAdagrad)";
      else
        p += ", lr_decay " + num(o.lr_decay) + ", initial_accumulator_value " +
             num(o.initial_accumulator_value) + " (torch.optim.Adagrad)";
    } else {
      p += ", betas [" + num(o.beta1) + ", " + num(o.beta2) + "], eps " + num(o.eps);
      if (!o.bias_correction) p += ", no bias correction";
      if (o.type == "Adam") p += o.adam_w_mode ? ", decoupled decay (AdamW)" : ", L2 decay";
      if (o.type == "Lamb")
        p += ", max_coeff " + num(o.max_coeff) + ", min_coeff " + num(o.min_coeff);
      if (o.torch_adam) p += ", torch_adam";
    }
    row("optimizer", o.type + ": " + p);
  }
  if (!sc.type.empty()) {
    std::string p;
    if (sc.type == "WarmupLR" || sc.type == "WarmupDecayLR") {
      const double max_lr = sc.warmup_max_lr        ? *sc.warmup_max_lr
                            : sc.type == "WarmupLR" ? (o.given ? o.lr : NAN)
                                                    : 0.001;
      p = "warmup_min_lr " + num(sc.warmup_min_lr) + ", warmup_max_lr " +
          (std::isnan(max_lr) ? std::string("(the optimizer's lr)") : num(max_lr)) +
          ", warmup_num_steps " + std::to_string(sc.warmup_num_steps) + ", warmup_type " +
          sc.warmup_type;
      if (sc.type == "WarmupDecayLR")
        p += ", total_num_steps " + std::to_string(sc.total_num_steps);
    } else if (sc.type == "WarmupCosineLR") {
      p = "total_num_steps " + std::to_string(sc.total_num_steps) + ", warmup_num_steps " +
          std::to_string(sc.warmup_num_steps) + ", warmup_min_ratio " + num(sc.warmup_min_ratio) +
          ", cos_min_ratio " + num(sc.cos_min_ratio) + ", warmup_type " + sc.warmup_type;
    } else if (sc.type == "OneCycle") {
      p = "cycle_min_lr " + num(sc.cycle_min_lr) + ", cycle_max_lr " + num(sc.cycle_max_lr) +
          ", cycle_first_step_size " + std::to_string(sc.cycle_first_step_size) +
          ", cycle_second_step_size " +
          std::to_string(sc.cycle_second_step_size < 0 ? sc.cycle_first_step_size
                                                       : sc.cycle_second_step_size) +
          ", decay_lr_rate " + num(sc.decay_lr_rate) +
          (sc.cycle_momentum ? ", cycle_min_mom " + num(sc.cycle_min_mom) + ", cycle_max_mom " +
                                   num(sc.cycle_max_mom)
                             : std::string(", no momentum cycle"));
    } else if (sc.is_torch()) {
      p = "torch.optim.lr_scheduler's, params " + c.raw.at("scheduler").at("params").dump();
    } else {
      p = "lr_range_test_min_lr " + num(sc.lr_range_test_min_lr) + ", lr_range_test_step_size " +
          std::to_string(sc.lr_range_test_step_size) + ", lr_range_test_step_rate " +
          num(sc.lr_range_test_step_rate) + (sc.lr_range_test_staircase ? ", staircase" : "");
    }
    row("scheduler", sc.type + ": " + p);
  }
  row("steps_per_print",
      !c.steps_per_print
          ? std::string("none (no progress line)")
          : (*c.steps_per_print == std::floor(*c.steps_per_print) &&
                     std::fabs(*c.steps_per_print) < 1e15
                 ? std::to_string(static_cast<int64_t>(*c.steps_per_print))
                 : num(*c.steps_per_print)) +
                (c.log_level == "info" || c.log_level == "debug"
                     ? ""
                     : " (hidden at log_level " +
                           (c.log_level.empty() ? std::string("warning") : c.log_level) + ")"));
  if (params) {
    auto m = estimate_memory(c, *params);
    auto mib = [](int64_t b) {
      std::ostringstream o;
      o.setf(std::ios::fixed);
      o.precision(1);
      o << b / 1048576.0 << " MiB";
      return o.str();
    };
    s << "per-rank model-state memory for " << *params << " parameters:\n"
      << "  parameters " << mib(m.params) << "\n  gradients  " << mib(m.grads) << "\n  optimizer  "
      << mib(m.optimizer) << "\n  total      " << mib(m.total()) << "\n";
    if (m.offloaded) s << "  on cpu     " << mib(m.offloaded) << " (offloaded)\n";
  }
  return s.str();
}

}  // namespace dtrain::zero
