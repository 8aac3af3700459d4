// A DeepSpeed config's zero_optimization section, its offload sections and its renamed keys
// (config_sections.h).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "zero/config_sections.h"

namespace dtrain::zero::config_parse {
namespace {

void parse_offload(Section& parent, const std::string& key, OffloadConfig& out, bool param) {
  if (auto v = parent.get(key)) {
    Section s(*v, parent.where(key), parent.notes(), true);
    s.string("device", out.device, {"none", "cpu", "nvme"});
    if (out.device == "nvme")
      s.fail("device",
             "\"nvme\" offload (DeepSpeed's ZeRO-Infinity, swapping to NVMe through libaio) is not "
             "supported by dtrain; use \"cpu\"");
    s.boolean("pin_memory", out.pin_memory);
    if (auto p = s.get("nvme_path"); p && !p->is_string())
      s.fail("nvme_path", "expected a path (a string), got " + p->dump());
    for (const char* k : {"buffer_count", "buffer_size", "max_in_cpu"}) s.accept_int(k, 0);
    if (!param) {
      for (const char* k : {"pipeline_read", "pipeline_write", "fast_init"}) s.accept_bool(k);
      double ratio = 1.0;
      s.number("ratio", ratio, 0, 1);
      if (ratio < 1.0)
        s.fail("ratio",
               "partial optimizer offload (ratio < 1) is not supported by dtrain; use 1.0");
      bool super_offload = false;
      s.boolean("super_offload", super_offload);
      if (super_offload)
        s.note("super_offload", "DeepSpeed's SuperOffload for superchips; dtrain offloads plainly");
      double cores = 0.8;
      s.number("cpuadam_cores_perc", cores, 0, 1);
      if (s.has("cpuadam_cores_perc"))
        s.note("cpuadam_cores_perc",
               "the share of cores DeepSpeed's CPU Adam uses; dtrain's "
               "CPU Adam uses libtorch's intra-op threads");
    }
    s.finish();
  }
}

// zero_optimization's renamed and deprecated keys DeepSpeed 0.19.8 still takes: (alias, name).
const std::vector<std::pair<std::string, std::string>>& zero_aliases() {
  static const std::vector<std::pair<std::string, std::string>> a = {
      {"prefetch_bucket_size", "stage3_prefetch_bucket_size"},
      {"param_persistence_threshold", "stage3_param_persistence_threshold"},
      {"max_live_parameters", "stage3_max_live_parameters"},
      {"max_reuse_distance", "stage3_max_reuse_distance"},
      {"gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"},
      {"stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"},
      {"model_persistence_threshold", "stage3_model_persistence_threshold"},
      {"module_granularity_threshold", "stage3_module_granularity_threshold"},
      {"use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params"},
      {"allgather_sequential", "stage3_allgather_sequential"}};
  return a;
}

}  // namespace

void parse_zero(Section& root, Config& c, std::vector<std::string>& unused) {
  auto v = root.get("zero_optimization");
  if (!v) {
    if (root.has("zero_optimization"))
      root.fail("zero_optimization",
                "null (DeepSpeed 0.19.8 fails on it too): give an object or leave the key out");
    return;
  }
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
  zs.accept_bool("allgather_partitions");
  // dtrain's buffers are contiguous, it reduces to owners and gathers in place whatever these say.
  for (const char* k :
       {"contiguous_gradients", "reduce_scatter", "allgather_bucket_size", "allgather_partitions"})
    if (zs.get(k)) unused.push_back(zs.where(k));
  zs.integer("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0);
  zs.integer("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, 0);
  zs.integer("stage3_max_live_parameters", z.stage3_max_live_parameters, 0);
  zs.integer("stage3_max_reuse_distance", z.stage3_max_reuse_distance, 0);
  zs.boolean("stage3_gather_16bit_weights_on_model_save",
             z.stage3_gather_16bit_weights_on_model_save);
  zs.integer("sub_group_size", z.sub_group_size, 0);
  // Tuning of DeepSpeed's own implementation: no effect on the result (type-checked as
  // DeepSpeed does).
  for (const char* k :
       {"round_robin_gradients", "load_from_fp32_weights", "ignore_unused_parameters",
        "legacy_stage1", "use_multi_rank_bucket_allreduce",
        "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential",
        "parameter_alignment", "memory_efficient_linear", "pipeline_loading_checkpoint",
        "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
        "save_muon_momentum_buffer_in_memory"}) {
    zs.accept_bool(k);
    if (zs.has(k)) unused.push_back(zs.where(k));
  }
  zs.accept_int("stage3_model_persistence_threshold", 0);
  zs.accept_int("stage3_module_granularity_threshold");
  for (const char* k :
       {"stage3_model_persistence_threshold", "stage3_module_granularity_threshold", "leaf_module"})
    if (zs.has(k)) unused.push_back(zs.where(k));
  zs.accept("leaf_module");
  zs.boolean("compute_grad_norm", z.compute_grad_norm);
  if (!z.compute_grad_norm && z.stage != 1 && z.stage != 2)
    zs.fail("compute_grad_norm",
            "false is supported only at stage 1 or 2 (DeepSpeed 0.19.8 refuses it at stage " +
                std::to_string(z.stage) + " too); remove it");
  bool elastic = false;
  zs.boolean("elastic_checkpoint", elastic);
  if (elastic)
    zs.note("elastic_checkpoint",
            "deprecated in DeepSpeed; dtrain's checkpoints load at any world size anyway");
  for (const char* k : {"zero_quantized_weights", "zero_quantized_nontrainable_weights",
                        "zero_quantized_gradients"}) {
    bool q = false;
    zs.boolean(k, q);
    if (q)
      zs.note(k,
              "ZeRO++ quantized communication; dtrain communicates unquantized (same "
              "result, more bytes)");
  }
  int64_t hpz = 1;
  zs.integer("zero_hpz_partition_size", hpz, 0);
  if (hpz > 1)
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
    // Given at all (false too) beside its replacement: DeepSpeed refuses the pair.
    if (zs.get(flag) && zs.has(section))
      zs.fail(flag, "given together with " + section +
                        ", which replaces it (DeepSpeed 0.19.8 refuses the pair too); keep " +
                        section);
    if (!on) return;
    out.device = "cpu";  // pin_memory stays at its default, true, as in DeepSpeed
    zs.note(flag, "deprecated: " + section + " {\"device\": \"cpu\"}");
  };
  alias(cpu_offload, "cpu_offload", "offload_optimizer", z.offload_optimizer);
  alias(cpu_offload_param, "cpu_offload_param", "offload_param", z.offload_param);
  if (pin_given)
    zs.note("cpu_offload_use_pin_memory",
            "deprecated, and ignored: DeepSpeed 0.19.8 reads it into nothing (pin_memory of the "
            "offload sections, true by default, decides)");
  zs.finish();
  if (z.offload_param.enabled() && z.stage != 3)
    zs.note("offload_param", "has no effect at stage " + std::to_string(z.stage) +
                                 " (parameters are partitioned, and offloaded, only at stage "
                                 "3); DeepSpeed 0.19.8 accepts it and ignores it too");
  if (z.offload_optimizer.enabled() && z.stage == 0)
    zs.note("offload_optimizer",
            "at stage 0: DeepSpeed's CPU optimizer (DeepSpeedCPUAdam, DeepSpeedCPUAdagrad or "
            "DeepSpeedCPULion) steps the whole, unpartitioned model, its state in CPU memory, as "
            "DeepSpeed 0.19.8 does (which steps the module's own parameters, so only a model on "
            "the CPU; dtrain steps an fp32 copy in CPU memory, so a CUDA model too); stage 1, 2 "
            "or 3 partition the state over the ranks");
}

}  // namespace dtrain::zero::config_parse
