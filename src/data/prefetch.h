// The background half of a Reader: threads decode this rank's pieces (row-group slices) ahead
// of the training loop into a bounded window, handed out strictly in order.
//
// Protocol: a thread claims the next piece only while fewer than `window` pieces are claimed
// and not yet popped, so at most `window` decoded pieces exist at once (plus the one the
// consumer holds). pop() waits for piece i (up to the timeout), rethrows what decoding it
// threw, and frees its slot. Destruction stops the threads and waits for them.
//
// With a cache, a piece of a kept row group is gathered from it (a copy) by the thread that
// claims it; pop() claims such a piece itself when no thread has reached it yet (never a
// wait for the low-priority threads). A piece of another row group is decoded whole by a
// thread and offered to the cache while it has room. The columns' preprocess runs on what
// was decoded, before the cache; their transforms on the piece where it was made, after it. The
// threads are named "dtrain-data" and run `nice` steps below the thread that made the Prefetcher.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_annotations.h"
#include "data/cache.h"
#include "data/plan.h"
#include "data/table_state.h"
#include "dtrain/data_reader.h"

namespace dtrain::data::detail {

class Prefetcher {
 public:
  Prefetcher(const TableState& table, const std::vector<Column>& columns, std::vector<Piece> pieces,
             uint64_t seed, int64_t epoch, bool shuffle, int threads, int window,
             std::chrono::milliseconds timeout, RowGroupCache* cache, int nice);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next piece's tensors ([piece rows, shape...] per column). REQUIRES: pieces left.
  std::vector<torch::Tensor> pop();

 private:
  void run();
  std::vector<torch::Tensor> decode(class FileDecoder& decoder, const Piece& piece);
  // Piece i's tensors from a kept row group, transformed.
  std::vector<torch::Tensor> gather(size_t i, const RowGroupCache::Entry& kept) const;

  const TableState& table_;
  const std::vector<Column>& columns_;
  const std::vector<Piece> pieces_;
  const uint64_t seed_;
  const int64_t epoch_;
  const bool shuffle_;
  const size_t window_;
  const std::chrono::milliseconds timeout_;
  RowGroupCache* const cache_;  // nullptr: none
  int64_t row_bytes_ = 0;       // one decoded row of every column
  int nice_ = 0;                // added to the threads' nice value

  Mutex mu_;
  std::condition_variable claimable_;  // a slot freed, or stop
  std::condition_variable decoded_;    // a piece is done
  size_t next_claim_ DTRAIN_GUARDED_BY(mu_) = 0;
  size_t next_pop_ DTRAIN_GUARDED_BY(mu_) = 0;
  bool stop_ DTRAIN_GUARDED_BY(mu_) = false;
  struct Result {
    std::vector<torch::Tensor> tensors;
    std::exception_ptr error;
    RowGroupCache::Entry kept;  // set: pop() gathers the piece from this cache entry
  };
  std::map<size_t, Result> done_ DTRAIN_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

// The columns' transforms applied to `tensors` (one per column, `rows` rows each); `where`
// (a row group and file, or "an empty batch") names the rows in the DataError for a
// transform that throws or does not return `rows` rows.
std::vector<torch::Tensor> transformed(const std::vector<Column>& columns,
                                       std::vector<torch::Tensor> tensors, int64_t rows,
                                       const std::string& where);
// The columns' preprocess applied to freshly decoded `tensors`; in_place: the results are
// written back into them (a cache entry's memory). DataError naming the column and `where`
// for one that throws or changes a dtype or shape.
void preprocess(const std::vector<Column>& columns, std::vector<torch::Tensor>& tensors,
                bool in_place, const std::string& where);

}  // namespace dtrain::data::detail
