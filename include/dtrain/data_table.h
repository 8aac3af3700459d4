// dtrain::data::Table: a snapshot of a table on disk - a directory of Parquet files, or a Delta
// Lake table at one version - as the list of its row groups, the unit dtrain::data::Reader
// splits across ranks.
//
//   auto table = dtrain::data::Table::open("delta:/data/fashion");        // newest version
//   auto old = dtrain::data::Table::open("delta:/data/fashion", {.version = 3});
//   auto files = dtrain::data::Table::open("parquet:/data/fashion_parquet");
//   std::printf("%lld rows in %zu row groups\n", table.num_rows(), table.row_groups().size());
//
// Locations: "parquet:DIR" (every *.parquet file under DIR, recursively, in path order; files
// and directories whose names start with '_' or '.' are skipped, as Spark and pyarrow do),
// "delta:DIR" (the Delta table at DIR), "parquet:FILE" (one file), or a bare path: a Delta
// table when DIR/_delta_log exists, else Parquet. Local paths only ("file:" URIs accepted).
//
// Delta: the snapshot is rebuilt from DIR/_delta_log as the Delta protocol says: the newest
// complete checkpoint (classic single- or multi-part Parquet, V1 or V2 spec) at or before the
// version, then each JSON commit after it in order, applying add and remove actions by logical
// file (path and deletion vector). A missing commit in that range, a version beyond the log's
// newest, or one older than what the log still holds is an error naming the file. Column
// mapping (by name or by id) is read: columns keep the table's own names. Deletion vectors are
// applied: the rows they delete are not in the table (RowGroup::rows, num_rows() and every
// Reader count only the rows left), and a vector that is missing, truncated, fails its
// checksum, is not a deletion vector or deletes more rows than its file has is an error naming
// the file. Variant columns (readerFeatures variantType) are tolerated; a Reader refuses to
// read one. A checkpoint whose file actions are in sidecar files, and reader features dtrain
// does not implement (catalogManaged, ...), are refused with the reason, never read wrongly.
// Partition columns (metaData.partitionColumns) are columns of every row, with the value of
// the row's file.
//
// Every file's footer is read at open() (row groups, schema); data are read by the Reader.
// Errors: dtrain::data::DataError (a UsageError) naming the file and what is wrong.
// Thread-safety: a Table is immutable after open(); copies share it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/error.h"

namespace dtrain::data {

// Bad input: a missing or unreadable file, a corrupt Parquet file, a column that is missing
// or does not convert, a Delta log that cannot be replayed. The message names the file (and
// the column) and what to do.
class DataError : public UsageError {
 public:
  using UsageError::UsageError;
};

enum class TableFormat {
  kAuto,     // "delta:" / "parquet:" prefix, else Delta when DIR/_delta_log exists
  kParquet,  // a file or a directory of Parquet files
  kDelta,    // a Delta Lake table
};

struct TableOptions {
  TableFormat format = TableFormat::kAuto;  // Default: kAuto (the location's prefix decides)
  // Delta only: the version to read (time travel). Default: the newest.
  std::optional<int64_t> version;
};

// One row group of one file.
struct RowGroup {
  int file = 0;         // index into Table::files()
  int index = 0;        // row group index in that file
  int64_t rows = 0;     // rows in it that are read: a Delta deletion vector's rows not counted
  int64_t first = 0;    // global row number of its first row (row groups in table order)
  int64_t deleted = 0;  // rows a Delta deletion vector deletes from it (in the file, not read)
};

// A column of the table: its name and Arrow's name of its type ("float", "list<item: float>").
struct ColumnInfo {
  std::string name;
  std::string type;
  bool partition = false;  // a Delta partition column (its value comes from the log)
};

namespace detail {
struct TableState;
}

class Table {
 public:
  // Throws DataError (see above).
  static Table open(const std::string& location, TableOptions options = {});

  TableFormat format() const;  // kParquet or kDelta
  const std::string& root() const;
  // Absolute paths of the data files, in table order (Delta: the snapshot's files by path).
  const std::vector<std::string>& files() const;
  const std::vector<RowGroup>& row_groups() const;
  int64_t num_rows() const;
  // The first file's columns (all files must have the requested ones: Reader checks).
  std::vector<ColumnInfo> columns() const;
  // Delta: the version read; nullopt for Parquet.
  std::optional<int64_t> version() const;
  // Delta: the partition values of file i ("" for a null value); empty for Parquet.
  const std::map<std::string, std::string>& partition_values(int file) const;

  // For the Reader (src/data/).
  const detail::TableState& state() const { return *state_; }

 private:
  explicit Table(std::shared_ptr<const detail::TableState> state) : state_(std::move(state)) {}
  std::shared_ptr<const detail::TableState> state_;
};

}  // namespace dtrain::data
