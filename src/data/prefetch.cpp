#include "data/prefetch.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <numeric>
#include <sstream>

#include "data/parquet_file.h"

namespace dtrain::data::detail {

Prefetcher::Prefetcher(const TableState& table, const std::vector<Column>& columns,
                       std::vector<Piece> pieces, uint64_t seed, int64_t epoch, bool shuffle,
                       int threads, int window, std::chrono::milliseconds timeout,
                       RowGroupCache* cache, int nice)
    : table_(table),
      columns_(columns),
      pieces_(std::move(pieces)),
      seed_(seed),
      epoch_(epoch),
      shuffle_(shuffle),
      window_(static_cast<size_t>(std::max(window, 1))),
      timeout_(timeout),
      cache_(cache && cache->budget() > 0 ? cache : nullptr) {
  for (const auto& c : columns_) {
    const int64_t values =
        std::accumulate(c.shape.begin(), c.shape.end(), int64_t{1}, std::multiplies<>());
    row_bytes_ += values * static_cast<int64_t>(c10::elementSize(c.dtype));
  }
  nice_ = std::max(nice, 0);
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

namespace {

std::string row_group_name(const TableState& table, const Piece& piece) {
  const RowGroup& rg = table.row_groups[static_cast<size_t>(piece.group)];
  return "row group " + std::to_string(rg.index) + " of " +
         table.paths[static_cast<size_t>(rg.file)];
}

// What a column's `kind` function (its preprocess or transform) makes of `in`; what it throws
// becomes one DataError naming the column and `where`.
torch::Tensor call(const char* kind, const Column& column,
                   const std::function<torch::Tensor(const torch::Tensor&)>& f,
                   const torch::Tensor& in, const std::string& where) {
  try {
    return f(in);
  } catch (const std::exception& e) {
    throw DataError("data: the " + std::string(kind) + " of column '" + column.name +
                    "' failed on " + where + ": " + e.what());
  }
}

}  // namespace

std::vector<torch::Tensor> transformed(const std::vector<Column>& columns,
                                       std::vector<torch::Tensor> tensors, int64_t rows,
                                       const std::string& where) {
  for (size_t c = 0; c < columns.size() && c < tensors.size(); ++c) {
    if (!columns[c].transform) continue;
    torch::Tensor out = call("transform", columns[c], columns[c].transform, tensors[c], where);
    if (!out.defined() || out.dim() == 0 || out.size(0) != rows) {
      throw DataError("data: the transform of column '" + columns[c].name + "' returned " +
                      (!out.defined()   ? std::string("an undefined tensor")
                       : out.dim() == 0 ? std::string("a scalar")
                                        : std::to_string(out.size(0)) + " rows") +
                      " for " + std::to_string(rows) + " rows of " + where +
                      ": a transform must map each row to one row");
    }
    tensors[c] = std::move(out);
  }
  return tensors;
}

void preprocess(const std::vector<Column>& columns, std::vector<torch::Tensor>& tensors,
                bool in_place, const std::string& where) {
  for (size_t c = 0; c < columns.size() && c < tensors.size(); ++c) {
    if (!columns[c].preprocess) continue;
    torch::Tensor out = call("preprocess", columns[c], columns[c].preprocess, tensors[c], where);
    if (!out.defined() || out.sizes() != tensors[c].sizes() ||
        out.scalar_type() != tensors[c].scalar_type()) {
      std::ostringstream got, want;
      if (out.defined()) got << out.scalar_type() << out.sizes();
      want << tensors[c].scalar_type() << tensors[c].sizes();
      throw DataError("data: the preprocess of column '" + columns[c].name + "' returned " +
                      (out.defined() ? got.str() : std::string("an undefined tensor")) + " for " +
                      want.str() + " of " + where +
                      ": a preprocess keeps the dtype and shape (a transform may change them)");
    }
    if (!in_place) {
      tensors[c] = std::move(out);
    } else if (!out.is_same(tensors[c])) {
      tensors[c].copy_(out);  // the tensors are a cache entry's memory: keep them
    }
  }
}

std::vector<torch::Tensor> Prefetcher::decode(FileDecoder& decoder, const Piece& piece) {
  const RowGroup& rg = table_.row_groups[static_cast<size_t>(piece.group)];
  const auto order = row_permutation(rg.rows, seed_, epoch_, piece.group, shuffle_);
  const std::string where = row_group_name(table_, piece);
  std::vector<torch::Tensor> rows;
  if (cache_) {
    if (auto kept = cache_->find(piece.group)) {
      rows = gather_rows(*kept, piece.begin, piece.end, order);
    } else if (cache_->has_room(rg.rows * row_bytes_)) {
      auto whole = cache_->offer(piece.group, rg.rows * row_bytes_, [&](const auto* into) {
        auto t = decoder.decode(rg.file, rg.index, 0, rg.rows, {}, into);
        preprocess(columns_, t, into != nullptr, where);
        return t;
      });
      rows = gather_rows(*whole, piece.begin, piece.end, order);
    }
  }
  if (rows.empty()) {
    rows = decoder.decode(rg.file, rg.index, piece.begin, piece.end, order);
    preprocess(columns_, rows, false, where);
  }
  return transformed(columns_, std::move(rows), piece.end - piece.begin, where);
}

std::vector<torch::Tensor> Prefetcher::gather(size_t i, const RowGroupCache::Entry& kept) const {
  const Piece& piece = pieces_[i];
  const RowGroup& rg = table_.row_groups[static_cast<size_t>(piece.group)];
  return transformed(columns_,
                     gather_rows(*kept, piece.begin, piece.end,
                                 row_permutation(rg.rows, seed_, epoch_, piece.group, shuffle_)),
                     piece.end - piece.begin, row_group_name(table_, piece));
}

void Prefetcher::run() {
  pthread_setname_np(pthread_self(), "dtrain-data");
  if (nice_ > 0) {
    // Linux: a thread's nice value is its own (setpriority on its thread id), inherited from
    // the thread that created it. Raising it needs no privilege; failing is harmless.
    const auto tid = static_cast<id_t>(syscall(SYS_gettid));
    errno = 0;
    const int base = getpriority(PRIO_PROCESS, tid);
    if (errno == 0) setpriority(PRIO_PROCESS, tid, std::min(base + nice_, 19));
  }
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
  size_t i;
  bool unclaimed;
  {
    MutexLock lock(mu_);
    DTRAIN_ASSERT(next_pop_ < pieces_.size(), "Prefetcher::pop past the last piece");
    i = next_pop_;  // pop() alone moves it
    unclaimed = next_claim_ == i;
  }
  // A kept piece no thread has reached yet: never wait for (low-priority) threads for it. The
  // cache is asked outside the lock - finding a shared entry opens and maps its file - and
  // the claim is made under it only if no thread claimed the piece meanwhile (that thread
  // then finds the entry itself).
  RowGroupCache::Entry kept = unclaimed && cache_ ? cache_->find(pieces_[i].group) : nullptr;
  MutexLock lock(mu_);
  if (kept && next_claim_ == i) {
    done_[i] = Result{.kept = std::move(kept)};
    ++next_claim_;
  }
  if (!decoded_.wait_for(lock.native(), timeout_, [&] {
        mu_.assert_held();
        return done_.count(i) > 0;
      })) {
    throw TimeoutError("data: " + row_group_name(table_, pieces_[i]) + " was not decoded within " +
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
  // A kept piece no thread had reached: gathered here, on the caller's thread (a copy of the
  // piece's rows, a fraction of a millisecond per thousand rows), never a wait.
  if (r.kept) return gather(i, r.kept);
  return std::move(r.tensors);
}

}  // namespace dtrain::data::detail
