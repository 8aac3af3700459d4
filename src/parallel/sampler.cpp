#include "dtrain/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <string>

#include "dtrain/env.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"

namespace dtrain {

namespace {

// ceil(a / b) for b > 0 and any sign of a, in exact integer arithmetic. Python computes
// math.ceil(a / b) in floating point; the two agree for every |a| < 2^53, i.e. every
// dataset that fits in memory. With drop_last and size < num_replicas `a` is negative
// (ceil(-0.5) == 0 there too), so the usual (a + b - 1) / b would be wrong.
int64_t ceil_div(int64_t a, int64_t b) {
  int64_t q = a / b;  // truncates toward zero
  return (a % b != 0 && a > 0) ? q + 1 : q;
}

// Where num_replicas/rank come from when the caller leaves them out: the default group
// (what PyTorch's dist.get_world_size()/get_rank() read), else the launcher's environment so
// a sampler can be built before init_process_group(), else a single process.
struct Placement {
  int world_size = 1;
  int rank = 0;
};

Placement default_placement() {
  try {
    auto group = default_group();
    return {group->world_size(), group->rank()};
  } catch (const UsageError&) {
    // No group: fall through to the environment.
  }
  if (auto env = WorkerEnv::from_environ()) return {env->world_size, env->rank};
  return {};
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t size, DistributedSamplerOptions options)
    : size_(size), shuffle_(options.shuffle), seed_(options.seed), drop_last_(options.drop_last) {
  if (size < 0) {
    throw UsageError("DistributedSampler: dataset size must be >= 0, got " + std::to_string(size));
  }
  // Only consult the group/environment for what was not given, so an explicit
  // num_replicas+rank works even with a malformed environment.
  if (!options.num_replicas || !options.rank) {
    Placement p = default_placement();
    if (!options.num_replicas) options.num_replicas = p.world_size;
    if (!options.rank) options.rank = p.rank;
  }
  num_replicas_ = *options.num_replicas;
  rank_ = *options.rank;
  if (num_replicas_ < 1) {
    throw UsageError("DistributedSampler: num_replicas must be >= 1, got " +
                     std::to_string(num_replicas_));
  }
  if (rank_ < 0 || rank_ >= num_replicas_) {
    throw UsageError("DistributedSampler: invalid rank " + std::to_string(rank_) +
                     ", rank should be in the interval [0, " + std::to_string(num_replicas_ - 1) +
                     "]");
  }
  if (drop_last_ && size_ % num_replicas_ != 0) {
    // Split to the nearest length evenly divisible by num_replicas (PyTorch's formula).
    num_samples_ = ceil_div(size_ - num_replicas_, num_replicas_);
  } else {
    num_samples_ = ceil_div(size_, num_replicas_);
  }
  total_size_ = num_samples_ * num_replicas_;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  if (shuffle_) {
    // Exactly Python's `g = torch.Generator(); g.manual_seed(seed + epoch);
    // torch.randperm(n, generator=g)`: same generator type, same seed (uint64 wrap-around, as
    // manual_seed does for negative sums), same kernel and dtype.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch_));
    torch::Tensor perm = torch::randperm(size_, gen, torch::TensorOptions().dtype(torch::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    all.assign(p, p + size_);
  } else {
    all.resize(static_cast<size_t>(size_));
    for (int64_t i = 0; i < size_; ++i) all[static_cast<size_t>(i)] = i;
  }

  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  // The padded (or truncated) list of total_size_ entries is all[j % size_] for j below
  // total_size_: padding repeats the list from the start as often as needed, which is what
  // PyTorch's two padding branches both compute. Take every num_replicas-th from rank.
  if (size_ == 0) return mine;  // total_size_ is 0 too
  for (int64_t j = rank_; j < total_size_; j += num_replicas_) {
    mine.push_back(all[static_cast<size_t>(j % size_)]);
  }
  DTRAIN_ASSERT(static_cast<int64_t>(mine.size()) == num_samples_,
                "sampler produced the wrong count");
  return mine;
}

}  // namespace dtrain
