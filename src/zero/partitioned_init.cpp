// Partitioned construction (dtrain/zero_init.h): each init(submodule) call frees the
// submodule's trainable parameters as soon as it is built, keeping (on the second run) the
// elements that fall into this rank's partition of the engine's flat layout.
#include <algorithm>

#include "dtrain/error.h"
#include "dtrain/zero_init.h"
#include "zero/malloc_policy.h"
#include "zero/partitioning.h"

namespace dtrain::zero {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

const char* kDeterministic =
    "; build_partitioned runs the build function twice and needs the same modules, in the same "
    "order, both times (no randomness but the global generator it seeds)";

}  // namespace

Init::Init(int rank, int world, const Plan* plan) : rank_(rank), world_(world), plan_(plan) {
  detail::keep_large_buffers_unmapped();  // each freed submodule leaves the process
}

void Init::partition(torch::nn::Module& module) {
  torch::NoGradGuard ng;
  for (auto& p : module.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;  // frozen: not the engine's, stays whole
    const void* key = p.unsafeGetTensorImpl();
    if (seen_.count(key)) continue;
    const size_t j = shapes_.size();
    seen_.emplace(key, j);
    shapes_.push_back(p.sizes().vec());
    if (plan_) {
      if (j >= plan_->numel.size() || plan_->numel[j] != p.numel())
        throw UsageError("zero::build_partitioned: parameter " + std::to_string(j) +
                         " built in the second run has shape " + shape_str(p.sizes().vec()) +
                         ", unlike the first run's" + kDeterministic);
      if (!partition_.defined())
        partition_ = torch::zeros({plan_->part}, torch::TensorOptions().dtype(p.scalar_type()));
      if (p.scalar_type() != partition_.scalar_type() || !p.device().is_cpu())
        throw UsageError(
            "zero::build_partitioned: every trainable parameter must be on the CPU "
            "with one dtype; parameter " +
            std::to_string(j) + " of shape " + shape_str(p.sizes().vec()) + " is " +
            std::string(c10::toString(p.scalar_type())) + " on " + p.device().str());
      // The intersection of [offset, offset + n) with this rank's [lo, hi).
      const int64_t off = plan_->offset[j], n = p.numel();
      const int64_t lo = rank_ * plan_->part, hi = lo + plan_->part;
      const int64_t a = std::max(off, lo), b = std::min(off + n, hi);
      if (a < b)
        partition_.narrow(0, a - lo, b - a)
            .copy_(p.detach().reshape({-1}).narrow(0, a - off, b - a));
    }
    p.set_data(torch::empty({0}, p.options()));
  }
}

Init::Plan Init::plan(torch::nn::Module& root) {
  partition(root);
  Plan plan;
  plan.offset.assign(shapes_.size(), -1);
  plan.numel.resize(shapes_.size());
  int64_t total = 0;
  for (auto& p : root.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;
    const size_t j = seen_.at(p.unsafeGetTensorImpl());
    int64_t n = 1;
    for (auto d : shapes_[j]) n *= d;
    plan.offset[j] = total;
    plan.numel[j] = n;
    plan.shapes.push_back(shapes_[j]);
    total += n;
  }
  for (size_t j = 0; j < shapes_.size(); ++j)
    if (plan.offset[j] < 0)
      throw UsageError("zero::build_partitioned: a trainable parameter of shape " +
                       shape_str(shapes_[j]) +
                       " was passed to init() but is not part of the module the build function "
                       "returned; register it in the module (or build it outside init())");
  if (total == 0)
    throw UsageError("zero::build_partitioned: the module has no trainable parameters");
  plan.part = detail::padded_numel(total, world_) / world_;
  return plan;
}

std::shared_ptr<PartitionedShards> Init::finish(torch::nn::Module& root) {
  DTRAIN_ASSERT(plan_ != nullptr, "Init::finish on the first run");
  partition(root);
  if (shapes_.size() != plan_->numel.size())
    throw UsageError("zero::build_partitioned: the second run built " +
                     std::to_string(shapes_.size()) + " trainable parameters, the first " +
                     std::to_string(plan_->numel.size()) + kDeterministic);
  size_t k = 0;
  for (auto& p : root.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;
    const size_t j = seen_.at(p.unsafeGetTensorImpl());
    if (k >= plan_->shapes.size() || shapes_[j] != plan_->shapes[k])
      throw UsageError("zero::build_partitioned: the second run registered parameter " +
                       std::to_string(k) + " with shape " + shape_str(shapes_[j]) +
                       ", unlike the first run's" + kDeterministic);
    ++k;
  }
  if (k != plan_->shapes.size())
    throw UsageError("zero::build_partitioned: the second run's module registers " +
                     std::to_string(k) + " trainable parameters, the first run's " +
                     std::to_string(plan_->shapes.size()) + kDeterministic);
  auto shards = std::make_shared<PartitionedShards>();
  shards->rank = rank_;
  shards->world = world_;
  shards->shapes = plan_->shapes;
  shards->partition = partition_;
  return shards;
}

}  // namespace dtrain::zero
