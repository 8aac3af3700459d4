// DeepSpeed's config: strict parsing (unknown keys, types, ranges) and batch-size rules.
// parse_config reads the sections in order - each section's parser in its own file
// (zero/config_sections.h), all through one reader (zero/config_section.h) - then resolves them
// against each other (batch sizes, "auto", the optimizer's lr as the scheduler's default) and
// checks what DeepSpeed's engine checks across sections.
#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/zero_config.h"
#include "zero/config_sections.h"
#include "zero/config_text.h"

namespace dtrain::zero {

using namespace config_parse;

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// What DeepSpeed 0.19.8 decides only when its engine builds the optimizer (deepspeed.initialize),
// from keys of several sections.
void check_engine_rules(Section& root, Config& c) {
  const json& raw = c.raw;
  const json* zero = raw.contains("zero_optimization") && raw["zero_optimization"].is_object()
                         ? &raw["zero_optimization"]
                         : nullptr;
  const bool offload = c.zero.offload_optimizer.enabled();
  if (zero && !c.zero.compute_grad_norm) {
    Section zs(*zero, "zero_optimization", nullptr, true);
    if (c.gradient_clipping > 0)
      zs.fail("compute_grad_norm",
              "false needs \"gradient_clipping\": 0 (DeepSpeed 0.19.8 refuses it with clipping, "
              "whose default is 1.0); gradient_clipping is " +
                  json(c.gradient_clipping).dump());
    if (offload)
      zs.fail("compute_grad_norm",
              "false does not go with offload_optimizer (DeepSpeed 0.19.8 refuses the pair too); "
              "remove one of them");
  }
  const json* params = raw.contains("optimizer") && raw["optimizer"].is_object() &&
                               raw["optimizer"].contains("params") &&
                               raw["optimizer"]["params"].is_object()
                           ? &raw["optimizer"]["params"]
                           : nullptr;
  const bool torch_adam = params && params->value("torch_adam", json(false)) == json(true);
  if (params && params->contains("set_grad_none") && offload && !torch_adam)
    throw ConfigError(
        "optimizer.params.set_grad_none: unknown key with offload_optimizer (DeepSpeed 0.19.8 "
        "refuses it too: it passes the key to its CPU Adam, which has no such argument); remove "
        "it");
  // Adagrad: DeepSpeed 0.19.8 builds DeepSpeedCPUAdagrad(lr, eps, weight_decay, amsgrad,
  // fp32_optimizer_states) with offload_optimizer, else torch.optim.Adagrad(lr, lr_decay,
  // weight_decay, initial_accumulator_value, eps, foreach, maximize, differentiable, fused).
  if (params && c.optimizer.type == "Adagrad") {
    static const std::vector<std::string> torch_only = {
        "lr_decay", "initial_accumulator_value", "foreach", "maximize", "differentiable", "fused"};
    static const std::vector<std::string> cpu_only = {"amsgrad", "fp32_optimizer_states"};
    for (const auto& k : offload ? torch_only : cpu_only)
      if (params->contains(k))
        throw ConfigError(
            "optimizer.params." + k +
            (offload ? ": unknown key with offload_optimizer (DeepSpeed 0.19.8 refuses it too: it "
                       "passes the key to its CPU Adagrad, DeepSpeedCPUAdagrad, which takes only "
                       "lr, eps, weight_decay, amsgrad and fp32_optimizer_states); remove it, or "
                       "drop offload_optimizer for torch.optim.Adagrad's"
                     : ": unknown key without offload_optimizer (DeepSpeed 0.19.8 refuses it too: "
                       "it passes the key to torch.optim.Adagrad, which has no such argument; "
                       "only its CPU Adagrad, with offload_optimizer, takes it); remove it"));
  }
  // Lion: DeepSpeed 0.19.8 builds DeepSpeedCPULion(lr, betas, weight_decay,
  // fp32_optimizer_states) with offload_optimizer, else FusedLion(lr, betas, weight_decay,
  // set_grad_none), a CUDA kernel whose update dtrain runs as tensor ops (on any device).
  if (params && c.optimizer.type == "Lion") {
    const std::string k = offload ? "set_grad_none" : "fp32_optimizer_states";
    if (params->contains(k))
      throw ConfigError(
          "optimizer.params." + k +
          (offload ? ": unknown key with offload_optimizer (DeepSpeed 0.19.8 refuses it too: it "
                     "passes the key to its CPU Lion, DeepSpeedCPULion, which takes only lr, "
                     "betas, weight_decay and fp32_optimizer_states); remove it"
                   : ": unknown key without offload_optimizer (DeepSpeed 0.19.8 refuses it too: "
                     "it passes the key to FusedLion, which takes only lr, betas, weight_decay "
                     "and set_grad_none); remove it"));
  }
  // Adagrad at stage 0 under fp16/bf16: DeepSpeed 0.19.8 wraps torch.optim.Adagrad in its
  // FP16_UnfusedOptimizer, whose fp32 copies of the parameters lack the state Adagrad made in its
  // constructor: its first step (on zero gradients, in deepspeed.initialize) fails. (With
  // offload_optimizer its DeepSpeedCPUAdagrad makes its state at its first step: that runs.)
  if (c.optimizer.type == "Adagrad" && c.zero.stage == 0 && (c.fp16.enabled || c.bf16) && !offload)
    throw ConfigError(
        "optimizer.type: Adagrad at stage 0 with " + std::string(c.bf16 ? "bf16" : "fp16") +
        " fails in DeepSpeed 0.19.8 too (its FP16_UnfusedOptimizer steps fp32 copies of the "
        "parameters for which torch.optim.Adagrad made no state: KeyError: 'sum' in "
        "deepspeed.initialize); use ZeRO stage 1, 2 or 3, or fp32");
  // DeepSpeed's engine runs ZeRO only with optimizers it has tested (Adam, AdamW, Adagrad, Lion
  // and their CPU versions) unless told otherwise; dtrain runs SGD and Lamb partitioned too.
  bool untested_ok = false;
  if (auto u = raw.find("zero_allow_untested_optimizer"); u != raw.end() && u->is_boolean())
    untested_ok = u->get<bool>();
  if (c.optimizer.given && c.zero.stage > 0 && !untested_ok &&
      (c.optimizer.type == "SGD" || c.optimizer.type == "Lamb"))
    root.note("optimizer", c.optimizer.type +
                               " under ZeRO: dtrain runs it; DeepSpeed 0.19.8 would refuse it "
                               "(an untested ZeRO optimizer) without "
                               "\"zero_allow_untested_optimizer\": true");
}

// "steps_per_print" and "log_level" as DeepSpeed 0.19.8 uses them. DeepSpeedConfig takes any
// steps_per_print (a plain .get()); its engine computes `(global_steps + 1) % steps_per_print`
// after every optimizer step on rank 0, so 0 or false (ZeroDivisionError) and a string, list or
// object (TypeError) stop its first step: refused here before the run. Its logger prints the
// line only at log level info or below; deepspeed.initialize sets the level from "log_level",
// lowercased, and refuses anything else.
void parse_progress(Section& root, Config& c) {
  if (const json* v = root.get("steps_per_print")) {
    if (v->is_boolean() ? !v->get<bool>() : v->is_number() && v->get<double>() == 0)
      root.fail("steps_per_print",
                v->dump() +
                    " fails DeepSpeed 0.19.8's first optimizer step (ZeroDivisionError: it takes "
                    "the step count modulo this value; DeepSpeedConfig itself accepts it): give a "
                    "positive integer, or leave the key out for no progress line");
    if (!v->is_number() && !v->is_boolean())
      root.fail("steps_per_print",
                "expected a number, got " + v->dump() +
                    " (DeepSpeed 0.19.8 accepts it in DeepSpeedConfig but fails its first "
                    "optimizer step with a TypeError): give a positive integer");
    c.steps_per_print = v->is_boolean() ? 1.0 : v->get<double>();
    if (v->is_boolean())
      root.note("steps_per_print", "true: every step (Python's True is 1, as DeepSpeed reads it)");
  }
  if (const json* v = root.get("log_level")) {
    std::string level = v->is_string() ? lower(v->get<std::string>()) : "";
    if (level != "debug" && level != "info" && level != "warning" && level != "error" &&
        level != "critical")
      root.fail("log_level", v->dump() +
                                 " is not a log level (allowed: debug, info, warning, error, "
                                 "critical, in any case; DeepSpeed 0.19.8 refuses it too when "
                                 "deepspeed.initialize sets it)");
    c.log_level = level;
  }
  if (c.steps_per_print && c.log_level != "info" && c.log_level != "debug")
    root.note("steps_per_print",
              "no progress line at log_level " +
                  (c.log_level.empty() ? std::string("warning (the default)") : c.log_level) +
                  ": DeepSpeed 0.19.8's logger hides it there, and so does dtrain; set "
                  "\"log_level\": \"info\" to see it");
}

// "timers": DeepSpeed 0.19.8 reads only "throughput" (get_timers_config), through pydantic
// (DeepSpeedThroughputTimerConfig: enabled, synchronized; unknown keys refused).
void parse_timers(Section& root, Config& c) {
  const json* v = root.get("timers");
  if (!v) {
    if (root.has("timers"))
      root.fail("timers",
                "null (DeepSpeed 0.19.8 fails on it too): give an object, e.g. {\"throughput\": "
                "{\"enabled\": false}}, or leave the key out");
    return;
  }
  Section timers(*v, "timers", root.notes());
  timers.ignores_unknown_keys_like(root);
  if (const json* t = timers.get("throughput")) {
    Section s(*t, "timers.throughput", root.notes(), /*validated=*/true);
    s.boolean("enabled", c.throughput_timer);
    s.boolean("synchronized", c.throughput_timer_synchronized);
    s.finish();
  } else if (timers.has("throughput")) {
    timers.fail("throughput",
                "null (DeepSpeed 0.19.8 fails on it too): give an object or leave the key out");
  }
  timers.finish();
}

void set_batch(Config& c, std::optional<int64_t> tbs, std::optional<int64_t> micro,
               std::optional<int64_t> gas) {
  const int64_t ws = c.world_size;
  auto mismatch = [&](const std::string& what) { throw ConfigError("train_batch_size: " + what); };
  // Every product below, checked once: the batch keys are int64 and a product that does not
  // fit is no batch anyone trains with.
  {
    int64_t p = ws, q = 0;
    for (const auto& v : {micro, gas})
      if (v && __builtin_mul_overflow(p, *v, &q))
        throw ConfigError(
            "train_micro_batch_size_per_gpu * gradient_accumulation_steps * "
            "world_size: too large for a batch size (" +
            std::to_string(micro.value_or(1)) + " * " + std::to_string(gas.value_or(1)) + " * " +
            std::to_string(ws) + "); check the values");
      else if (v)
        p = q;
  }
  if (tbs && micro && gas) {
    if (*tbs != *micro * *gas * ws)
      mismatch(
          "is not equal to train_micro_batch_size_per_gpu * gradient_accumulation_steps * "
          "world_size: " +
          std::to_string(*tbs) + " != " + std::to_string(*micro) + " * " + std::to_string(*gas) +
          " * " + std::to_string(ws) + " (change one of them, or leave one out to derive it)");
  } else if (tbs && micro) {
    if (*tbs % (*micro * ws) != 0)
      mismatch(std::to_string(*tbs) +
               " is not divisible by train_micro_batch_size_per_gpu * world_size = " +
               std::to_string(*micro * ws));
    gas = *tbs / (*micro * ws);
  } else if (tbs && gas) {
    if (*tbs % (*gas * ws) != 0)
      mismatch(std::to_string(*tbs) +
               " is not divisible by gradient_accumulation_steps * world_size = " +
               std::to_string(*gas * ws));
    micro = *tbs / (*gas * ws);
  } else if (micro && gas) {
    tbs = *micro * *gas * ws;
  } else if (tbs) {
    gas = 1;
    if (*tbs % ws != 0)
      mismatch(std::to_string(*tbs) + " is not divisible by the world size " + std::to_string(ws));
    micro = *tbs / ws;
  } else if (micro) {
    gas = 1;
    tbs = *micro * ws;
  } else {
    throw ConfigError(
        "train_batch_size: either train_batch_size or train_micro_batch_size_per_gpu needs to be "
        "provided");
  }
  if (*micro <= 0)
    mismatch(
        "the derived train_micro_batch_size_per_gpu is 0 (train_batch_size too small for the world "
        "size)");
  c.train_batch_size = *tbs;
  c.train_micro_batch_size_per_gpu = *micro;
  c.gradient_accumulation_steps = *gas;
}

}  // namespace

std::string closest_key(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  // Close enough to be a typo: within a third of the longer word (at least 2 edits).
  size_t limit = std::max<size_t>(2, std::max(word.size(), best.size()) / 3);
  return best_d <= limit ? best : std::string();
}

Config parse_config(const json& config, int world_size, const ParseOptions& options) {
  if (world_size < 1)
    throw ConfigError("world size must be >= 1, got " + std::to_string(world_size));
  Config c;
  c.world_size = world_size;
  c.raw = config;
  Section root(config, "", &c.notes);
  root.ignores_unknown_keys(options.strict);
  // Removed in DeepSpeed 0.19.8 (runtime/config.py refuses them): DeepSpeed's reasons.
  static const std::vector<std::pair<std::string, std::string>> removed = {
      {"nebula", "Nebula checkpointing was removed from DeepSpeed"},
      {"compression_training", "DeepSpeed's compression library was removed"},
      {"amp", "NVIDIA Apex AMP integration was removed; use \"fp16\" or \"bf16\""},
      {"quantize_training", "Mixture-of-Quantization (MoQ) was removed"},
      {"sparse_gradients", "sparse compression of dense embedding gradients was removed"},
      {"eigenvalue", "eigenvalue-based MoQ was removed"},
      {"sparse_attention", "DeepSpeed Sparse Attention was removed"},
      {"elasticity",
       "elastic training's batch configuration was removed; set train_batch_size / "
       "train_micro_batch_size_per_gpu / gradient_accumulation_steps directly (dtrain's elastic "
       "launch is `dtrain run --nnodes MIN:MAX`)"},
      {"graph_harvesting", "graph harvesting was removed"},
      {"curriculum_learning",
       "the top-level curriculum_learning was removed (DeepSpeed now reads "
       "data_efficiency.data_sampling.curriculum_learning)"},
      {"progressive_layer_drop", "Progressive Layer Dropping was removed"}};
  for (const auto& [key, why] : removed)
    if (root.has(key))
      root.fail(key, why + " in DeepSpeed 0.19.8, which refuses this key too; remove it");
  std::optional<int64_t> tbs, micro, gas;
  int64_t v = 0;
  if (root.integer("train_batch_size", v, 1, INT64_MAX, true)) tbs = v;
  if (root.integer("train_micro_batch_size_per_gpu", v, 1, INT64_MAX, true)) micro = v;
  if (root.integer("gradient_accumulation_steps", v, 1, INT64_MAX, true)) gas = v;
  parse_optimizer(root, c);
  parse_scheduler(root, c);
  std::string master_16bit;  // the 16-bit master weights option set, if any (needs ZeRO)
  if (auto f = root.get("fp16")) {
    Section s(*f, "fp16", &c.notes, true);
    s.boolean("enabled", c.fp16.enabled);
    // As DeepSpeed's DeepSpeedFP16Config: loss_scale a finite number >= 0 (not a boolean);
    // loss_scale_window and min_loss_scale integers, > 0 where the scaling is dynamic (checked
    // below); initial_scale_power and hysteresis any integer.
    s.number("loss_scale", c.fp16.loss_scale, 0, INFINITY, false, /*allow_bool=*/false);
    if (std::isinf(c.fp16.loss_scale))
      s.fail("loss_scale", "must be a finite number (DeepSpeed 0.19.8 refuses inf too)");
    s.integer("initial_scale_power", c.fp16.initial_scale_power, INT32_MIN, INT32_MAX);
    s.integer("loss_scale_window", c.fp16.loss_scale_window, INT64_MIN, INT64_MAX, false,
              /*allow_bool=*/false);
    s.integer("hysteresis", c.fp16.hysteresis, INT32_MIN, INT32_MAX);
    s.boolean("consecutive_hysteresis", c.fp16.consecutive_hysteresis);
    int64_t min_scale = 1;
    if (s.integer("min_loss_scale", min_scale, INT64_MIN, INT64_MAX, false, /*allow_bool=*/false))
      c.fp16.min_loss_scale = static_cast<double>(min_scale);
    if (c.fp16.enabled && c.fp16.loss_scale == 0) {
      if (c.fp16.loss_scale_window <= 0)
        s.fail("loss_scale_window", "must be > 0 with dynamic loss scaling (loss_scale 0), got " +
                                        std::to_string(c.fp16.loss_scale_window) +
                                        " (DeepSpeed 0.19.8 refuses it too)");
      if (c.fp16.min_loss_scale <= 0)
        s.fail("min_loss_scale", "must be > 0 with dynamic loss scaling (loss_scale 0), got " +
                                     std::to_string(min_scale) +
                                     " (DeepSpeed 0.19.8 refuses it too)");
      if (c.fp16.hysteresis < 1)
        s.note("hysteresis", std::to_string(c.fp16.hysteresis) +
                                 ": an overflow never lowers the loss scale (it only skips the "
                                 "step), as in DeepSpeed 0.19.8");
    }
    s.ignore("auto_cast",
             "DeepSpeed casts the module's inputs to fp16; dtrain does not (cast "
             "your inputs)");
    bool fp16_master = false;
    s.boolean("fp16_master_weights_and_grads", fp16_master);
    if (fp16_master)
      s.note("fp16_master_weights_and_grads",
             "DeepSpeed keeps fp16 master weights; dtrain keeps fp32 masters");
    if (fp16_master) master_16bit = "fp16.fp16_master_weights_and_grads";
    s.finish();
  } else if (root.has("fp16")) {
    root.fail("fp16", "null (DeepSpeed 0.19.8 fails on it too): give an object or leave it out");
  }
  // DeepSpeed reads "bf16", and its old name "bfloat16" only where "bf16" is absent (or null).
  const json* bf16 = root.get("bf16");
  const json* bfloat16 = root.get("bfloat16");
  if (bf16 && bfloat16)
    root.note("bfloat16",
              "ignored: bf16 is given, and DeepSpeed 0.19.8 reads this old name only without it");
  if (!bf16 && !bfloat16 && root.has("bfloat16"))
    root.fail("bfloat16",
              "null (DeepSpeed 0.19.8 fails on it too): give an object or leave it out");
  if (const json* b = bf16 ? bf16 : bfloat16) {
    Section s(*b, bf16 ? "bf16" : "bfloat16", &c.notes, true);
    s.boolean("enabled", c.bf16);
    for (const char* k : {"immediate_grad_update", "check_grad_overflow"}) s.accept_bool(k);
    bool master = false, states = false;
    s.boolean("bf16_master_weights_and_grads", master);
    s.boolean("bf16_optimizer_states", states);
    if (master)
      s.note("bf16_master_weights_and_grads",
             "DeepSpeed keeps bf16 master weights; dtrain keeps fp32 masters");
    if (states) {
      if (!master)
        s.fail("bf16_optimizer_states",
               "needs bf16_master_weights_and_grads: true (DeepSpeed 0.19.8 refuses it too)");
      s.note("bf16_optimizer_states",
             "DeepSpeed keeps the optimizer state in bf16; dtrain keeps it in fp32");
    }
    if (master || states)
      master_16bit = s.where(master ? "bf16_master_weights_and_grads" : "bf16_optimizer_states");
    s.finish();
  }
  if (c.fp16.enabled && c.bf16) throw ConfigError("fp16, bf16: both enabled; choose one");
  if (Section::is_auto(root.get("gradient_clipping"))) {
    root.note("gradient_clipping",
              "\"auto\": 1.0 (DeepSpeed's default; Hugging Face's Trainer would fill in its "
              "max_grad_norm, 1.0 unless set)");
  } else {
    root.number("gradient_clipping", c.gradient_clipping);
    if (c.gradient_clipping < 0)
      root.note("gradient_clipping", json(c.gradient_clipping).dump() +
                                         ": no clipping (DeepSpeed 0.19.8 clips only above 0)");
  }
  std::vector<std::string> unused;  // keys given that dtrain does not act on
  parse_zero(root, c, unused);
  parse_data_types(root, c);
  parse_communication_data_type(root, c);
  parse_torch_autocast(root, c);
  // DeepSpeed 0.19.8 keeps 16-bit masters only with ZeRO (DeepSpeedConfig refuses them at
  // stage 0).
  if (!master_16bit.empty() && c.zero.stage == 0)
    throw ConfigError(master_16bit +
                      ": needs zero_optimization.stage 1, 2 or 3 (DeepSpeed 0.19.8 refuses it at "
                      "stage 0 too); remove it or enable ZeRO");
  check_engine_rules(root, c);
  parse_progress(root, c);
  parse_timers(root, c);
  check_by_name_rules(root, c);
  root.boolean("wall_clock_breakdown", c.wall_clock_breakdown);
  root.boolean("prescale_gradients", c.prescale_gradients);
  root.number("gradient_predivide_factor", c.gradient_predivide_factor, 1e-30);
  root.boolean("managed_gradient_accumulation", c.managed_gradient_accumulation);
  if (!c.managed_gradient_accumulation && c.zero.overlap_comm && c.zero.stage < 2)
    root.fail("managed_gradient_accumulation",
              "false does not go with zero_optimization.overlap_comm at stage " +
                  std::to_string(c.zero.stage) +
                  " (DeepSpeed 0.19.8 refuses the pair too: it reduces a caller-owned "
                  "accumulation at step(), overlapping nothing); set overlap_comm false or use "
                  "stage 2 or 3");
  // DeepSpeed 0.19.8 scales reductions' inputs and outputs by these; dtrain divides by the world
  // size once: before reducing at stages 1-3 (its ZeRO optimizers' default), after at stage 0.
  if (c.prescale_gradients)
    root.note("prescale_gradients",
              "true: DeepSpeed divides by the world size before reducing; dtrain does so at "
              "stages 1-3 and after the reduction at stage 0 (the same mean, rounded at another "
              "point)");
  if (c.gradient_predivide_factor != 1.0)
    root.note("gradient_predivide_factor",
              json(c.gradient_predivide_factor).dump() +
                  ": DeepSpeed divides by it before reducing and by world size / it after; "
                  "dtrain divides by the world size once, before reducing at stages 1-3 and "
                  "after at stage 0 (the same mean, rounded at another point)");
  // DeepSpeed reads these; they change nothing in what dtrain computes or prints. Given, they
  // are named in one note (below).
  root.accept("zero_allow_untested_optimizer");  // acted on: silences the untested-ZeRO note
  for (const char* k :
       {"memory_breakdown", "dump_state", "disable_allgather", "disable_python_gc",
        "zero_force_ds_cpu_optimizer", "dataloader_drop_last", "gradient_allreduce_op",
        "use_data_before_expert_parallelism", "vocabulary_size"})
    if (root.get(k)) unused.push_back(k);
  if (root.has("wall_clock_breakdown")) unused.push_back("wall_clock_breakdown");
  // Sections DeepSpeed acts on and dtrain does not: accepted with what dtrain does instead.
  static const std::vector<std::pair<std::string, std::string>> ignored = {
      {"activation_checkpointing",
       "DeepSpeed's activation checkpointing (deepspeed.checkpointing); dtrain keeps every "
       "activation (checkpoint inside your module to trade compute for memory)"},
      {"seq_parallel_communication_data_type", "dtrain has no sequence parallelism"},
      {"tensorboard", "DeepSpeed's TensorBoard monitor; dtrain logs through dtrain::mlflow"},
      {"wandb", "DeepSpeed's W&B monitor; dtrain logs through dtrain::mlflow"},
      {"csv_monitor", "DeepSpeed's CSV monitor; dtrain logs through dtrain::mlflow"},
      {"comet", "DeepSpeed's Comet monitor; dtrain logs through dtrain::mlflow"},
      {"comms_logger",
       "DeepSpeed's communication logger; dtrain's is the timeline "
       "(DTRAIN_TIMELINE) and flight recorder"},
      {"flops_profiler", "DeepSpeed's FLOPS profiler; not in dtrain"},
      {"autotuning", "DeepSpeed's autotuner; not in dtrain (dtrain::tune searches configs)"},
      {"aio", "libaio settings for NVMe offload, which dtrain does not do"},
      {"checkpoint",
       "DeepSpeed's checkpoint engine settings; dtrain writes every checkpoint "
       "atomically in DeepSpeed's layout, and always refuses ranks that save under different "
       "tags (tag_validation Fail)"},
      {"data_efficiency", "DeepSpeed's data sampling/routing; give dtrain the data in order"},
      {"compile", "DeepSpeed's torch.compile; not in libtorch's C++ frontend"},
      {"hybrid_engine", "DeepSpeed-Chat's inference engine; not in dtrain"},
      {"pipeline",
       "DeepSpeed's pipeline engine settings; dtrain's pipeline is "
       "dtrain::pipeline"},
      {"tensor_parallel",
       "DeepSpeed's AutoTP; dtrain's tensor parallelism is "
       "dtrain::tensor_parallel"},
      {"expert_parallel", "DeepSpeed's mixture-of-experts parallelism; not in dtrain"},
      {"weight_quantization", "DeepSpeed's inference weight quantization; not in dtrain"},
      {"datastates_ckpt",
       "DataStates asynchronous checkpointing; dtrain checkpoints "
       "synchronously"},
      {"sequence_parallel_size", "dtrain has no sequence parallelism"}};
  for (const auto& [key, why] : ignored) root.ignore(key, "accepted, not acted on: " + why);
  root.finish();
  if (!unused.empty()) {
    std::string keys;
    for (const auto& k : unused) keys += (keys.empty() ? "" : ", ") + k;
    c.notes.push_back(
        keys +
        ": read and type-checked as DeepSpeed 0.19.8 reads them, but not acted on by dtrain "
        "(they tune DeepSpeed's own timers, logging, memory reports or implementation; what dtrain "
        "computes is the same without them: remove them, or keep them for DeepSpeed)");
  }
  set_batch(c, tbs, micro, gas);
  return c;
}

Config parse_config_text(const std::string& text_or_path, int world_size,
                         const ParseOptions& options) {
  std::string text = text_or_path;
  auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{') {
    std::error_code ec;
    if (std::filesystem::is_directory(text_or_path, ec))
      throw ConfigError(text_or_path +
                        ": is a directory (give a path to a JSON file or the JSON text)");
    std::ifstream in(text_or_path, std::ios::binary);
    if (!in)
      throw ConfigError(
          text_or_path +
          ": cannot read the config file (give a path to a JSON file or the JSON text)");
    // Up to a bound (a device such as /dev/zero must not be read forever); a pipe is fine.
    constexpr size_t kMaxBytes = size_t(16) << 20;
    text.clear();
    char chunk[1 << 16];
    while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
      text.append(chunk, static_cast<size_t>(in.gcount()));
      if (text.size() > kMaxBytes)
        throw ConfigError(text_or_path +
                          ": larger than 16 MiB, which no DeepSpeed config is (give a path to a "
                          "JSON file or the JSON text)");
    }
  }
  return parse_config(
      read_config_text(text, first == std::string::npos || text_or_path[first] != '{'
                                 ? text_or_path
                                 : std::string("config")),
      world_size, options);
}

}  // namespace dtrain::zero
