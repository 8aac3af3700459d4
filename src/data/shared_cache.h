// Decoded row groups shared by the Readers of one host (ReaderOptions::share_cache): a row
// group one rank decoded is a file in /dev/shm that the host's other ranks map read-only, so
// a host decodes each row group once and holds one copy of it, however many ranks read it.
//
// Entries are named <dir>/dtrain-data-<uid>-<key>-<group>, the key a hash of what decides the
// decoded values: the table's root, version and files (path, size, modification time, Delta
// deletion vector) and the columns (name, dtype, shape). Two Readers with the same key decode
// the same bytes, so any Reader may use any entry, even one a finished job left - except
// where a column has a preprocess (a function, which cannot be compared): then the key holds
// the job's rendezvous address and run id too, and only the job's own ranks share. An entry is
// written under a temporary name and renamed when complete, and checked when mapped (format,
// rows, dtypes, sizes): a reader sees a whole entry or none, and one that does not check out
// is decoded.
//
// Clean-up (core/shared_files.h): every Reader holds a shared lock on <prefix>.lock; the last
// one to let go (it gets the lock exclusively) removes the entries, their temporary files and
// the lock file, and `dtrain run` sweeps what no one holds once its workers are gone (ranks
// that were killed or aborted). Mappings outlive the removal, so a Reader still holding one
// keeps it. A Reader that cannot take the shared lock (one is removing) shares nothing and
// caches privately.
//
// Thread-safety: every member may be called from any thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/table_state.h"
#include "dtrain/data_reader.h"

namespace dtrain::data::detail {

class SharedEntries {
 public:
  using Entry = std::shared_ptr<const std::vector<torch::Tensor>>;

  // The host's shared entries for these columns of this table, under `dir`; nullptr when
  // they cannot be shared (no such directory, the lock is being removed).
  static std::unique_ptr<SharedEntries> open(const TableState& table,
                                             const std::vector<Column>& columns,
                                             const std::string& dir);
  ~SharedEntries();
  SharedEntries(const SharedEntries&) = delete;
  SharedEntries& operator=(const SharedEntries&) = delete;

  // Row group `group`'s entry mapped read-only (tensors [rows, shape...] per column), or
  // nullptr when there is none or it does not check out.
  Entry find(int64_t group) const;
  // Row group `group`'s entry being made: `tensors` lie in a new file's memory (allocated
  // whole up front, so a full directory is an error here, never a fault later); decode into
  // them, then commit() puts the file in place for the host's other Readers and returns the
  // entry. Dropped uncommitted, the file goes.
  class Draft {
   public:
    ~Draft();
    std::vector<torch::Tensor> tensors;
    // nullptr when the file cannot be put in place (the tensors stay valid: keep them).
    Entry commit();

   private:
    friend class SharedEntries;
    std::string temp_, final_;
    bool committed_ = false;
  };
  // nullptr when no file can be made (the directory is full: decode privately).
  std::unique_ptr<Draft> draft(int64_t group) const;

  const std::string& prefix() const { return prefix_; }

 private:
  SharedEntries(std::string prefix, int lock_fd, std::vector<Column> columns,
                std::vector<int64_t> rows);
  std::string entry_path(int64_t group) const;

  const std::string prefix_;  // <dir>/dtrain-data-<uid>-<key>
  const int lock_fd_;
  const std::vector<Column> columns_;
  const std::vector<int64_t> rows_;  // per row group
};

}  // namespace dtrain::data::detail
