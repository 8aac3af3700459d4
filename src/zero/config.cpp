// DeepSpeed's config: strict parsing (unknown keys, types, ranges) and batch-size rules.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "dtrain/zero_config.h"

namespace dtrain::zero {
namespace {

using nlohmann::json;

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

// One section's reader: every access records the key as known; finish() rejects the rest.
class Section {
 public:
  Section(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) fail("", "must be an object, got " + std::string(j_.type_name()));
  }
  std::string where(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    std::string p = key.empty() ? path_ : where(key);
    throw ConfigError((p.empty() ? std::string("config") : p) + ": " + what);
  }
  const json* get(const std::string& key) {
    known_.push_back(key);
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  static bool is_auto(const json* v) {
    return v && v->is_string() && v->get<std::string>() == "auto";
  }
  void boolean(const std::string& key, bool& out) {
    if (auto v = get(key)) {
      if (!v->is_boolean()) fail(key, "expected true or false, got " + v->dump());
      out = v->get<bool>();
    }
  }
  void number(const std::string& key, double& out, double lo = -INFINITY, double hi = INFINITY,
              bool allow_auto = false) {
    if (auto v = get(key)) {
      if (allow_auto && is_auto(v)) return;
      if (!v->is_number()) fail(key, "expected a number, got " + v->dump());
      double d = v->get<double>();
      if (!(d >= lo && d <= hi))
        fail(key, "out of range: " + v->dump() + " (allowed: " + range(lo, hi) + ")");
      out = d;
    }
  }
  // Integers; JSON numbers like 5e8 (DeepSpeed's own examples) are accepted when integral.
  bool integer(const std::string& key, int64_t& out, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX,
               bool allow_auto = false) {
    if (auto v = get(key)) {
      if (allow_auto && is_auto(v)) return false;
      if (!v->is_number()) fail(key, "expected an integer, got " + v->dump());
      double d = v->get<double>();
      if (d != std::floor(d) || std::fabs(d) > 9e18)
        fail(key, "expected an integer, got " + v->dump());
      int64_t i = v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(d);
      if (i < lo || i > hi)
        fail(key, "out of range: " + v->dump() + " (allowed: " + range(lo, hi) + ")");
      out = i;
      return true;
    }
    return false;
  }
  void integer(const std::string& key, int& out, int64_t lo, int64_t hi) {
    int64_t v = out;
    integer(key, v, lo, hi);
    out = static_cast<int>(v);
  }
  void string(const std::string& key, std::string& out,
              const std::vector<std::string>& allowed = {}) {
    if (auto v = get(key)) {
      if (!v->is_string()) fail(key, "expected a string, got " + v->dump());
      std::string s = v->get<std::string>();
      if (!allowed.empty()) {
        auto it = std::find_if(allowed.begin(), allowed.end(), [&](const std::string& a) {
          return a.size() == s.size() &&
                 std::equal(a.begin(), a.end(), s.begin(),
                            [](char x, char y) { return std::tolower(x) == std::tolower(y); });
        });
        if (it == allowed.end()) {
          std::string list;
          for (auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
          std::string near = closest_key(s, allowed);
          fail(key, "unknown value \"" + s + "\" (allowed: " + list + ")" +
                        (near.empty() ? "" : "; did you mean " + near + "?"));
        }
        s = *it;
      }
      out = s;
    }
  }
  // Keys this section accepts but whose value we only type-check.
  void accept(const std::string& key) { get(key); }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
      std::string near = closest_key(it.key(), known_);
      fail(it.key(),
           "unknown key" + (near.empty() ? std::string() : "; did you mean " + near + "?"));
    }
  }

 private:
  static std::string range(double lo, double hi) {
    std::ostringstream s;
    if (std::isinf(lo))
      s << "<= " << hi;
    else if (std::isinf(hi))
      s << ">= " << lo;
    else
      s << lo << " .. " << hi;
    return s.str();
  }
  static std::string range(int64_t lo, int64_t hi) {
    if (lo == INT64_MIN) return "<= " + std::to_string(hi);
    if (hi == INT64_MAX) return ">= " + std::to_string(lo);
    return std::to_string(lo) + " .. " + std::to_string(hi);
  }
  const json& j_;
  std::string path_;
  std::vector<std::string> known_;
};

void parse_offload(Section& parent, const std::string& key, OffloadConfig& out, bool param) {
  if (auto v = parent.get(key)) {
    Section s(*v, parent.where(key));
    s.string("device", out.device, {"none", "cpu", "nvme"});
    if (out.device == "nvme")
      s.fail("device", "\"nvme\" offload is not supported by dtrain (use \"cpu\")");
    s.boolean("pin_memory", out.pin_memory);
    s.accept("nvme_path");
    s.accept("buffer_count");
    s.accept("buffer_size");
    s.accept("max_in_cpu");
    if (!param) {
      s.accept("pipeline_read");
      s.accept("pipeline_write");
      s.accept("fast_init");
      s.accept("ratio");
    }
    s.finish();
  }
}

void parse_optimizer(Section& root, Config& c) {
  auto v = root.get("optimizer");
  if (!v) return;
  Section s(*v, "optimizer");
  auto& o = c.optimizer;
  o.given = true;
  if (!s.get("type")) s.fail("type", "missing (one of Adam, AdamW, SGD, Lamb)");
  s.string("type", o.type, {"Adam", "AdamW", "SGD", "Lamb"});
  o.adam_w_mode = o.type == "AdamW";
  if (o.type == "SGD") o.lr = 1e-3;
  if (auto p = s.get("params")) {
    Section ps(*p, "optimizer.params");
    ps.number("lr", o.lr, 0, INFINITY, true);
    ps.number("eps", o.eps, 0, INFINITY, true);
    ps.number("weight_decay", o.weight_decay, 0, INFINITY, true);
    if (o.type != "SGD") {
      if (auto b = ps.get("betas"); b && !Section::is_auto(b)) {
        if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number())
          ps.fail("betas", "expected [beta1, beta2], got " + b->dump());
        o.beta1 = (*b)[0].get<double>();
        o.beta2 = (*b)[1].get<double>();
        if (o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1)
          ps.fail("betas", "each beta must be in [0, 1), got " + b->dump());
      }
      if (o.type == "Adam" || o.type == "AdamW") {
        ps.boolean("adam_w_mode", o.adam_w_mode);
        ps.accept("amsgrad");
        if (auto a = ps.get("amsgrad"); a && a->is_boolean() && a->get<bool>())
          ps.fail("amsgrad", "not supported");
        ps.accept("bias_correction");
        ps.accept("torch_adam");
        ps.accept("fused");
      }
      if (o.type == "Lamb") {
        ps.number("max_coeff", o.max_coeff, 0);
        ps.number("min_coeff", o.min_coeff, 0);
        ps.accept("bias_correction");
      }
    } else {
      ps.number("momentum", o.momentum, 0, 1);
      ps.number("dampening", o.dampening, 0, 1);
      ps.boolean("nesterov", o.nesterov);
    }
    ps.finish();
  }
  s.accept("legacy_fusion");
  s.finish();
}

void parse_scheduler(Section& root, Config& c) {
  auto v = root.get("scheduler");
  if (!v) return;
  Section s(*v, "scheduler");
  auto& sc = c.scheduler;
  if (!s.get("type"))
    s.fail("type",
           "missing (one of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)");
  s.string("type", sc.type,
           {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"});
  if (auto p = s.get("params")) {
    Section ps(*p, "scheduler.params");
    ps.accept("last_batch_iteration");
    const auto& t = sc.type;
    if (t == "WarmupLR" || t == "WarmupDecayLR") {
      ps.number("warmup_min_lr", sc.warmup_min_lr, 0, INFINITY, true);
      ps.number("warmup_max_lr", sc.warmup_max_lr, 0, INFINITY, true);
      ps.integer("warmup_num_steps", sc.warmup_num_steps, 0, INT64_MAX, true);
      ps.string("warmup_type", sc.warmup_type, {"log", "linear"});
      if (t == "WarmupDecayLR")
        ps.integer("total_num_steps", sc.total_num_steps, 1, INT64_MAX, true);
    } else if (t == "WarmupCosineLR") {
      ps.integer("total_num_steps", sc.total_num_steps, 1, INT64_MAX, true);
      ps.number("warmup_min_ratio", sc.warmup_min_ratio, 0, 1);
      ps.integer("warmup_num_steps", sc.warmup_num_steps, 0, INT64_MAX, true);
      ps.number("cos_min_ratio", sc.cos_min_ratio, 0, 1);
      ps.string("warmup_type", sc.warmup_type, {"log", "linear"});
    } else if (t == "OneCycle") {
      ps.number("cycle_min_lr", sc.cycle_min_lr, 0);
      ps.number("cycle_max_lr", sc.cycle_max_lr, 0);
      ps.number("decay_lr_rate", sc.decay_lr_rate, 0);
      ps.integer("cycle_first_step_size", sc.cycle_first_step_size, 1);
      ps.integer("cycle_second_step_size", sc.cycle_second_step_size, 1);
      ps.integer("cycle_first_stair_count", sc.cycle_first_stair_count, 0);
      ps.integer("cycle_second_stair_count", sc.cycle_second_stair_count, 0);
      ps.integer("decay_step_size", sc.decay_step_size, 0);
      ps.boolean("cycle_momentum", sc.cycle_momentum);
      ps.number("cycle_min_mom", sc.cycle_min_mom, 0, 1);
      ps.number("cycle_max_mom", sc.cycle_max_mom, 0, 1);
      ps.number("decay_mom_rate", sc.decay_mom_rate, 0);
    } else {
      ps.number("lr_range_test_min_lr", sc.lr_range_test_min_lr, 0);
      ps.integer("lr_range_test_step_size", sc.lr_range_test_step_size, 1);
      ps.number("lr_range_test_step_rate", sc.lr_range_test_step_rate, 0);
      ps.boolean("lr_range_test_staircase", sc.lr_range_test_staircase);
    }
    ps.finish();
  }
  if ((sc.type == "WarmupDecayLR" || sc.type == "WarmupCosineLR") && sc.total_num_steps <= 0)
    s.fail("params.total_num_steps", "required by " + sc.type + " (a positive integer)");
  s.finish();
}

bool enabled_flag(Section& s) {
  bool on = false;
  if (auto e = s.get("enabled"); Section::is_auto(e)) return false;
  s.boolean("enabled", on);
  return on;
}

void parse_zero(Section& root, Config& c) {
  auto v = root.get("zero_optimization");
  if (!v) return;
  Section s(*v, "zero_optimization");
  auto& z = c.zero;
  s.integer("stage", z.stage, 0, 3);
  s.boolean("overlap_comm", z.overlap_comm);
  s.boolean("contiguous_gradients", z.contiguous_gradients);
  s.boolean("reduce_scatter", z.reduce_scatter);
  s.integer("reduce_bucket_size", z.reduce_bucket_size, 1, INT64_MAX, true);
  s.integer("allgather_bucket_size", z.allgather_bucket_size, 1, INT64_MAX, true);
  s.accept("allgather_partitions");
  s.integer("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0, INT64_MAX, true);
  s.integer("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, 0,
            INT64_MAX, true);
  s.integer("stage3_max_live_parameters", z.stage3_max_live_parameters, 0, INT64_MAX, true);
  s.integer("stage3_max_reuse_distance", z.stage3_max_reuse_distance, 0, INT64_MAX, true);
  s.boolean("stage3_gather_16bit_weights_on_model_save",
            z.stage3_gather_16bit_weights_on_model_save);
  s.accept("stage3_gather_fp16_weights_on_model_save");
  s.integer("sub_group_size", z.sub_group_size, 1, INT64_MAX, true);
  s.accept("round_robin_gradients");
  s.accept("load_from_fp32_weights");
  s.accept("elastic_checkpoint");
  s.accept("ignore_unused_parameters");
  s.accept("legacy_stage1");
  parse_offload(s, "offload_optimizer", z.offload_optimizer, false);
  parse_offload(s, "offload_param", z.offload_param, true);
  s.finish();
  if (z.offload_param.enabled() && z.stage != 3)
    s.fail("offload_param", "needs stage 3 (parameters are partitioned only there); stage is " +
                                std::to_string(z.stage));
  if (z.offload_optimizer.enabled() && z.stage == 0)
    s.fail("offload_optimizer", "needs stage 1, 2 or 3 (DeepSpeed's ZeRO-Offload); stage is 0");
}

void set_batch(Config& c, std::optional<int64_t> tbs, std::optional<int64_t> micro,
               std::optional<int64_t> gas) {
  const int64_t ws = c.world_size;
  auto mismatch = [&](const std::string& what) { throw ConfigError("train_batch_size: " + what); };
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

Config parse_config(const json& config, int world_size) {
  if (world_size < 1)
    throw ConfigError("world size must be >= 1, got " + std::to_string(world_size));
  Config c;
  c.world_size = world_size;
  c.raw = config;
  Section root(config, "");
  std::optional<int64_t> tbs, micro, gas;
  int64_t v = 0;
  if (root.integer("train_batch_size", v, 1, INT64_MAX, true)) tbs = v;
  if (root.integer("train_micro_batch_size_per_gpu", v, 1, INT64_MAX, true)) micro = v;
  if (root.integer("gradient_accumulation_steps", v, 1, INT64_MAX, true)) gas = v;
  parse_optimizer(root, c);
  parse_scheduler(root, c);
  if (auto f = root.get("fp16")) {
    Section s(*f, "fp16");
    c.fp16.enabled = enabled_flag(s);
    s.number("loss_scale", c.fp16.loss_scale, 0);
    s.integer("initial_scale_power", c.fp16.initial_scale_power, 0, 64);
    s.integer("loss_scale_window", c.fp16.loss_scale_window, 1);
    s.integer("hysteresis", c.fp16.hysteresis, 1, 1 << 20);
    s.boolean("consecutive_hysteresis", c.fp16.consecutive_hysteresis);
    s.number("min_loss_scale", c.fp16.min_loss_scale, 0);
    s.accept("auto_cast");
    s.accept("fp16_master_weights_and_grads");
    s.finish();
  }
  for (const char* name : {"bf16", "bfloat16"}) {
    if (auto b = root.get(name)) {
      Section s(*b, name);
      c.bf16 = c.bf16 || enabled_flag(s);
      s.accept("immediate_grad_update");
      s.finish();
    }
  }
  if (c.fp16.enabled && c.bf16) throw ConfigError("fp16, bf16: both enabled; choose one");
  if (auto g = root.get("gradient_clipping"); g && !Section::is_auto(g))
    root.number("gradient_clipping", c.gradient_clipping, 0);
  parse_zero(root, c);
  root.integer("steps_per_print", c.steps_per_print, 1);
  root.boolean("wall_clock_breakdown", c.wall_clock_breakdown);
  root.boolean("prescale_gradients", c.prescale_gradients);
  root.number("gradient_predivide_factor", c.gradient_predivide_factor, 1e-30);
  // Sections DeepSpeed reads that change nothing here; accepted so real configs load.
  for (const char* k : {"memory_breakdown", "dump_state", "communication_data_type",
                        "seq_parallel_communication_data_type", "zero_allow_untested_optimizer",
                        "zero_force_ds_cpu_optimizer", "tensorboard", "wandb", "csv_monitor",
                        "comms_logger", "flops_profiler", "disable_allgather", "sparse_gradients"})
    root.accept(k);
  root.finish();
  set_batch(c, tbs, micro, gas);
  return c;
}

Config parse_config_text(const std::string& text_or_path, int world_size) {
  std::string text = text_or_path;
  auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{') {
    std::ifstream in(text_or_path);
    if (!in)
      throw ConfigError(
          text_or_path +
          ": cannot read the config file (give a path to a JSON file or the JSON text)");
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError((first == std::string::npos || text_or_path[first] != '{'
                           ? text_or_path
                           : std::string("config")) +
                      ": not valid JSON: " + e.what());
  }
  return parse_config(j, world_size);
}

MemoryEstimate estimate_memory(const Config& c, int64_t n) {
  const bool mixed = c.fp16.enabled || c.bf16;
  const int64_t N = c.world_size;
  const int stage = c.zero.stage;
  auto part = [&](int64_t bytes) { return (bytes + N - 1) / N; };
  MemoryEstimate m;
  int64_t pbytes = (mixed ? 2 : 4) * n, gbytes = (mixed ? 2 : 4) * n;
  int64_t obytes = (mixed ? 12 : 8) * n;  // fp32 master (mixed only) + exp_avg + exp_avg_sq
  m.params = stage >= 3 ? part(pbytes) : pbytes;
  m.grads = stage >= 2 ? part(gbytes) : gbytes;
  m.optimizer = stage >= 1 ? part(obytes) : obytes;
  if (c.zero.offload_optimizer.enabled()) m.offloaded += m.optimizer, m.optimizer = 0;
  if (c.zero.offload_param.enabled()) m.offloaded += m.params, m.params = 0;
  return m;
}

std::string describe(const Config& c, std::optional<int64_t> params) {
  std::ostringstream s;
  s << "config OK for world size " << c.world_size << "\n"
    << "  train_batch_size               " << c.train_batch_size << "\n"
    << "  train_micro_batch_size_per_gpu " << c.train_micro_batch_size_per_gpu << "\n"
    << "  gradient_accumulation_steps    " << c.gradient_accumulation_steps << "\n"
    << "  zero stage                     " << c.zero.stage
    << (c.zero.offload_optimizer.enabled() ? " (optimizer offloaded to cpu)" : "")
    << (c.zero.offload_param.enabled() ? " (parameters offloaded to cpu)" : "") << "\n"
    << "  precision                      "
    << (c.fp16.enabled ? "fp16"
        : c.bf16       ? "bf16"
                       : "fp32")
    << "\n"
    << "  optimizer                      "
    << (c.optimizer.given ? c.optimizer.type : "(the caller's)") << "\n";
  if (!c.scheduler.type.empty())
    s << "  scheduler                      " << c.scheduler.type << "\n";
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
