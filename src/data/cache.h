// Decoded row groups kept in memory across epochs, up to a byte budget
// (ReaderOptions::cache_bytes): after a row group was decoded once, later reads of it are a
// copy (a gather of its rows in the epoch's order) instead of a Parquet decode.
//
// Filled first come, first kept, and never evicted: an epoch visits row groups in a random
// order, so evicting would only trade one miss for another; a table larger than the budget
// keeps hitting on the row groups it holds. Entries are whole row groups (every requested
// column, all rows, in file order, in the column's dtype), never modified once kept: readers
// copy out of them, so a batch never aliases the cache.
//
// Thread-safety: every member may be called from any thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/thread_annotations.h"

namespace dtrain::data::detail {

class RowGroupCache {
 public:
  using Entry = std::shared_ptr<const std::vector<torch::Tensor>>;

  // budget_bytes <= 0: the cache keeps nothing.
  explicit RowGroupCache(int64_t budget_bytes);

  // The kept tensors of row group `group` (its index in Table::row_groups()), or nullptr.
  Entry find(int64_t group) const;
  // Whether `bytes` more would fit in what is left of the budget now.
  bool has_room(int64_t bytes) const;
  // Keeps `tensors` as row group `group` if they fit; returns what find(group) now returns
  // (`tensors` themselves when they were not kept).
  Entry offer(int64_t group, std::vector<torch::Tensor> tensors);

  int64_t bytes() const;
  int64_t budget() const { return budget_; }

 private:
  const int64_t budget_;
  mutable Mutex mu_;
  std::map<int64_t, Entry> entries_ DTRAIN_GUARDED_BY(mu_);
  int64_t bytes_ DTRAIN_GUARDED_BY(mu_) = 0;
};

// Rows [begin, end) of `whole` (a row group's tensors), in order[begin, end) when order is
// not empty: fresh tensors that own their memory.
std::vector<torch::Tensor> gather_rows(const std::vector<torch::Tensor>& whole, int64_t begin,
                                       int64_t end, const std::vector<int64_t>& order);

}  // namespace dtrain::data::detail
