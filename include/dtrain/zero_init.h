// Partitioned construction for ZeRO stage 3 (DeepSpeed's zero.Init): a model that no rank could
// hold whole is built so that each rank keeps only its 1/N of the trainable parameters, with
// the values a whole construction under the same seed gives, bit for bit.
//
//   auto model = dtrain::zero::build_partitioned(/*seed=*/0, [](dtrain::zero::Init& init) {
//     torch::nn::Sequential m;
//     for (int i = 0; i < 48; ++i) m->push_back(init(torch::nn::Linear(4096, 4096)));
//     return m;
//   });
//   auto engine = dtrain::zero::initialize(model, "ds_config.json");   // stage 3
//
// How: `build` runs twice, each time after torch::manual_seed(seed). Every init(submodule) call
// frees the submodule's trainable parameters as soon as it is constructed (they become empty
// tensors of the same dtype), so at most one submodule is whole at a time, as in DeepSpeed,
// whose zero.Init partitions each module when its constructor returns. The first run only
// learns the shapes and the module's registration order (what the engine's flat layout
// follows); the second keeps, of each parameter, the elements that fall into this rank's
// partition of that layout. Wrap submodules that are small next to the model (a layer, a
// block): a trainable parameter no init() call freed is partitioned when `build` returns,
// after having been whole alongside the others.
//
// REQUIRES: `build` constructs the same modules in the same order on every call and every rank
// (its only randomness the global generator, which build_partitioned seeds); trainable
// parameters of one dtype on the CPU. Frozen parameters (requires_grad false) and buffers
// stay whole. The engine needs zero_optimization.stage 3 and the same group.
// Throws UsageError when the two runs of `build` differ (naming the parameter).
// Not thread-safe (the global generator): build one model at a time per process.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtrain/process_group.h"
#include "dtrain/zero.h"

namespace dtrain::zero {

// What a partitioned construction leaves on this rank (InitOptions::partitioned).
struct PartitionedShards {
  int rank = 0, world = 1;
  // The trainable parameters' shapes, in the module's registration order (the flat layout).
  std::vector<std::vector<int64_t>> shapes;
  // This rank's partition [rank * P, (rank + 1) * P) of the flat buffer of every trainable
  // parameter, padded to a multiple of `world` (P = padded / world); the parameters' dtype.
  torch::Tensor partition;
};

template <typename ModuleType>
struct Partitioned {
  ModuleType module;  // its trainable parameters are empty tensors: the shards hold them
  std::shared_ptr<const PartitionedShards> shards;
};

class Init {
 public:
  // Partitions the trainable parameters of `module` (and its submodules) that no earlier call
  // partitioned; returns the module. Accepts a module holder or a shared_ptr to a module.
  template <typename Holder>
  Holder operator()(Holder module) {
    partition(dtrain::detail::module_ref(module));
    return module;
  }
  void partition(torch::nn::Module& module);

  // The first run's findings, used by the second (build_partitioned's business).
  struct Plan {
    std::vector<int64_t> offset, numel;        // per parameter in construction order
    std::vector<std::vector<int64_t>> shapes;  // per parameter in registration order
    int64_t part = 0;
  };
  Init(int rank, int world, const Plan* plan);
  // After `build` returned: partitions the stragglers; on the first run returns the plan, on
  // the second checks the order and hands over the shards.
  Plan plan(torch::nn::Module& root);
  std::shared_ptr<PartitionedShards> finish(torch::nn::Module& root);

 private:
  int rank_, world_;
  const Plan* plan_;                              // null on the first run
  std::unordered_map<const void*, size_t> seen_;  // parameter -> construction index
  std::vector<std::vector<int64_t>> shapes_;      // per construction index
  torch::Tensor partition_;
};

// Builds `build(init)`'s module partitioned over `group` (default: the default group).
// Not collective: each rank computes its own shards.
template <typename Build>
auto build_partitioned(uint64_t seed, Build&& build, std::shared_ptr<ProcessGroup> group = nullptr)
    -> Partitioned<std::decay_t<decltype(build(std::declval<Init&>()))>> {
  if (!group) group = default_group();
  const int rank = group->rank(), world = group->world_size();
  Init::Plan plan;
  {
    torch::manual_seed(seed);
    Init first(rank, world, nullptr);
    auto probe = build(first);
    plan = first.plan(dtrain::detail::module_ref(probe));
  }
  torch::manual_seed(seed);
  Init second(rank, world, &plan);
  auto module = build(second);
  auto shards = second.finish(dtrain::detail::module_ref(module));
  return {std::move(module), std::move(shards)};
}

// The engine over a partitioned model (zero_optimization.stage must be 3).
template <typename ModuleType>
Engine<ModuleType> initialize(Partitioned<ModuleType> model, const nlohmann::json& config,
                              InitOptions options = {}) {
  options.partitioned = std::move(model.shards);
  return initialize(std::move(model.module), config, std::move(options));
}
template <typename ModuleType>
Engine<ModuleType> initialize(Partitioned<ModuleType> model, const std::string& config,
                              InitOptions options = {}) {
  options.partitioned = std::move(model.shards);
  return initialize(std::move(model.module), config, std::move(options));
}
template <typename ModuleType>
Engine<ModuleType> initialize(Partitioned<ModuleType> model, const char* config,
                              InitOptions options = {}) {
  return initialize(std::move(model), std::string(config), std::move(options));
}

}  // namespace dtrain::zero
