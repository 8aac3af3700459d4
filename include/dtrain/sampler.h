// DistributedSampler: which sample indices each rank reads, with PyTorch's semantics exactly
// (torch.utils.data.DistributedSampler, 1.13), so a C++ and a Python job given the same size,
// replicas, rank, seed and epoch read the same samples.
//
//   shuffle:   indices = randperm(size) from a CPU generator seeded with seed + epoch,
//              else 0..size-1;
//   drop_last: false -> pad by repeating indices from the start up to total_size;
//              true  -> truncate to total_size;
//   this rank: indices[rank : total_size : num_replicas].
// num_samples = drop_last && size % num_replicas ? ceil((size - num_replicas) / num_replicas)
//                                                : ceil(size / num_replicas);
// total_size = num_samples * num_replicas.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace dtrain {

struct DistributedSamplerOptions {
  // Number of ranks reading the data. Default: the default group's world size, else
  // WORLD_SIZE from the environment, else 1.
  std::optional<int> num_replicas;
  // This rank. Default: the default group's rank, else RANK, else 0.
  std::optional<int> rank;
  bool shuffle = true;     // Default: true.
  uint64_t seed = 0;       // Default: 0. Must be the same on every rank.
  bool drop_last = false;  // Default: false.
};

class DistributedSampler {
 public:
  // Throws UsageError if rank is outside [0, num_replicas) or num_replicas < 1.
  explicit DistributedSampler(int64_t size, DistributedSamplerOptions options = {});

  // Reshuffles for an epoch; call it before each epoch (as in PyTorch), or every epoch
  // yields the same order.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch (num_samples() of them).
  std::vector<int64_t> indices() const;
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return total_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

 private:
  int64_t size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
  int64_t total_size_;
  int64_t epoch_ = 0;
};

}  // namespace dtrain
