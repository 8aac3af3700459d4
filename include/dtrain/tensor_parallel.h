// Tensor parallelism (Megatron-LM's): a layer's matrices split across the ranks of a group,
// with the communication in the autograd graph.
//
// The four region functions are differentiable collectives over `group` (Megatron's names):
//   copy_to_tensor_parallel_region       forward identity,           backward all-reduce(sum)
//   reduce_from_tensor_parallel_region   forward all-reduce(sum),    backward identity
//   gather_from_tensor_parallel_region   forward all-gather last dim, backward keep own slice
//   scatter_to_tensor_parallel_region    forward keep own slice,      backward all-gather
// A ColumnParallelLinear (weight split by output rows) starts with the first, so the gradient
// of its replicated input sums every rank's part; a RowParallelLinear (weight split by input
// columns) ends with the second, so its output is the full product. The pair - column then
// row, as in a transformer's MLP or attention - costs one all-reduce forward and one backward.
//
// Weights: every layer is sharded from an unsharded one (given, or made with torch's default
// init from the current RNG state), so when every rank builds the unsharded model from the
// same seed, the sharded model computes exactly what the unsharded one does.
//
// REQUIRES: every rank of the group runs the same layers on tensors of the same shape, in the
// same order, forward and backward (they are collectives). The group must outlive every
// autograd graph built through these layers. A group of one rank, or a null group, skips
// the communication (T = 1).
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <variant>

#include "dtrain/process_group.h"

namespace dtrain {

using GroupPtr = std::shared_ptr<ProcessGroup>;

torch::Tensor copy_to_tensor_parallel_region(const torch::Tensor& x, const GroupPtr& group);
torch::Tensor reduce_from_tensor_parallel_region(const torch::Tensor& x, const GroupPtr& group);
torch::Tensor gather_from_tensor_parallel_region(const torch::Tensor& x, const GroupPtr& group);
torch::Tensor scatter_to_tensor_parallel_region(const torch::Tensor& x, const GroupPtr& group);

// y = x W^T + b with W's output rows split across the group: rank r holds rows
// [r*out/T, (r+1)*out/T). The input is replicated. With gather_output the output is the full
// y on every rank; without it, this rank's slice of y's last dimension (to feed a
// RowParallelLinear with input_is_parallel).
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  // A fresh layer: an unsharded torch::nn::Linear(in, out, bias) is made (torch's default init,
  // from the current RNG state) and sharded. UsageError when out is not divisible by T.
  ColumnParallelLinearImpl(int64_t in_features, int64_t out_features, GroupPtr group,
                           bool bias = true, bool gather_output = true);
  // Shards an existing unsharded Linear (which is left unchanged).
  ColumnParallelLinearImpl(const torch::nn::Linear& full, GroupPtr group,
                           bool gather_output = true);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // [out/T, in]
  torch::Tensor bias;    // [out/T], undefined without bias
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }  // unsharded

 private:
  void init(const torch::nn::Linear& full);
  GroupPtr group_;
  int64_t in_ = 0, out_ = 0;
  bool gather_output_ = true;
};
TORCH_MODULE(ColumnParallelLinear);

// y = x W^T + b with W's input columns split across the group: rank r holds columns
// [r*in/T, (r+1)*in/T). With input_is_parallel the input is already this rank's slice of the
// last dimension (a ColumnParallelLinear's output without gather_output); without it the full
// input is given and sliced here. The output is the full y on every rank (the bias, not
// sharded, is added once after the all-reduce).
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(int64_t in_features, int64_t out_features, GroupPtr group, bool bias = true,
                        bool input_is_parallel = true);
  RowParallelLinearImpl(const torch::nn::Linear& full, GroupPtr group,
                        bool input_is_parallel = true);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // [out, in/T]
  torch::Tensor bias;    // [out], replicated; undefined without bias
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  void init(const torch::nn::Linear& full);
  GroupPtr group_;
  int64_t in_ = 0, out_ = 0;
  bool input_is_parallel_ = true;
};
TORCH_MODULE(RowParallelLinear);

// An embedding whose rows (the vocabulary) are split across the group: rank r holds ids
// [r*V/T, (r+1)*V/T). Each rank looks up the ids it holds (zeros for the others) and an
// all-reduce sums the parts, so the output is the full embedding on every rank.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim, GroupPtr group);
  VocabParallelEmbeddingImpl(const torch::nn::Embedding& full, GroupPtr group);
  torch::Tensor forward(const torch::Tensor& ids);

  torch::Tensor weight;  // [V/T, dim]
  int64_t vocab_start() const { return start_; }
  int64_t vocab_end() const { return end_; }

 private:
  void init(const torch::Tensor& full_weight);
  GroupPtr group_;
  int64_t start_ = 0, end_ = 0;
};
TORCH_MODULE(VocabParallelEmbedding);

// Mean cross-entropy of logits split along the vocabulary: `local_logits` [N, V/T] is this
// rank's slice (rank r holds classes [r*V/T, (r+1)*V/T)), `target` [N] holds global class
// ids. Equals torch::nn::functional::cross_entropy of the full [N, V] logits, and its
// gradient with respect to local_logits is this rank's slice of the full gradient, while only
// [N]-sized tensors cross the wire (three all-reduces: max, target logit, sum of exps).
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& local_logits,
                                           const torch::Tensor& target, const GroupPtr& group);

// parallelize(): torch's parallelize_module plan styles, for named Linear layers.
struct ColwiseParallel {
  bool gather_output = false;  // Default: the output stays sharded (feed a RowwiseParallel).
};
struct RowwiseParallel {
  bool input_is_parallel = true;  // Default: the input is a ColwiseParallel's sharded output.
};
using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel>;
// Child name -> style (the names a Sequential's named_children() gives: "0", "1", ... or the
// names it was built with).
using ParallelizePlan = std::map<std::string, ParallelStyle>;

// A new Sequential equal to `module` with each planned torch::nn::Linear replaced by the
// parallel layer sharded from it (other children are shared with `module`, not copied).
// UsageError when a planned name is not a child Linear (listing the children) or a size is
// not divisible by the group size. Sequential only (and not nested ones, which the C++
// frontend cannot hold in a Sequential): other modules call their children through typed
// fields that cannot be redirected, so custom modules use the layers above directly.
torch::nn::Sequential parallelize(const torch::nn::Sequential& module, const ParallelizePlan& plan,
                                  const GroupPtr& group);

}  // namespace dtrain
