// The background half of a Reader: threads decode this rank's pieces (row-group slices) ahead
// of the training loop into a bounded window, handed out strictly in order.
//
// Protocol: a thread claims the next piece only while fewer than `window` pieces are claimed
// and not yet popped, so at most `window` decoded pieces exist at once (plus the one the
// consumer holds). pop() waits for piece i (up to the timeout), rethrows what decoding it
// threw, and frees its slot. Destruction stops the threads and waits for them.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/thread_annotations.h"
#include "data/plan.h"
#include "data/table_state.h"
#include "dtrain/data_reader.h"

namespace dtrain::data::detail {

class Prefetcher {
 public:
  Prefetcher(const TableState& table, const std::vector<Column>& columns, std::vector<Piece> pieces,
             uint64_t seed, int64_t epoch, bool shuffle, int threads, int window,
             std::chrono::milliseconds timeout);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next piece's tensors ([piece rows, shape...] per column). REQUIRES: pieces left.
  std::vector<torch::Tensor> pop();

 private:
  void run();
  std::vector<torch::Tensor> decode(class FileDecoder& decoder, const Piece& piece);

  const TableState& table_;
  const std::vector<Column>& columns_;
  const std::vector<Piece> pieces_;
  const uint64_t seed_;
  const int64_t epoch_;
  const bool shuffle_;
  const size_t window_;
  const std::chrono::milliseconds timeout_;

  Mutex mu_;
  std::condition_variable claimable_;  // a slot freed, or stop
  std::condition_variable decoded_;    // a piece is done
  size_t next_claim_ DTRAIN_GUARDED_BY(mu_) = 0;
  size_t next_pop_ DTRAIN_GUARDED_BY(mu_) = 0;
  bool stop_ DTRAIN_GUARDED_BY(mu_) = false;
  struct Result {
    std::vector<torch::Tensor> tensors;
    std::exception_ptr error;
  };
  std::map<size_t, Result> done_ DTRAIN_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace dtrain::data::detail
