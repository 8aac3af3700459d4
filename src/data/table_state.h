// What Table::open() found (dtrain/data_table.h): the files with their footers and schemas.
#pragma once

#include <arrow/type_fwd.h>
#include <parquet/metadata.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/data_table.h"

namespace dtrain::data::detail {

struct FileState {
  std::string path;
  std::shared_ptr<parquet::FileMetaData> metadata;
  std::shared_ptr<arrow::Schema> schema;                // the file's columns as Arrow reads them
  std::map<std::string, std::string> partition_values;  // Delta: column -> value ("" = null)
};

struct TableState {
  TableFormat format = TableFormat::kParquet;
  std::string root;
  std::vector<std::string> paths;
  std::vector<FileState> files;
  std::vector<RowGroup> row_groups;
  int64_t num_rows = 0;
  std::optional<int64_t> version;
  // Delta: partition columns and their Delta type names ("integer", "double", "string", ...).
  std::map<std::string, std::string> partition_types;
};

}  // namespace dtrain::data::detail
