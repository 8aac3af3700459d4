// What Table::open() found (dtrain/data_table.h): the files with their footers and schemas.
#pragma once

#include <arrow/type_fwd.h>
#include <parquet/metadata.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dtrain/data_table.h"

namespace dtrain::data::detail {

struct FileState {
  std::string path;
  std::shared_ptr<parquet::FileMetaData> metadata;
  std::shared_ptr<arrow::Schema> schema;                // the file's columns as Arrow reads them
  std::map<std::string, std::string> partition_values;  // Delta: column -> value ("" = null)
  // Delta deletion vector: its uniqueId ("" without one) and, per row group of the file, the
  // positions in the group (sorted) it deletes; empty when nothing is deleted from the file.
  // The file's RowGroups count only the rows left; decoding skips these (parquet_file.h).
  std::string deletion_vector_id;
  std::vector<std::vector<int64_t>> deleted;
};

struct TableState {
  TableFormat format = TableFormat::kParquet;
  std::string root;
  std::vector<std::string> paths;
  std::vector<FileState> files;
  std::vector<RowGroup> row_groups;
  int64_t num_rows = 0;
  std::optional<int64_t> version;
  std::string table_id;  // Delta: metaData.id ("" when the log gives none)
  // What identifies the rows read, for elastic positions (Reader::position): a 64-bit FNV-1a
  // in hex over each file's path relative to root and - Delta - its deletion vector's
  // uniqueId (Delta's files are never rewritten in place) or - Parquet - its size and footer.
  std::string digest;
  // Delta: partition columns and their Delta type names ("integer", "double", "string", ...).
  std::map<std::string, std::string> partition_types;
  // Delta: top-level columns that are or hold a variant (refused when asked for).
  std::set<std::string> variant_columns;
};

}  // namespace dtrain::data::detail
