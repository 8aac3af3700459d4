#include "dtrain/tensor_parallel.h"

#include <c10/util/Type.h>

#include <cstdint>
#include <set>
#include <typeinfo>

#include "dtrain/collectives.h"
#include "dtrain/error.h"

namespace dtrain {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

int group_size(const GroupPtr& g) { return g ? g->world_size() : 1; }
int group_rank(const GroupPtr& g) { return g ? g->rank() : 0; }

// The group travels through the autograd context as its address: saved_data holds IValues,
// which cannot hold a ProcessGroup. The header's contract (the group outlives the graph)
// keeps it valid.
void save_group(AutogradContext* ctx, ProcessGroup* g) {
  ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<std::intptr_t>(g));
}
ProcessGroup* saved_group(AutogradContext* ctx) {
  return reinterpret_cast<ProcessGroup*>(
      static_cast<std::intptr_t>(ctx->saved_data["group"].toInt()));
}
std::shared_ptr<ProcessGroup> borrow(ProcessGroup* g) {
  return std::shared_ptr<ProcessGroup>(std::shared_ptr<ProcessGroup>{}, g);  // non-owning alias
}

torch::Tensor all_reduce_sum(const torch::Tensor& x, ProcessGroup* g) {
  torch::Tensor out = x.contiguous().clone();
  AllReduceOptions o;
  o.group = borrow(g);
  all_reduce(out, o);
  return out;
}
torch::Tensor all_gather_last(const torch::Tensor& x, ProcessGroup* g) {
  CollectiveOptions o;
  o.group = borrow(g);
  return torch::cat(all_gather(x.contiguous(), o), -1);
}
torch::Tensor own_slice_last(const torch::Tensor& x, ProcessGroup* g) {
  const int64_t n = x.size(-1), t = g->world_size();
  if (n % t != 0) {
    throw UsageError("tensor parallel: last dimension " + std::to_string(n) +
                     " is not divisible by the group size " + std::to_string(t));
  }
  return x.narrow(-1, g->rank() * (n / t), n / t).contiguous();
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, ProcessGroup* g) {
    save_group(ctx, g);
    return x;  // autograd wraps an input returned as-is in a view of itself
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {all_reduce_sum(grads[0], saved_group(ctx)), torch::Tensor()};
  }
};
struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, ProcessGroup* g) {
    return all_reduce_sum(x, g);
  }
  static tensor_list backward(AutogradContext*, tensor_list grads) {
    return {grads[0], torch::Tensor()};
  }
};
struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, ProcessGroup* g) {
    save_group(ctx, g);
    return all_gather_last(x, g);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {own_slice_last(grads[0], saved_group(ctx)), torch::Tensor()};
  }
};
struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, ProcessGroup* g) {
    save_group(ctx, g);
    return own_slice_last(x, g);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {all_gather_last(grads[0], saved_group(ctx)), torch::Tensor()};
  }
};

bool trivial(const GroupPtr& g) { return group_size(g) == 1; }

int64_t shard_of(int64_t n, const GroupPtr& g, const char* layer, const char* what) {
  const int t = group_size(g);
  if (n % t != 0) {
    throw UsageError(std::string(layer) + ": " + what + " = " + std::to_string(n) +
                     " is not divisible by the tensor-parallel size " + std::to_string(t) +
                     "; choose sizes that are multiples of it");
  }
  return n / t;
}

}  // namespace

torch::Tensor copy_to_tensor_parallel_region(const torch::Tensor& x, const GroupPtr& group) {
  return trivial(group) ? x : CopyToRegion::apply(x, group.get());
}
torch::Tensor reduce_from_tensor_parallel_region(const torch::Tensor& x, const GroupPtr& group) {
  return trivial(group) ? x : ReduceFromRegion::apply(x, group.get());
}
torch::Tensor gather_from_tensor_parallel_region(const torch::Tensor& x, const GroupPtr& group) {
  return trivial(group) ? x : GatherFromRegion::apply(x, group.get());
}
torch::Tensor scatter_to_tensor_parallel_region(const torch::Tensor& x, const GroupPtr& group) {
  return trivial(group) ? x : ScatterToRegion::apply(x, group.get());
}

// ---- ColumnParallelLinear ----

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in_features, int64_t out_features,
                                                   GroupPtr group, bool bias, bool gather_output)
    : group_(std::move(group)), gather_output_(gather_output) {
  shard_of(out_features, group_, "ColumnParallelLinear", "out_features");
  init(torch::nn::Linear(torch::nn::LinearOptions(in_features, out_features).bias(bias)));
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::nn::Linear& full, GroupPtr group,
                                                   bool gather_output)
    : group_(std::move(group)), gather_output_(gather_output) {
  init(full);
}

void ColumnParallelLinearImpl::init(const torch::nn::Linear& full) {
  in_ = full->options.in_features();
  out_ = full->options.out_features();
  const int64_t rows = shard_of(out_, group_, "ColumnParallelLinear", "out_features");
  const int64_t first = group_rank(group_) * rows;
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", full->weight.narrow(0, first, rows).clone());
  if (full->options.bias())
    bias = register_parameter("bias", full->bias.narrow(0, first, rows).clone());
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y =
      torch::nn::functional::linear(copy_to_tensor_parallel_region(x, group_), weight, bias);
  return gather_output_ ? gather_from_tensor_parallel_region(y, group_) : y;
}

// ---- RowParallelLinear ----

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in_features, int64_t out_features,
                                             GroupPtr group, bool bias, bool input_is_parallel)
    : group_(std::move(group)), input_is_parallel_(input_is_parallel) {
  shard_of(in_features, group_, "RowParallelLinear", "in_features");
  init(torch::nn::Linear(torch::nn::LinearOptions(in_features, out_features).bias(bias)));
}

RowParallelLinearImpl::RowParallelLinearImpl(const torch::nn::Linear& full, GroupPtr group,
                                             bool input_is_parallel)
    : group_(std::move(group)), input_is_parallel_(input_is_parallel) {
  init(full);
}

void RowParallelLinearImpl::init(const torch::nn::Linear& full) {
  in_ = full->options.in_features();
  out_ = full->options.out_features();
  const int64_t cols = shard_of(in_, group_, "RowParallelLinear", "in_features");
  torch::NoGradGuard no_grad;
  weight =
      register_parameter("weight", full->weight.narrow(1, group_rank(group_) * cols, cols).clone());
  if (full->options.bias()) bias = register_parameter("bias", full->bias.clone());
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor local = input_is_parallel_ ? x : scatter_to_tensor_parallel_region(x, group_);
  if (local.size(-1) != weight.size(1)) {
    throw UsageError("RowParallelLinear: input's last dimension is " +
                     std::to_string(local.size(-1)) + " but this rank's shard takes " +
                     std::to_string(weight.size(1)) +
                     (input_is_parallel_ ? " (input_is_parallel: pass this rank's slice)" : ""));
  }
  torch::Tensor y =
      reduce_from_tensor_parallel_region(torch::nn::functional::linear(local, weight), group_);
  return bias.defined() ? y + bias : y;
}

// ---- VocabParallelEmbedding ----

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t num_embeddings,
                                                       int64_t embedding_dim, GroupPtr group)
    : group_(std::move(group)) {
  shard_of(num_embeddings, group_, "VocabParallelEmbedding", "num_embeddings");
  init(torch::nn::Embedding(num_embeddings, embedding_dim)->weight);
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::nn::Embedding& full,
                                                       GroupPtr group)
    : group_(std::move(group)) {
  init(full->weight);
}

void VocabParallelEmbeddingImpl::init(const torch::Tensor& full_weight) {
  const int64_t rows =
      shard_of(full_weight.size(0), group_, "VocabParallelEmbedding", "num_embeddings");
  start_ = group_rank(group_) * rows;
  end_ = start_ + rows;
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", full_weight.narrow(0, start_, rows).clone());
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  if (trivial(group_)) return torch::nn::functional::embedding(ids, weight);
  // Ids held elsewhere look up row 0 and are zeroed, so the all-reduce adds exactly one
  // non-zero row per id.
  torch::Tensor outside = (ids < start_).logical_or(ids >= end_);
  torch::Tensor local = (ids - start_).masked_fill(outside, 0);
  torch::Tensor out =
      torch::nn::functional::embedding(local, weight).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_from_tensor_parallel_region(out, group_);
}

// ---- vocab-parallel cross-entropy ----

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& local_logits,
                                           const torch::Tensor& target, const GroupPtr& group) {
  if (local_logits.dim() != 2 || target.dim() != 1 || target.size(0) != local_logits.size(0)) {
    throw UsageError("vocab_parallel_cross_entropy: expected logits [N, V/T] and target [N], got " +
                     std::string(c10::str(local_logits.sizes())) + " and " +
                     std::string(c10::str(target.sizes())));
  }
  const int64_t width = local_logits.size(1);
  const int64_t start = group_rank(group) * width;
  // The max only keeps exp() in range; it cancels out of the loss, so it needs no gradient.
  torch::Tensor max = std::get<0>(local_logits.detach().max(1, /*keepdim=*/true));
  if (!trivial(group)) {
    AllReduceOptions o;
    o.group = group;
    o.op = ReduceOp::kMax;
    all_reduce(max, o);
  }
  torch::Tensor shifted = local_logits - max;
  // loss_i = log(sum_j exp(z_ij)) - z_i,target. Each term is a sum over the ranks' parts;
  // reduce_from_tensor_parallel_region (identity backward) sends each rank the gradient of
  // its own part, which is its slice of the full gradient.
  torch::Tensor sum_exp = reduce_from_tensor_parallel_region(shifted.exp().sum(1), group);
  torch::Tensor mine = (target >= start).logical_and(target < start + width);
  torch::Tensor local_target = (target - start).masked_fill(mine.logical_not(), 0);
  torch::Tensor picked =
      shifted.gather(1, local_target.unsqueeze(1)).squeeze(1).masked_fill(mine.logical_not(), 0.0);
  torch::Tensor target_logit = reduce_from_tensor_parallel_region(picked, group);
  return (sum_exp.log() - target_logit).mean();
}

// ---- parallelize ----

namespace {

torch::nn::Sequential parallelize_at(const torch::nn::Sequential& seq, const ParallelizePlan& plan,
                                     const GroupPtr& group, std::set<std::string>& used) {
  torch::nn::Sequential out;
  auto any = seq->begin();
  for (const auto& item : seq->named_children()) {
    const std::string& name = item.key();
    torch::nn::AnyModule module = *any++;
    auto style = plan.find(name);
    if (style != plan.end()) {
      auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(item.value());
      if (!linear) {
        // Not item.value()->name(): Module::name() caches the name in a mutable member on first
        // use, so ranks that are threads sharing one model (tests) raced on it - a double free
        // on libtorch 2.x. typeid reads nothing of the module's state.
        const torch::nn::Module& child = *item.value();
        throw UsageError("parallelize: '" + name + "' is a " + c10::demangle(typeid(child).name()) +
                         ", not a torch::nn::Linear; ColwiseParallel and RowwiseParallel apply to "
                         "Linear layers");
      }
      used.insert(name);
      torch::nn::Linear full(linear);
      if (auto* col = std::get_if<ColwiseParallel>(&style->second)) {
        out->push_back(std::string(item.key()),
                       ColumnParallelLinear(full, group, col->gather_output));
      } else {
        out->push_back(
            std::string(item.key()),
            RowParallelLinear(full, group,
                              std::get<RowwiseParallel>(style->second).input_is_parallel));
      }
      continue;
    }
    out->push_back(std::string(item.key()), module);
  }
  return out;
}

}  // namespace

torch::nn::Sequential parallelize(const torch::nn::Sequential& module, const ParallelizePlan& plan,
                                  const GroupPtr& group) {
  std::set<std::string> used;
  torch::nn::Sequential out = parallelize_at(module, plan, group, used);
  for (const auto& [name, style] : plan) {
    if (used.count(name)) continue;
    std::string children;
    for (const auto& item : module->named_children()) children += " " + item.key();
    throw UsageError("parallelize: the plan names '" + name +
                     "' but the module has no such child; its children are:" + children);
  }
  return out;
}

}  // namespace dtrain
