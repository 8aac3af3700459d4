#include "dtrain/elastic_sampler.h"

#include <string>

#include "dtrain/env.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"
#include "dtrain/sampler.h"

namespace dtrain {

ElasticSampler::ElasticSampler(int64_t size, int64_t batch_size, ElasticSamplerOptions options)
    : size_(size), batch_size_(batch_size), shuffle_(options.shuffle), seed_(options.seed) {
  if (size < 0)
    throw UsageError("ElasticSampler: dataset size must be >= 0, got " + std::to_string(size));
  if (batch_size < 1)
    throw UsageError("ElasticSampler: batch_size must be >= 1, got " + std::to_string(batch_size));
  if (!options.num_replicas || !options.rank) {
    int world = 1, rank = 0;
    try {
      auto group = default_group();
      world = group->world_size();
      rank = group->rank();
    } catch (const UsageError&) {
      if (auto env = WorkerEnv::from_environ()) {
        world = env->world_size;
        rank = env->rank;
      }
    }
    if (!options.num_replicas) options.num_replicas = world;
    if (!options.rank) options.rank = rank;
  }
  num_replicas_ = *options.num_replicas;
  rank_ = *options.rank;
  if (num_replicas_ < 1) {
    throw UsageError("ElasticSampler: num_replicas must be >= 1, got " +
                     std::to_string(num_replicas_));
  }
  if (rank_ < 0 || rank_ >= num_replicas_) {
    throw UsageError("ElasticSampler: invalid rank " + std::to_string(rank_) +
                     ", rank should be in the interval [0, " + std::to_string(num_replicas_ - 1) +
                     "]");
  }
  set_epoch(0, 0);
}

std::vector<int64_t> ElasticSampler::global_order() const {
  // DistributedSampler on one replica is exactly the epoch's permutation (PyTorch's
  // randperm(size, generator seeded with seed + epoch)), so at an unchanged world size this
  // sampler reads what DistributedSampler does.
  DistributedSampler whole(size_,
                           {.num_replicas = 1, .rank = 0, .shuffle = shuffle_, .seed = seed_});
  whole.set_epoch(epoch_);
  return whole.indices();
}

void ElasticSampler::set_epoch(int64_t epoch, int64_t offset) {
  if (offset < 0 || offset > size_) {
    throw UsageError("ElasticSampler::set_epoch: offset " + std::to_string(offset) +
                     " is outside [0, " + std::to_string(size_) + "] (the dataset size)");
  }
  if (epoch != epoch_ || order_.size() != static_cast<size_t>(size_)) {
    epoch_ = epoch;
    order_ = global_order();
  }
  offset_ = offset;
}

std::optional<std::vector<int64_t>> ElasticSampler::next_batch() {
  if (offset_ >= size_) return std::nullopt;
  const int64_t global = std::min<int64_t>(batch_size_ * num_replicas_, size_ - offset_);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(batch_size_));
  for (int64_t i = rank_; i < global; i += num_replicas_)
    mine.push_back(order_[static_cast<size_t>(offset_ + i)]);
  offset_ += global;
  return mine;
}

int64_t ElasticSampler::steps_left() const {
  const int64_t global = batch_size_ * num_replicas_;
  return (size_ - offset_ + global - 1) / global;
}

}  // namespace dtrain
