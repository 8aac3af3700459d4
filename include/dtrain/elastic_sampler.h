// ElasticSampler: a data-parallel sampler whose position survives a change of world size.
//
// Each epoch has one global order of the dataset (randperm(size) from a CPU generator seeded
// with seed + epoch, as DistributedSampler shuffles; else 0..size-1). A step takes the next
// global batch - the next min(batch_size * world_size, remaining) indices of that order - and
// rank r reads its positions r, r + W, r + 2W... So the samples consumed so far in an epoch
// are always a PREFIX of the global order, and the whole position is one number, offset():
// after a restart at another world size, the remaining size - offset samples are split over
// the new ranks, and every sample of the epoch is read exactly once across the restart.
//
// At an unchanged world size the batches are DistributedSampler's (shuffle, no drop_last):
// rank r's k-th batch holds the same indices in the same order. Only the epoch's last
// global batch differs: DistributedSampler pads it by repeating samples; this sampler does
// not pad, so there some ranks get fewer samples (and, when fewer remain than ranks, none:
// such a rank must still take part in the step's collectives, e.g. with a zero loss).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace dtrain {

struct ElasticSamplerOptions {
  // Ranks reading the data and this rank. Default: the default group's, else WORLD_SIZE and
  // RANK from the environment, else 1 and 0.
  std::optional<int> num_replicas;
  std::optional<int> rank;
  bool shuffle = true;  // Default: true.
  uint64_t seed = 0;    // Default: 0. Must be the same on every rank.
};

class ElasticSampler {
 public:
  // REQUIRES: size >= 0, batch_size >= 1, 0 <= rank < num_replicas; else UsageError.
  ElasticSampler(int64_t size, int64_t batch_size, ElasticSamplerOptions options = {});

  // Starts `epoch` at global position `offset` (0: its beginning). UsageError if offset is
  // outside [0, size].
  void set_epoch(int64_t epoch, int64_t offset = 0);
  int64_t epoch() const { return epoch_; }
  // Samples of this epoch consumed so far, by all ranks together (the position to commit).
  int64_t offset() const { return offset_; }
  bool epoch_done() const { return offset_ >= size_; }

  // This rank's indices of the next global batch, advancing offset() past the whole global
  // batch; nullopt when the epoch is done. Every rank must call it the same number of times
  // (the result may be empty on some ranks at the epoch's end, never nullopt on some only).
  // Keep the result in a variable (`while (auto b = next_batch())`): `for (i : *next_batch())`
  // iterates a temporary that is already destroyed.
  std::optional<std::vector<int64_t>> next_batch();
  // Global batches left in this epoch (the steps every rank will still take).
  int64_t steps_left() const;
  // The epoch's whole global order (size() indices).
  std::vector<int64_t> global_order() const;

  int64_t size() const { return size_; }
  int64_t batch_size() const { return batch_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

 private:
  int64_t size_;
  int64_t batch_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  int64_t offset_ = 0;
  std::vector<int64_t> order_;  // global_order() of epoch_, cached
};

}  // namespace dtrain
