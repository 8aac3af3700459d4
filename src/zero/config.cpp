// DeepSpeed's config: strict parsing (unknown keys, types, ranges) and batch-size rules.
// One piece (~800 lines): DeepSpeed's schema is one tree whose sections resolve against each
// other (batch sizes, "auto", the optimizer's lr as the scheduler's default); the key tables
// and their checks stay together so one file says what dtrain accepts.
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
//
// `validated`: a section DeepSpeed reads through pydantic (zero_optimization, offload_*, fp16,
// bf16): there DeepSpeed forbids unknown keys too, and drops "auto" values so the default
// applies; the reader does the same. Elsewhere DeepSpeed reads with .get() (an unknown key is
// ignored there, refused here) and "auto" is only the Hugging Face convention.
class Section {
 public:
  Section(const json& j, std::string path, std::vector<std::string>* notes = nullptr,
          bool validated = false)
      : j_(j), path_(std::move(path)), notes_(notes), validated_(validated) {
    if (!j_.is_object()) fail("", "must be an object, got " + std::string(j_.type_name()));
  }
  std::vector<std::string>* notes() const { return notes_; }
  void note(const std::string& key, const std::string& what) const {
    if (notes_) notes_->push_back(where(key) + ": " + what);
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
    if (validated_ && is_auto(&*it)) {
      if (std::find(auto_noted_.begin(), auto_noted_.end(), key) == auto_noted_.end()) {
        auto_noted_.push_back(key);
        const bool own = key == "stage3_prefetch_bucket_size" || key == "stage3_max_reuse_distance";
        note(key, own ? "\"auto\": dtrain's default (DeepSpeed drops \"auto\" in this section "
                        "and uses its own; the two differ for this key: docs/zero.md)"
                      : "\"auto\": DeepSpeed's default (DeepSpeed drops \"auto\" in this section)");
      }
      return nullptr;
    }
    return &*it;
  }
  bool has(const std::string& key) const { return j_.contains(key); }
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
  // Keys DeepSpeed reads here that change nothing in dtrain: accepted with a note when set.
  void ignore(const std::string& key, const std::string& why) {
    if (get(key)) note(key, why);
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
      std::string near = closest_key(it.key(), known_);
      fail(it.key(),
           std::string(validated_ ? "unknown key (DeepSpeed 0.19.8 refuses it too)"
                                  : "unknown key (DeepSpeed 0.19.8 would silently ignore it; "
                                    "dtrain refuses it so that a typo cannot go unnoticed: remove "
                                    "it or correct it)") +
               (near.empty() ? std::string() : "; did you mean " + near + "?"));
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
  std::vector<std::string>* notes_;
  bool validated_;
  std::vector<std::string> known_, auto_noted_;
};

void parse_offload(Section& parent, const std::string& key, OffloadConfig& out, bool param) {
  if (auto v = parent.get(key)) {
    Section s(*v, parent.where(key), parent.notes(), true);
    s.string("device", out.device, {"none", "cpu", "nvme"});
    if (out.device == "nvme")
      s.fail("device",
             "\"nvme\" offload (DeepSpeed's ZeRO-Infinity, swapping to NVMe through libaio) is not "
             "supported by dtrain; use \"cpu\"");
    s.boolean("pin_memory", out.pin_memory);
    for (const char* k : {"nvme_path", "buffer_count", "buffer_size", "max_in_cpu"}) s.accept(k);
    if (!param) {
      for (const char* k : {"pipeline_read", "pipeline_write", "fast_init"}) s.accept(k);
      double ratio = 1.0;
      s.number("ratio", ratio, 0, 1);
      if (ratio < 1.0)
        s.fail("ratio",
               "partial optimizer offload (ratio < 1) is not supported by dtrain; use 1.0");
      s.ignore("super_offload", "DeepSpeed's SuperOffload for superchips; dtrain offloads plainly");
      s.ignore("cpuadam_cores_perc",
               "the share of cores DeepSpeed's CPU Adam uses; dtrain's "
               "CPU Adam uses libtorch's intra-op threads");
    }
    s.finish();
  }
}

// The optimizer types DeepSpeed 0.19.8 has that dtrain does not run, and what to use.
const std::map<std::string, std::string>& other_optimizers() {
  static const std::map<std::string, std::string> m = {
      {"onebitadam",
       "1-bit Adam compresses its communication; use Adam (the same update, "
       "uncompressed)"},
      {"zerooneadam", "0/1 Adam compresses its communication; use Adam"},
      {"onebitlamb", "1-bit LAMB compresses its communication; use Lamb"},
      {"adagrad",
       "use Adam, AdamW, SGD or Lamb, or pass a torch::optim::Adagrad as "
       "InitOptions::optimizer"},
      {"lion",
       "use Adam, AdamW, SGD or Lamb, or pass your own torch::optim optimizer as "
       "InitOptions::optimizer"},
      {"muadam", "muP's optimizers need the mup package; use Adam"},
      {"muadamw", "muP's optimizers need the mup package; use AdamW"},
      {"musgd", "muP's optimizers need the mup package; use SGD"},
      {"muon", "use Adam, AdamW, SGD or Lamb"}};
  return m;
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// An optimizer param given as "auto": the optimizer's default, with a note.
bool auto_default(Section& ps, const std::string& key, const std::string& value) {
  if (!Section::is_auto(ps.get(key))) return false;
  ps.note(key, "\"auto\": " + value +
                   " (the optimizer's default; Hugging Face's integration "
                   "would fill in its training argument)");
  return true;
}

void parse_optimizer(Section& root, Config& c) {
  auto v = root.get("optimizer");
  if (!v) return;
  Section s(*v, "optimizer", root.notes());
  auto& o = c.optimizer;
  o.given = true;
  if (!s.get("type")) s.fail("type", "missing (one of Adam, AdamW, SGD, Lamb)");
  if (auto t = s.get("type"); t->is_string()) {
    auto it = other_optimizers().find(lower(t->get<std::string>()));
    if (it != other_optimizers().end())
      s.fail("type", "DeepSpeed's " + t->get<std::string>() +
                         " optimizer is not implemented by dtrain: " + it->second);
  }
  s.string("type", o.type, {"Adam", "AdamW", "SGD", "Lamb"});
  if (auto p = s.get("params")) {
    Section ps(*p, "optimizer.params", root.notes());
    if (ps.has("max_grad_norm"))
      ps.fail("max_grad_norm",
              "not an optimizer parameter (DeepSpeed refuses it too); use the top-level "
              "\"gradient_clipping\"");
    if (!auto_default(ps, "lr", "1e-3")) ps.number("lr", o.lr, 0);
    if (!auto_default(ps, "eps", "1e-8")) ps.number("eps", o.eps, 0);
    if (!auto_default(ps, "weight_decay", "0")) ps.number("weight_decay", o.weight_decay, 0);
    if (o.type != "SGD") {
      if (!auto_default(ps, "betas", "[0.9, 0.999]")) {
        if (auto b = ps.get("betas")) {
          if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number())
            ps.fail("betas", "expected [beta1, beta2], got " + b->dump());
          o.beta1 = (*b)[0].get<double>();
          o.beta2 = (*b)[1].get<double>();
          if (o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1)
            ps.fail("betas", "each beta must be in [0, 1), got " + b->dump());
        }
      }
      ps.boolean("bias_correction", o.bias_correction);
      if (o.type == "Adam" || o.type == "AdamW") {
        // DeepSpeed: "AdamW" is decoupled whatever adam_w_mode says; "Adam" too unless false.
        ps.boolean("adam_w_mode", o.adam_w_mode);
        if (o.type == "AdamW") o.adam_w_mode = true;
        if (auto a = ps.get("amsgrad"); a && a->is_boolean() && a->get<bool>())
          ps.fail("amsgrad", "not supported by dtrain (nor by DeepSpeed's FusedAdam); remove it");
        for (const char* k : {"torch_adam", "fused", "foreach", "fp32_optimizer_states"})
          ps.accept(k);  // which implementation runs the same formula
      }
      if (o.type == "Lamb") {
        ps.number("max_coeff", o.max_coeff, 0);
        ps.number("min_coeff", o.min_coeff, 0);
        ps.accept("max_grad_norm_lamb");
      }
    } else {
      ps.number("momentum", o.momentum, 0, 1);
      ps.number("dampening", o.dampening, 0, 1);
      ps.boolean("nesterov", o.nesterov);
      ps.accept("maximize");
      if (auto m = ps.get("maximize"); m && m->is_boolean() && m->get<bool>())
        ps.fail("maximize", "not supported by dtrain; negate the loss instead");
    }
    ps.finish();
  }
  s.ignore("legacy_fusion", "DeepSpeed's legacy fused fp16 optimizer path; no effect in dtrain");
  s.finish();
}

// A scheduler param that Hugging Face fills in from its training arguments: "auto" cannot be
// resolved standalone.
void no_auto(Section& ps, const std::string& key, const std::string& what) {
  if (Section::is_auto(ps.get(key)))
    ps.fail(key,
            "\"auto\" is filled in by Hugging Face's Trainer / accelerate from the training "
            "arguments, which dtrain does not have; give " +
                what);
}

void parse_scheduler(Section& root, Config& c) {
  auto v = root.get("scheduler");
  if (!v) return;
  Section s(*v, "scheduler", root.notes());
  auto& sc = c.scheduler;
  if (!s.get("type"))
    s.fail("type",
           "missing (one of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)");
  s.string("type", sc.type,
           {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"});
  const auto& t = sc.type;
  if (auto p = s.get("params")) {
    Section ps(*p, "scheduler.params", root.notes());
    if (auto l = ps.get("last_batch_iteration"); l && !(l->is_number_integer() && *l == -1))
      ps.fail("last_batch_iteration",
              "only -1 (start from the beginning) is supported; a resumed run takes the "
              "scheduler's position from its checkpoint");
    if (t == "WarmupLR" || t == "WarmupDecayLR") {
      if (Section::is_auto(ps.get("warmup_min_lr"))) {
        ps.note("warmup_min_lr", "\"auto\": 0 (DeepSpeed's default)");
      } else {
        ps.number("warmup_min_lr", sc.warmup_min_lr, 0);
      }
      // "auto": the optimizer's lr, as Hugging Face's integration fills it in.
      if (auto m = ps.get("warmup_max_lr"); Section::is_auto(m)) {
        sc.warmup_max_lr = c.optimizer.lr;
        ps.note("warmup_max_lr", "\"auto\": the optimizer's lr");
      } else if (m) {
        double val = 0;
        ps.number("warmup_max_lr", val, 0);
        sc.warmup_max_lr = val;
      }
      no_auto(ps, "warmup_num_steps", "the number of warm-up steps");
      ps.integer("warmup_num_steps", sc.warmup_num_steps, 1);
      ps.string("warmup_type", sc.warmup_type, {"log", "linear"});
      if (t == "WarmupDecayLR") {
        no_auto(ps, "total_num_steps", "the number of optimizer steps of the whole run");
        ps.integer("total_num_steps", sc.total_num_steps, 1);
      }
    } else if (t == "WarmupCosineLR") {
      no_auto(ps, "total_num_steps", "the number of optimizer steps of the whole run");
      ps.integer("total_num_steps", sc.total_num_steps, 1);
      ps.number("warmup_min_ratio", sc.warmup_min_ratio, 0, 1);
      no_auto(ps, "warmup_num_steps", "the number of warm-up steps");
      ps.integer("warmup_num_steps", sc.warmup_num_steps, 1);
      ps.number("cos_min_ratio", sc.cos_min_ratio, 0, 1);
      ps.string("warmup_type", sc.warmup_type, {"log", "linear"});
    } else if (t == "OneCycle") {
      ps.number("cycle_min_lr", sc.cycle_min_lr, 0);
      ps.number("cycle_max_lr", sc.cycle_max_lr, 0);
      ps.number("decay_lr_rate", sc.decay_lr_rate, 0);
      ps.integer("cycle_first_step_size", sc.cycle_first_step_size, 1);
      ps.integer("cycle_second_step_size", sc.cycle_second_step_size, 0);
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
  if ((t == "WarmupDecayLR" || t == "WarmupCosineLR") && sc.total_num_steps <= 0)
    s.fail("params.total_num_steps", "required by " + t + " (a positive integer)");
  if (t == "OneCycle" && (!v->contains("params") || !(*v)["params"].contains("cycle_min_lr") ||
                          !(*v)["params"].contains("cycle_max_lr")))
    s.fail("params", "OneCycle needs cycle_min_lr and cycle_max_lr (DeepSpeed has no default)");
  s.finish();
}

// zero_optimization's renamed and deprecated keys DeepSpeed 0.19.8 still takes: (alias, name).
const std::vector<std::pair<std::string, std::string>>& zero_aliases() {
  static const std::vector<std::pair<std::string, std::string>> a = {
      {"prefetch_bucket_size", "stage3_prefetch_bucket_size"},
      {"param_persistence_threshold", "stage3_param_persistence_threshold"},
      {"max_live_parameters", "stage3_max_live_parameters"},
      {"max_reuse_distance", "stage3_max_reuse_distance"},
      {"gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"},
      {"stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"}};
  return a;
}

void parse_zero(Section& root, Config& c) {
  auto v = root.get("zero_optimization");
  if (!v) return;
  auto& z = c.zero;
  if (v->is_boolean()) {
    // DeepSpeed's oldest format: true is stage 1 (allgather_size the bucket).
    z.stage = v->get<bool>() ? 1 : 0;
    if (auto a = root.get("allgather_size"); a && a->is_number())
      z.allgather_bucket_size = a->get<int64_t>();
    root.note("zero_optimization", "deprecated boolean form: stage " + std::to_string(z.stage));
    return;
  }
  Section s(*v, "zero_optimization", root.notes(), true);
  for (const char* k : {"mics_shard_size", "mics_hierarchical_params_gather"})
    if (s.has(k))
      s.fail(k,
             "MiCS ZeRO-3 sharding was removed from DeepSpeed (0.19.8 refuses it too); remove "
             "the key");
  if (s.has("zeropp_loco_param"))
    s.fail("zeropp_loco_param",
           "LoCo-Zero++ was removed from DeepSpeed (0.19.8 refuses it too); remove the key");
  // An alias and its name in one config: DeepSpeed's pydantic refuses that as well.
  json zj = *v;
  for (const auto& [alias, name] : zero_aliases()) {
    if (!zj.contains(alias)) continue;
    if (zj.contains(name))
      s.fail(alias, "given together with " + name + ", its other name; keep one of them");
    zj[name] = zj[alias];
    zj.erase(alias);
    if (alias.rfind("stage3_gather_fp16", 0) == 0) s.note(alias, "deprecated name of " + name);
  }
  Section zs(zj, "zero_optimization", root.notes(), true);
  for (const auto& [alias, name] : zero_aliases()) zs.accept(alias);
  zs.integer("stage", z.stage, 0, 3);
  // DeepSpeed's default is (stage == 3); dtrain's stays false (the same result; stage 3's
  // per-layer fetch already overlaps, and a bucket in flight holds its own buffer).
  zs.boolean("overlap_comm", z.overlap_comm);
  zs.boolean("contiguous_gradients", z.contiguous_gradients);
  zs.boolean("reduce_scatter", z.reduce_scatter);
  zs.integer("reduce_bucket_size", z.reduce_bucket_size, 1);
  zs.integer("allgather_bucket_size", z.allgather_bucket_size, 0);
  zs.accept("allgather_partitions");
  zs.integer("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0);
  zs.integer("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, 0);
  zs.integer("stage3_max_live_parameters", z.stage3_max_live_parameters, 0);
  zs.integer("stage3_max_reuse_distance", z.stage3_max_reuse_distance, 0);
  zs.boolean("stage3_gather_16bit_weights_on_model_save",
             z.stage3_gather_16bit_weights_on_model_save);
  zs.integer("sub_group_size", z.sub_group_size, 0);
  for (const char* k : {"round_robin_gradients",
                        "load_from_fp32_weights",
                        "ignore_unused_parameters",
                        "legacy_stage1",
                        "use_multi_rank_bucket_allreduce",
                        "compute_grad_norm",
                        "stage3_model_persistence_threshold",
                        "model_persistence_threshold",
                        "stage3_module_granularity_threshold",
                        "module_granularity_threshold",
                        "stage3_use_all_reduce_for_fetch_params",
                        "use_all_reduce_for_fetch_params",
                        "stage3_allgather_sequential",
                        "allgather_sequential",
                        "parameter_alignment",
                        "memory_efficient_linear",
                        "pipeline_loading_checkpoint",
                        "override_module_apply",
                        "log_trace_cache_warnings",
                        "enable_sanity_checks",
                        "save_muon_momentum_buffer_in_memory",
                        "leaf_module"})
    zs.accept(k);  // tuning of DeepSpeed's own implementation: no effect on the result
  zs.ignore("elastic_checkpoint",
            "deprecated in DeepSpeed; dtrain's checkpoints load at any world size anyway");
  for (const char* k : {"zero_quantized_weights", "zero_quantized_nontrainable_weights",
                        "zero_quantized_gradients"})
    if (auto q = zs.get(k); q && q->is_boolean() && q->get<bool>())
      zs.note(k,
              "ZeRO++ quantized communication; dtrain communicates unquantized (same "
              "result, more bytes)");
  if (auto h = zs.get("zero_hpz_partition_size"); h && h->is_number() && h->get<double>() > 1)
    zs.note("zero_hpz_partition_size",
            "ZeRO++ hierarchical partitioning; dtrain partitions over the whole group");
  zs.ignore("zenflow", "DeepSpeed's ZenFlow (stall-free offloading); dtrain offloads plainly");
  // Deprecated booleans, with DeepSpeed's meaning.
  bool cpu_offload = false, cpu_offload_param = false, pin = false;
  zs.boolean("cpu_offload", cpu_offload);
  zs.boolean("cpu_offload_param", cpu_offload_param);
  bool pin_given = zs.has("cpu_offload_use_pin_memory");
  zs.boolean("cpu_offload_use_pin_memory", pin);
  parse_offload(zs, "offload_optimizer", z.offload_optimizer, false);
  parse_offload(zs, "offload_param", z.offload_param, true);
  // A deprecated boolean: DeepSpeed maps it to its section with device cpu.
  auto alias = [&](bool on, const std::string& flag, const std::string& section,
                   OffloadConfig& out) {
    if (!on) return;
    if (zs.has(section))
      zs.fail(flag, "given together with " + section + ", which replaces it; keep " + section);
    out.device = "cpu";
    out.pin_memory = pin;
    zs.note(flag, "deprecated: " + section + " {\"device\": \"cpu\"}");
  };
  alias(cpu_offload, "cpu_offload", "offload_optimizer", z.offload_optimizer);
  alias(cpu_offload_param, "cpu_offload_param", "offload_param", z.offload_param);
  if (pin_given && !cpu_offload && !cpu_offload_param)
    zs.note("cpu_offload_use_pin_memory", "deprecated; no effect without cpu_offload");
  zs.finish();
  if (z.offload_param.enabled() && z.stage != 3)
    zs.fail("offload_param", "needs stage 3 (parameters are partitioned only there); stage is " +
                                 std::to_string(z.stage));
  if (z.offload_optimizer.enabled() && z.stage == 0)
    zs.fail("offload_optimizer", "needs stage 1, 2 or 3 (DeepSpeed's ZeRO-Offload); stage is 0");
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
  Section root(config, "", &c.notes);
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
  if (auto f = root.get("fp16")) {
    Section s(*f, "fp16", &c.notes, true);
    s.boolean("enabled", c.fp16.enabled);
    s.number("loss_scale", c.fp16.loss_scale, 0);
    s.integer("initial_scale_power", c.fp16.initial_scale_power, 0, 64);
    s.integer("loss_scale_window", c.fp16.loss_scale_window, 1);
    s.integer("hysteresis", c.fp16.hysteresis, 1, 1 << 20);
    s.boolean("consecutive_hysteresis", c.fp16.consecutive_hysteresis);
    s.number("min_loss_scale", c.fp16.min_loss_scale, 0);
    s.ignore("auto_cast",
             "DeepSpeed casts the module's inputs to fp16; dtrain does not (cast "
             "your inputs)");
    s.ignore("fp16_master_weights_and_grads",
             "DeepSpeed keeps fp16 master weights; dtrain keeps fp32 masters");
    s.finish();
  }
  for (const char* name : {"bf16", "bfloat16"}) {
    if (auto b = root.get(name)) {
      Section s(*b, name, &c.notes, true);
      bool on = false;
      s.boolean("enabled", on);
      c.bf16 = c.bf16 || on;
      for (const char* k : {"immediate_grad_update", "check_grad_overflow"}) s.accept(k);
      s.ignore("bf16_master_weights_and_grads",
               "DeepSpeed keeps bf16 master weights; dtrain keeps fp32 masters");
      s.ignore("bf16_optimizer_states",
               "DeepSpeed keeps the optimizer state in bf16; dtrain keeps it in fp32");
      s.finish();
    }
  }
  if (c.fp16.enabled && c.bf16) throw ConfigError("fp16, bf16: both enabled; choose one");
  if (Section::is_auto(root.get("gradient_clipping")))
    root.note("gradient_clipping",
              "\"auto\": 1.0 (DeepSpeed's default; Hugging Face's Trainer would fill in its "
              "max_grad_norm, 1.0 unless set)");
  else
    root.number("gradient_clipping", c.gradient_clipping, 0);
  parse_zero(root, c);
  root.integer("steps_per_print", c.steps_per_print, 1);
  root.boolean("wall_clock_breakdown", c.wall_clock_breakdown);
  root.boolean("prescale_gradients", c.prescale_gradients);
  root.number("gradient_predivide_factor", c.gradient_predivide_factor, 1e-30);
  // DeepSpeed reads these; they change nothing in what dtrain computes.
  for (const char* k :
       {"memory_breakdown", "dump_state", "disable_allgather", "disable_python_gc",
        "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "dataloader_drop_last",
        "log_level", "timers", "managed_gradient_accumulation", "gradient_allreduce_op",
        "use_data_before_expert_parallelism", "vocabulary_size"})
    root.accept(k);
  // Sections DeepSpeed acts on and dtrain does not: accepted with what dtrain does instead.
  static const std::vector<std::pair<std::string, std::string>> ignored = {
      {"activation_checkpointing",
       "DeepSpeed's activation checkpointing (deepspeed.checkpointing); dtrain keeps every "
       "activation (checkpoint inside your module to trade compute for memory)"},
      {"communication_data_type",
       "dtrain reduces gradients in the master dtype (fp32) whatever this says"},
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
       "atomically in DeepSpeed's layout"},
      {"data_types",
       "DeepSpeed's gradient accumulation dtype; dtrain accumulates in the "
       "parameters' dtype"},
      {"data_efficiency", "DeepSpeed's data sampling/routing; give dtrain the data in order"},
      {"torch_autocast", "DeepSpeed's torch.autocast wrapper; use fp16 or bf16 instead"},
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
    // A key given twice in one object: DeepSpeed refuses it ("Duplicate keys in DeepSpeed
    // config"); nlohmann would keep the last one silently. `open` holds each open object's keys.
    struct Open {
      std::string name;  // the key path of this object
      std::vector<std::string> keys;
    };
    std::vector<Open> open;
    std::string last_key;
    json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::object_start) {
        std::string name = open.empty() ? "" : open.back().name;
        if (!open.empty()) name += (name.empty() ? "" : ".") + last_key;
        open.push_back({name, {}});
      } else if (event == json::parse_event_t::object_end) {
        if (!open.empty()) open.pop_back();
      } else if (event == json::parse_event_t::key && !open.empty()) {
        last_key = parsed.get<std::string>();
        auto& o = open.back();
        if (std::find(o.keys.begin(), o.keys.end(), last_key) != o.keys.end())
          throw ConfigError((o.name.empty() ? "" : o.name + ".") + last_key +
                            ": duplicate key (given twice in one object; DeepSpeed refuses "
                            "duplicate keys too): keep one of them");
        o.keys.push_back(last_key);
      }
      return true;
    };
    j = json::parse(text, check, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 5e400
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
  for (const auto& n : c.notes) s << "  note: " << n << "\n";
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
