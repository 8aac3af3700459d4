// dtrain::data::Reader: this rank's batches of a Table (dtrain/data_table.h) as tensors, split
// across ranks by row group, decoded by background threads into a bounded queue.
//
//   auto table = dtrain::data::Table::open("delta:/data/fashion");
//   dtrain::data::Reader reader(table, {.columns = {{.name = "image", .shape = {1, 28, 28}},
//                                                    {.name = "label", .dtype = torch::kLong}},
//                                       .batch_size = 64, .seed = 0});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     reader.set_epoch(epoch);
//     while (auto batch = reader.next()) {
//       auto loss = cross_entropy(model(batch->at("image")), batch->at("label"));
//       ...
//     }
//   }
//
// The split. Row groups are numbered in table order (Table::row_groups()). Per epoch:
// - Distributed mode (default; PyTorch's DistributedSampler over row groups): this rank reads
//   the row groups DistributedSampler(num_row_groups, num_replicas, rank, shuffle, seed,
//   drop_last).set_epoch(epoch).indices() names - exactly dtrain::DistributedSampler's (and
//   so PyTorch's) indices, with padding or truncation of the row-group list as it does. With
//   shuffle, the rows inside each row group are permuted too (a generator seeded by seed,
//   epoch and the row group). Row groups hold different row counts, so ranks would read
//   different numbers of rows and take different numbers of steps (a DDP hang): every rank
//   therefore reads the same number of rows - the largest rank's count, the short ranks
//   repeating their own rows from their start (as DistributedSampler pads), or with drop_last
//   the smallest rank's count, the others dropping their tail. Every rank takes
//   steps_per_epoch() steps of batch_size rows (the last one may be smaller, equally on all).
// - Elastic mode (elastic = true; dtrain::ElasticSampler's exactly-once): no padding, no
//   dropping: the epoch's row groups, in the order ElasticSampler's global_order() gives them,
//   are dealt to ranks round robin; each step every rank takes its next batch_size rows; ranks
//   that run out first get smaller, then EMPTY batches (still take part in the step's
//   collectives) until the longest is done. position() is the rows still unread, and
//   restore(position) on a job of ANOTHER world size deals exactly those: every row of the
//   epoch is read exactly once across the restart. Commit position() with your checkpoint
//   (ElasticState: es.metadata()["data"] = reader.position()).
// Every rank computes every rank's plan from the footers alone (no communication), so all
// ranks agree on steps_per_epoch() and on when next() returns nullopt.
//
// Columns. Each Column names a table column and the tensor it becomes: dtype (any numeric
// dtype; values convert as torch's to() does) and per-row shape. A scalar column (int*, uint*,
// half, float, double, bool) has shape {} (or any shape of 1 element); a list column (list,
// large_list, fixed_size_list of a scalar type: Spark's ArrayType, NumPy arrays written by
// pyarrow) has as many values per row as the shape's product, in row-major order. The batch
// holds [rows, shape...] tensors, contiguous, on the CPU (or what the column's transform made
// of them), keyed by `key` (default: the name).
//
// Memory: at most `prefetch` decoded row groups wait in the queue and `threads` more are being
// decoded; the batch being assembled adds at most one more. So about
// (prefetch + threads + 1) x (one row group's decoded size), plus the cache: at most
// cache_bytes, whatever the table's size.
//
// Cache: each row group this Reader decodes is kept whole (every column, all rows, in the
// columns' dtypes) while it fits in cache_bytes (default 256 MiB per Reader; 0: none), and
// later reads of it - later epochs, padding, restore() - gather its rows from memory instead
// of decoding the file again. First come, first kept, never evicted (epochs visit row groups
// in random order: a fixed subset keeps hitting). A table that fits is decoded once per rank
// over the first epochs (DistributedSampler gives a rank other row groups each epoch), or
// once per host when shared (below); one that does not keeps the row groups it holds. The
// files are not read again for a kept row group (a file rewritten in place is not seen: open
// a new Table and Reader). Batches are copies: changing one in place never changes the cache.
//
// Shared (share_cache, on by default when a host runs several ranks): the row groups a
// rank keeps are files in /dev/shm that the host's other ranks map instead of decoding
// them, so a host decodes each row group once and holds one copy (each rank's budget counts
// what it published; mapped pages show in every mapping rank's RSS, once in the host's
// memory). Entries are keyed by the table's files (path, size, modification time) and the
// columns, written whole before they are seen, checked when mapped, and removed by the last
// Reader of the host to finish; those of ranks that died without clean-up are swept by
// `dtrain run` once its workers are gone (under another launcher: the next job over the same
// table, or rm /dev/shm/dtrain-data-*). With a column's preprocess (a function, which cannot
// be compared) only the job's own ranks share. Without /dev/shm the cache is private.
//
// Transforms: a Column's transform (an augmentation, a dtype of the model's) runs on the
// decoding threads, as a DataLoader's transforms run in its workers, not on the training
// loop's: it gets a slice of decoded rows ([n, shape...] in the column's dtype, n up to a row
// group's rows, in the epoch's order) and returns the batch's tensor for those rows, of any
// dtype and per-row shape. It must be row-wise: n rows in, n rows out, row i from row i alone
// (batches are cut from its outputs). The cache keeps what was decoded (and preprocessed),
// before the transform: a random augmentation draws anew each epoch. It runs on several
// threads at once; what it throws fails the epoch as a DataError naming the column and row
// group.
//
// Preprocess: a Column's preprocess is the fixed part (normalising, as tf.data's map before
// its cache): it runs once on each row group as decoded, before the cache, so the cache
// keeps - and every later epoch gathers - its output; it must keep the dtype and shape (it
// may work in place: the tensor is its own) and be row-wise too. The order: decode,
// preprocess, cache, gather the epoch's rows, transform.
//
// Threads: `threads` decoding threads per Reader, named "dtrain-data", run thread_nice
// (default 10) steps below the thread that calls next(): the training loop's threads get
// the CPU first and decoding takes what they leave (on a machine with as many busy ranks as
// cores the prefetch window absorbs the wait; when the loop does wait for a batch, it sleeps
// and decoding gets the core). 0 keeps the caller's priority.
//
// Errors, each ONE exception naming the file (and column) and never a crash or a short epoch:
// DataError at construction for a column missing from a file, a type that does not convert, a
// list whose fixed size does not fit the shape; from next() for a file that cannot be read
// (truncated, corrupt), a null value, a list row of the wrong length. A failed row group read
// fails the epoch: next() rethrows it (it never skips the group). UsageError for bad options
// (batch_size, threads or prefetch < 1, cache_bytes < 0, thread_nice outside 0..19).
// TimeoutError when a row group takes longer than read_timeout to decode.
//
// Thread-safety: one thread uses a Reader; its own threads run inside it. Destroying it (or
// set_epoch) stops them and discards what they prefetched.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/data_table.h"

namespace dtrain::data {

struct Column {
  std::string name;                      // the table's column. REQUIRED
  torch::Dtype dtype = torch::kFloat32;  // Default: float32
  std::vector<int64_t> shape;            // per row. Default: {} (one value per row)
  std::string key;                       // key in the Batch. Default: name
  // Run on the decoding threads once per decoded row group, before the cache (see
  // Preprocess): the same dtype and shape out, fixed work only. Default: none
  std::function<torch::Tensor(const torch::Tensor&)> preprocess;
  // Run on the decoding threads on every epoch's rows, after the cache (see Transforms):
  // [rows, shape...] of `dtype` in, the batch's tensor for these rows out. Default: none
  std::function<torch::Tensor(const torch::Tensor&)> transform;
};

struct ReaderOptions {
  std::vector<Column> columns;  // REQUIRED (at least one)
  int64_t batch_size = 64;      // rows per rank per step. Default: 64
  // Ranks reading the table and this rank. Default: the default group's, else WORLD_SIZE and
  // RANK from the environment, else 1 and 0 (as DistributedSampler).
  std::optional<int> num_replicas;
  std::optional<int> rank;
  bool shuffle = true;     // row groups and the rows in them. Default: true
  uint64_t seed = 0;       // Default: 0. Must be the same on every rank.
  bool drop_last = false;  // Distributed mode only (see above). Default: false
  bool elastic = false;    // Elastic mode (see above). Default: false
  int threads = 2;         // decoding threads. Default: 2
  int prefetch = 4;        // decoded row groups queued ahead. Default: 4
  // Decoded row groups kept in memory for later epochs (see Cache): bytes per Reader.
  // Default: 256 MiB; 0: none.
  int64_t cache_bytes = int64_t{256} << 20;
  // Share the cache with the host's other ranks through /dev/shm (see Cache). Default: on
  // when the launcher says this host runs several ranks (LOCAL_WORLD_SIZE > 1).
  std::optional<bool> share_cache;
  // Added to the decoding threads' nice value (0-19; see Threads). Default: 10
  int thread_nice = 10;
  // Longest wait for one row group to be decoded. Default: 10 min.
  std::chrono::milliseconds read_timeout{std::chrono::minutes(10)};
};

// One step's rows: a tensor per Column, keyed by Column::key.
struct Batch {
  std::map<std::string, torch::Tensor> tensors;
  int64_t rows = 0;  // may be 0 in elastic mode at an epoch's end
  // The tensor of `key`; DataError naming the keys there are if it is missing.
  const torch::Tensor& at(const std::string& key) const;
};

class Reader {
 public:
  // Checks every column against every file's schema (DataError). Starts no thread yet.
  Reader(Table table, ReaderOptions options);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  Reader(Reader&&) noexcept;  // a moved-from Reader may only be destroyed or assigned to
  Reader& operator=(Reader&&) noexcept;

  // Starts `epoch` from its beginning (and stops a previous epoch's prefetching). Call it
  // before each epoch, as with DistributedSampler; without it next() reads epoch 0.
  void set_epoch(int64_t epoch);
  int64_t epoch() const;

  // This rank's next batch; nullopt once the epoch's steps are done (on every rank at the same
  // step). Throws what a decoding thread hit (see Errors).
  std::optional<Batch> next();

  // Steps (batches) per rank in the current epoch: the same on every rank. In elastic mode
  // after restore(), the steps left from the restored position.
  int64_t steps_per_epoch() const;
  // Rows this rank reads in the current epoch (distributed mode: equal on every rank).
  int64_t num_samples() const;
  // Steps taken in the current epoch.
  int64_t step() const;

  // Elastic mode: the position after the steps taken so far (every rank gets the same string
  // after the same steps): the epoch, the rows not yet read, and what identifies the data read
  // (Delta: the version and the table's metaData id; both: a digest of the files - Delta: their
  // paths and deletion vectors; Parquet: their paths, sizes and footers). UsageError in
  // distributed mode.
  std::string position() const;
  // Elastic mode: continue from `position` (taken by a job of any world size over the same
  // data): the rows it names are dealt to this job's ranks. DataError if it was taken on other
  // data - another table, another Delta version whose files or deletion vectors differ (the
  // message names both versions: open the position's with TableOptions::version), Parquet
  // files added, removed or rewritten since - or on row counts that differ, or is malformed.
  // A position written before dtrain recorded the data (no "table" field) is checked by its
  // row counts only.
  void restore(const std::string& position);

  const Table& table() const;
  const ReaderOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::data
