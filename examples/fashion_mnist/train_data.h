// Where the example's training batches come from: the IDX files (DistributedSampler over the
// samples, as before) or a table (--data parquet:DIR / delta:DIR, read by dtrain::data: row
// groups split across ranks, decoded ahead by background threads). The table holds a column
// `image` of 784 pixel values per row (0-255, any numeric type: list<uint8> from pyarrow,
// array<float> from Spark) and `label` (any integer type).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

#include "data.h"

namespace fashion_mnist {

class TrainData {
 public:
  // location: "" for the IDX files in data_dir, else a dtrain::data table location. Batches
  // are on `device` (the IDX set is moved there whole; a table's batches one by one).
  TrainData(const std::string& location, const std::string& data_dir, int64_t batch_size,
            uint64_t seed, torch::Device device = torch::kCPU);
  ~TrainData();

  void set_epoch(int64_t epoch);
  int64_t steps_per_epoch() const;
  // Batch b of this rank in the current epoch (a table reads batches in order: asking for a
  // later one skips the ones between, as a resume from a mid-epoch checkpoint does).
  std::pair<torch::Tensor, torch::Tensor> batch(int64_t b);

 private:
  struct Table;
  std::unique_ptr<Table> table_;
  std::optional<Split> idx_;
  std::optional<torch::Tensor> indices_;
  int64_t batch_size_;
  uint64_t seed_;
  torch::Device device_;
  int64_t epoch_ = 0;
};

// A whole split from a table (the test set with --test-data), normalised as load_split's.
Split load_table_split(const std::string& location);

}  // namespace fashion_mnist
