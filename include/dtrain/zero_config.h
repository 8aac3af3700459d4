// DeepSpeed's JSON config, parsed and validated (no libtorch: the `dtrain` CLI uses it).
//
//   auto cfg = dtrain::zero::parse_config(json, /*world_size=*/4);
//   cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps
//
// The keys and their meaning are DeepSpeed 0.19.8's (docs: deepspeed.ai/docs/config-json):
//   - every section DeepSpeed reads is accepted; where dtrain does not act on one
//     (activation_checkpointing, monitors, profilers, ...) it is accepted with a
//     line in Config::notes saying what DeepSpeed does with it and what dtrain does instead;
//   - deprecated aliases DeepSpeed still takes are accepted with their meaning
//     (zero_optimization.cpu_offload = offload_optimizer {device: cpu}, cpu_offload_param,
//     cpu_offload_use_pin_memory, stage3_gather_fp16_weights_on_model_save, the stage3_*
//     names with or without the prefix, "zero_optimization": true = stage 1);
//   - sections DeepSpeed 0.19.8 removed (compression_training, sparse_gradients, amp, ...)
//     are refused with DeepSpeed's own reason;
//   - duplicate keys are refused (parse_config_text), as DeepSpeed does.
//   - the validated sections (zero_optimization, offload_*, fp16, bf16) read values as
//     DeepSpeed's pydantic does ("enabled": "true", "stage": "2", each with a note);
//   - what DeepSpeed's engine refuses when deepspeed.initialize builds the optimizer and
//     scheduler is refused here too (an optimizer or scheduler param its constructor does not
//     take, "sgd" or "warmuplr" in the wrong case, compute_grad_norm false with clipping, ...).
// docs/deepspeed.md lists these rules and the deliberate differences. Unknown keys: where
// DeepSpeed refuses one (its pydantic sections, an optimizer's or scheduler's params) so does
// dtrain, a ConfigError naming its path and the closest valid key. Where DeepSpeed silently
// drops one (the top level, optimizer, scheduler, data_types, timers: real configs carry keys
// such as "cuda_visible_devices" for their own scripts) dtrain accepts it with a line in
// Config::notes - unless it is a near-miss of a known key ("gradient_clipp1ng": a typo DeepSpeed
// would let pass, refused here with "did you mean gradient_clipping?"), or the parse is strict
// (ParseOptions::strict: every unknown key refused). A value of the wrong type or out of range
// is named the same way.
//
// "auto" (the Hugging Face / accelerate convention, filled in by their integrations before
// DeepSpeed sees the config): in DeepSpeed's validated sections (zero_optimization and its
// offload sections, fp16, bf16) it means the default, as in DeepSpeed; a batch key "auto"
// counts as not given; an optimizer param "auto" is the optimizer's default; warmup_max_lr
// "auto" is the optimizer's lr; gradient_clipping "auto" is 1.0 (DeepSpeed's default, and Hugging
// Face's max_grad_norm default). Each such resolution is a
// line in Config::notes. Where the value comes from training arguments dtrain cannot know
// (scheduler total_num_steps, warmup_num_steps), "auto" is a ConfigError naming the key and
// what to give.
//
// Batch sizes follow DeepSpeed's rules (runtime/config.py, _set_batch_related_parameters):
// train_batch_size = micro_batch_per_gpu * gradient_accumulation_steps * world_size; any two
// given determine the third; train_batch_size alone means gas = 1; micro alone means gas = 1;
// all three must agree.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/error.h"

namespace dtrain::zero {

// A config that is not valid: what() names the key path and what is wrong.
class ConfigError : public UsageError {
 public:
  using UsageError::UsageError;
};

struct OptimizerConfig {
  // Adam, AdamW, SGD, Lamb, Adagrad, Lion (all but SGD case-insensitive on input, as
  // DeepSpeed). Lion: decoupled decay; DeepSpeedCPULion's update with offload_optimizer,
  // FusedLion's (DeepSpeed's CUDA kernel, run here as tensor ops on any device) without.
  std::string type = "Adam";
  double lr = 1e-3;  // Adagrad's default: 1e-2 (torch.optim.Adagrad's and DeepSpeedCPUAdagrad's)
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;          // Adagrad's default: 1e-10
  double weight_decay = 0.0;  // Adagrad: L2 decay (added to the gradient), as torch's
  // Decoupled weight decay (AdamW). DeepSpeed's default for "Adam" too (adam_w_mode: true);
  // "Adam" with adam_w_mode false adds L2 decay to the gradient; "AdamW" is always decoupled.
  bool adam_w_mode = true;
  bool bias_correction = true;  // Adam, AdamW, Lamb: false drops 1 - beta^t from the update
  // Adam, AdamW: DeepSpeed steps torch.optim.Adam(W) instead of its FusedAdam (the same update;
  // the checkpoint keeps the step count as torch's tensor, not FusedAdam's integer).
  bool torch_adam = false;
  double momentum = 0.0;  // SGD
  double dampening = 0.0;
  bool nesterov = false;
  double max_coeff = 10.0, min_coeff = 0.01;  // Lamb's trust-ratio clamp (DeepSpeed's defaults)
  // Adagrad without offload_optimizer (torch.optim.Adagrad): the rate of update t is
  // lr / (1 + (t - 1) * lr_decay), and the sum of squares starts at initial_accumulator_value.
  // With offload_optimizer DeepSpeed steps its DeepSpeedCPUAdagrad, which has neither.
  double lr_decay = 0.0, initial_accumulator_value = 0.0;
  // RMSprop (torch.optim.RMSprop, which DeepSpeed 0.19.8 builds by name; lr 1e-2 by default,
  // eps 1e-8, momentum, weight_decay as above): the smoothing constant, and the centered form.
  double alpha = 0.99;
  bool centered = false;
  bool given = false;  // the config had an "optimizer" section
};

struct SchedulerConfig {
  // "" (none), WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest (DeepSpeed's), or
  // one of torch.optim.lr_scheduler's (see torch_params).
  std::string type;
  // WarmupLR / WarmupDecayLR
  double warmup_min_lr = 0.0;
  // Not given: WarmupLR warms up to the optimizer's lr (DeepSpeed 0.19.8), WarmupDecayLR to
  // 0.001 (its own default).
  std::optional<double> warmup_max_lr;
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // log | linear
  int64_t total_num_steps = 0;      // WarmupDecayLR, WarmupCosineLR (required there)
  // WarmupCosineLR
  double warmup_min_ratio = 0.0, cos_min_ratio = 0.0001;
  // OneCycle
  double cycle_min_lr = 0.0, cycle_max_lr = 0.0, decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = -1;  // -1: = first
  int64_t cycle_first_stair_count = 0, cycle_second_stair_count = -1, decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8, cycle_max_mom = 0.9, decay_mom_rate = 0.0;
  // LRRangeTest
  double lr_range_test_min_lr = 0.001;
  int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
  // torch.optim.lr_scheduler's schedulers, which DeepSpeed 0.19.8 builds by name (StepLR,
  // MultiStepLR, ConstantLR, LinearLR, ExponentialLR, PolynomialLR, CosineAnnealingLR,
  // CosineAnnealingWarmRestarts, OneCycleLR; `type` holds the name): their constructor
  // arguments, with torch 2.11's defaults (0 where torch has none and the config must give it).
  struct Torch {
    int64_t step_size = 0;            // StepLR
    double gamma = 0.1;               // StepLR, MultiStepLR, ExponentialLR (required there)
    std::vector<int64_t> milestones;  // MultiStepLR (a milestone given twice counts twice)
    double factor = 1.0 / 3;          // ConstantLR
    int64_t total_iters = 5;          // ConstantLR, LinearLR, PolynomialLR
    double start_factor = 1.0 / 3, end_factor = 1.0;  // LinearLR
    double power = 1.0;                               // PolynomialLR
    int64_t T_max = 0;                                // CosineAnnealingLR
    double eta_min = 0.0;         // CosineAnnealingLR, CosineAnnealingWarmRestarts
    int64_t T_0 = 0, T_mult = 1;  // CosineAnnealingWarmRestarts
    // OneCycleLR: total_steps (or epochs * steps_per_epoch), max_lr.
    double max_lr = 0;
    int64_t total_steps = 0;
    double pct_start = 0.3;
    std::string anneal_strategy = "cos";  // cos | linear
    bool cycle_momentum = true;
    double base_momentum = 0.85, max_momentum = 0.95, div_factor = 25.0, final_div_factor = 1e4;
    bool three_phase = false;
  } torch_params;
  // Whether `type` is one of torch.optim.lr_scheduler's (the fields above apply).
  bool is_torch() const;
};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0;  // 0: dynamic
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
};

struct OffloadConfig {
  std::string device = "none";  // none | cpu ("nvme" is refused: not supported here)
  bool pin_memory = true;       // DeepSpeed 0.19.8's default (pinned host memory for CUDA)
  bool enabled() const { return device == "cpu"; }
};

struct ZeroOptimizationConfig {
  int stage = 0;
  // dtrain's default at every stage; DeepSpeed 0.19.8's is true at stage 3 (the same training;
  // `dtrain zero check` says so where a stage-3 config leaves it out).
  bool overlap_comm = false;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;     // elements (DeepSpeed's default 5e8)
  int64_t allgather_bucket_size = 500000000;  // elements
  // The two defaults dtrain sets apart from DeepSpeed's (5e7 and 1e9): stage 3 is chosen to fit
  // a model, and DeepSpeed's values keep the whole model (under ~500M parameters) gathered
  // between forward and backward and prefetch 200 MB ahead. dtrain's: a layer or so prefetched,
  // every layer released after each use - peak RSS 0.57x stage 0's at 2 ranks where DeepSpeed's
  // values give 0.77x (docs/zero.md, "Peak memory"). Training is bitwise the same either way;
  // set the keys to DeepSpeed's values for its fewer gathers.
  int64_t stage3_prefetch_bucket_size = 5000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 0;
  bool stage3_gather_16bit_weights_on_model_save = false;
  int64_t sub_group_size = 1000000000;
  // false (stages 1-2, no clipping): DeepSpeed's optimizer keeps no global norm
  // (get_global_grad_norm() is nullopt) and, in fp32, skips no non-finite step.
  bool compute_grad_norm = true;
  OffloadConfig offload_optimizer, offload_param;
};

// DeepSpeed's "data_types" section. Dtypes are DeepSpeed's canonical names ("fp16", "bf16",
// "fp32"), whatever spelling the config used ("half", "torch.bfloat16", ...).
struct DataTypesConfig {
  // Under fp16/bf16 training the engine casts every floating buffer to this dtype ("": buffers
  // keep their dtype, DeepSpeed 0.19.8's default - a BatchNorm then needs "bf16"/"fp16" here).
  std::string buffer_dtype;
  // Under fp16/bf16 training, buffers whose full name matches one of these patterns (a regular
  // expression searched in the name, '*' standing for any characters) are kept in fp32.
  std::vector<std::string> keep_in_fp32_modules;
  std::string grad_accum_dtype;  // "": the model's dtype
};

// DeepSpeed's "torch_autocast" section: the engine's forward runs under torch.autocast (as
// DeepSpeed's autocast_if_enabled runs it) on the parameters' device, in `dtype`.
struct TorchAutocastConfig {
  bool enabled = false;
  // DeepSpeed's canonical name ("bf16", "fp16": the loss scaled by torch.amp.GradScaler's rules;
  // "int8" is refused); "": torch's default for the device (CPU bf16, CUDA fp16, unscaled). "fp32"
  // leaves autocast off, as torch.autocast turns itself off for it (with a warning; here a note).
  std::string dtype;
  // The module classes whose parameters DeepSpeed marks with the autocast dtype: at stages 1-3
  // their gradients are reduced in it ("torch.nn.Linear", ...). Empty: not given (DeepSpeed's
  // Linear and Conv1d-3d).
  std::vector<std::string> lower_precision_safe_modules;
};

struct Config {
  int world_size = 1;
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 1;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  Fp16Config fp16;
  bool bf16 = false;
  double gradient_clipping = 1.0;  // DeepSpeed 0.19.8's default (GRADIENT_CLIPPING_DEFAULT); 0: off
  ZeroOptimizationConfig zero;
  DataTypesConfig data_types;
  TorchAutocastConfig torch_autocast;
  // DeepSpeed 0.19.8's progress line ("[Rank 0] step=N, skipped=S, lr=[...], mom=[...]" on
  // stdout, rank 0) once when the engine is built (step=0) and every `steps_per_print` optimizer
  // steps, counting skipped ones: no more when unset (its default, None). A number other than 0
  // (DeepSpeed prints where the step count modulo it is 0: -5 as 5, 2.5 every 5 steps). As
  // DeepSpeed's logger, the line appears only at log_level "info" or "debug"; its default level,
  // warning, hides it.
  std::optional<double> steps_per_print;
  // DeepSpeed's "log_level", lowercased (debug, info, warning, error, critical); "": not given,
  // DeepSpeed's logger stays at warning.
  std::string log_level;
  // DeepSpeed's "timers": {"throughput": {"enabled": true, "synchronized": true}}: its
  // throughput line ("epoch=0/micro_step=M/global_step=G, RunningAvgSamplesPerSec=...,
  // CurrSamplesPerSec=..., MemAllocated=...GB, MaxMemAllocated=...GB"), which rank 0 prints
  // after the progress line at the same steps_per_print cadence from optimizer step 3 on, at
  // log_level info or debug; `enabled` false: none. `synchronized`: the step's time waits for
  // the device (CUDA).
  bool throughput_timer = true;
  bool throughput_timer_synchronized = true;
  bool wall_clock_breakdown = false;  // read, not acted on (a note says so)
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // DeepSpeed 0.19.8's "managed_gradient_accumulation" (default true: the engine counts the
  // micro-steps and steps the optimizer every gradient_accumulation_steps). false: the caller
  // owns the boundary - backward() only accumulates (stages 0-1 reduce nothing in it) and every
  // step() is an optimizer step over the micro-batches since the last one (each backward still
  // divides its loss by gradient_accumulation_steps; global_samples() counts the micro-batches
  // taken). Not with overlap_comm at stages 0-1, as in DeepSpeed.
  bool managed_gradient_accumulation = true;
  nlohmann::json raw;  // the config as given (saved in checkpoints)
  // One line per key accepted but not acted on, or resolved from "auto" (see above).
  std::vector<std::string> notes;
};

struct ParseOptions {
  // Refuse every unknown key, also those DeepSpeed 0.19.8 ignores (top-level keys, and those in
  // optimizer, scheduler, data_types and timers) and which dtrain otherwise accepts with a note.
  // Default: false (`dtrain zero check --strict`, InitOptions::strict_config set it).
  bool strict = false;
};

// Parses and validates `config` for a data-parallel world of `world_size` ranks.
// Throws ConfigError (path + what is wrong + the closest valid key for unknown keys).
Config parse_config(const nlohmann::json& config, int world_size, const ParseOptions& options = {});
// `text` is JSON text, or a path to a file holding it (when it does not start with '{').
// Comments are allowed (DeepSpeed reads hjson); a key given twice in one object is a
// ConfigError naming it.
Config parse_config_text(const std::string& text_or_path, int world_size,
                         const ParseOptions& options = {});

// The closest of `candidates` to `word` by edit distance ("" when none is reasonably close).
std::string closest_key(const std::string& word, const std::vector<std::string>& candidates);

// Per-rank bytes of model states for `params` parameters (ZeRO paper's model: 2 bytes of
// 16-bit parameters + 2 of gradients + K = 12 of fp32 master, momentum and variance with
// mixed precision; 4 + 4 + 8 (K = 8) in plain fp32 where the parameters are the master copy).
// K counts 4 bytes per state tensor of the config's optimizer: Adam, AdamW and Lamb 2 (so a
// client optimizer too), Lion 2 with offload_optimizer (DeepSpeed's CPU Lion allocates an unused
// second) and 1 without (FusedLion), Adagrad 1,
// SGD 1 with momentum and 0 without.
struct MemoryEstimate {
  int64_t params = 0, grads = 0, optimizer = 0;  // bytes on this rank (device)
  int64_t offloaded = 0;                         // bytes moved to CPU memory by offload
  int64_t total() const { return params + grads + optimizer; }
};
MemoryEstimate estimate_memory(const Config& config, int64_t params);

// The report `dtrain zero check` prints: the resolved batch sizes, precision and loss scaler,
// ZeRO's buckets and offload, the optimizer and scheduler with their resolved params, clipping,
// progress printing and, with `params`, the per-rank memory. The notes are not in it
// (Config::notes; the check prints them to stderr).
std::string describe(const Config& config, std::optional<int64_t> params);

// The progress line DeepSpeed 0.19.8's engine logs (`_report_progress`): at step 0 when the
// engine is built, then after optimizer step `step` (skipped ones counted) when
// `steps_per_print` says so; "" when it logs none (not set, the step not a multiple, or a log
// level above info). `lr` and `mom` are Python's reprs of its lists ("[0.001]", "[(0.9, 0.999)]").
std::string progress_line(const Config& config, int64_t step, int64_t skipped,
                          const std::string& lr, const std::string& mom);

// `dtrain zero ...` (the CLI hook): args after "zero". Returns the exit code.
int zero_main(const std::vector<std::string>& args);

}  // namespace dtrain::zero
