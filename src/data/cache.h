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
// With shared entries (ReaderOptions::share_cache, data/shared_cache.h), a row group this
// cache does not hold is looked up among the host's other Readers' entries, and one it keeps
// is published there (and kept as the mapped copy): the budget counts what this cache
// published or holds privately, not what it maps from others.
//
// Thread-safety: every member may be called from any thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "core/thread_annotations.h"
#include "data/shared_cache.h"

namespace dtrain::data::detail {

class RowGroupCache {
 public:
  using Entry = std::shared_ptr<const std::vector<torch::Tensor>>;

  // budget_bytes <= 0: the cache keeps nothing. shared: the host's entries, or nullptr.
  explicit RowGroupCache(int64_t budget_bytes, std::unique_ptr<SharedEntries> shared = nullptr);
  ~RowGroupCache();

  // The kept tensors of row group `group` (its index in Table::row_groups()), or nullptr.
  Entry find(int64_t group) const;
  // Whether `bytes` more would fit in what is left of the budget now.
  bool has_room(int64_t bytes) const;
  // Row group `group` (`bytes` decoded) from `decode`, kept if it fits: decode(into) returns
  // the row group's tensors, written into `into` when that is not null (a shared entry's
  // memory). Returns what find(group) now returns (the decoded tensors when not kept).
  using Decode = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>* into)>;
  Entry offer(int64_t group, int64_t bytes, const Decode& decode);

  int64_t bytes() const;
  int64_t budget() const { return budget_; }

 private:
  const int64_t budget_;
  const std::unique_ptr<SharedEntries> shared_;
  mutable Mutex mu_;
  mutable std::map<int64_t, Entry> entries_ DTRAIN_GUARDED_BY(mu_);  // find() adds mapped ones
  int64_t bytes_ DTRAIN_GUARDED_BY(mu_) = 0;
};

// Rows [begin, end) of `whole` (a row group's tensors), in order[begin, end) when order is
// not empty: fresh tensors that own their memory.
std::vector<torch::Tensor> gather_rows(const std::vector<torch::Tensor>& whole, int64_t begin,
                                       int64_t end, const std::vector<int64_t>& order);

}  // namespace dtrain::data::detail
