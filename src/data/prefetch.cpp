#include "data/prefetch.h"

#include "data/parquet_file.h"

namespace dtrain::data::detail {

Prefetcher::Prefetcher(const TableState& table, const std::vector<Column>& columns,
                       std::vector<Piece> pieces, uint64_t seed, int64_t epoch, bool shuffle,
                       int threads, int window, std::chrono::milliseconds timeout)
    : table_(table),
      columns_(columns),
      pieces_(std::move(pieces)),
      seed_(seed),
      epoch_(epoch),
      shuffle_(shuffle),
      window_(static_cast<size_t>(std::max(window, 1))),
      timeout_(timeout) {
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), pieces_.size());
  for (size_t i = 0; i < n; ++i) threads_.emplace_back([this] { run(); });
}

Prefetcher::~Prefetcher() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  claimable_.notify_all();
  for (auto& t : threads_) t.join();
}

std::vector<torch::Tensor> Prefetcher::decode(FileDecoder& decoder, const Piece& piece) {
  const RowGroup& rg = table_.row_groups[static_cast<size_t>(piece.group)];
  return decoder.decode(rg.file, rg.index, piece.begin, piece.end,
                        row_permutation(rg.rows, seed_, epoch_, piece.group, shuffle_));
}

void Prefetcher::run() {
  // Each thread keeps its own open file: a row group of the same file next needs no new footer.
  FileDecoder decoder(table_, columns_);
  for (;;) {
    size_t i;
    {
      MutexLock lock(mu_);
      claimable_.wait(lock.native(), [&] {
        mu_.assert_held();
        return stop_ || (next_claim_ < pieces_.size() && next_claim_ < next_pop_ + window_);
      });
      if (stop_) return;
      i = next_claim_++;
    }
    Result r;
    try {
      r.tensors = decode(decoder, pieces_[i]);
    } catch (...) {
      r.error = std::current_exception();
    }
    {
      MutexLock lock(mu_);
      done_[i] = std::move(r);
    }
    decoded_.notify_all();
  }
}

std::vector<torch::Tensor> Prefetcher::pop() {
  MutexLock lock(mu_);
  DTRAIN_ASSERT(next_pop_ < pieces_.size(), "Prefetcher::pop past the last piece");
  const size_t i = next_pop_;
  if (!decoded_.wait_for(lock.native(), timeout_, [&] {
        mu_.assert_held();
        return done_.count(i) > 0;
      })) {
    const RowGroup& rg = table_.row_groups[static_cast<size_t>(pieces_[i].group)];
    throw TimeoutError("data: row group " + std::to_string(rg.index) + " of " +
                       table_.paths[static_cast<size_t>(rg.file)] + " was not decoded within " +
                       std::to_string(timeout_.count()) +
                       " ms (ReaderOptions::read_timeout): the file system is stalled or the "
                       "row group is very large");
  }
  Result r = std::move(done_[i]);
  done_.erase(i);
  ++next_pop_;
  lock.unlock();
  claimable_.notify_all();
  if (r.error) std::rethrow_exception(r.error);
  return std::move(r.tensors);
}

}  // namespace dtrain::data::detail
