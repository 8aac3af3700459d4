// Parquet files through Arrow C++: footers, which columns a Reader takes and how they become
// tensors, and decoding one row group. Every failure is a DataError naming the file (and the
// column and row group).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/table_state.h"
#include "dtrain/data_reader.h"

namespace parquet::arrow {
class FileReader;
}

namespace dtrain::data::detail {

// The footer and schema of `path` (DataError if it is not a readable Parquet file).
FileState read_footer(const std::string& path);

// An Arrow reader of `path` (its footer given, when known).
std::unique_ptr<parquet::arrow::FileReader> open_reader(
    const std::string& path, std::shared_ptr<parquet::FileMetaData> metadata = nullptr);

// How one requested Column is read from one file.
struct ColumnSource {
  int field = -1;               // top-level field index in the file's schema; -1: partition
  int64_t values_per_row = 1;   // product of the shape
  std::string partition_value;  // partition columns: the value of this file
  std::string partition_type;   // ... and its Delta type
};

// A column the direct path reads (parquet_file.cpp): its leaf in the Parquet schema, levels
// and the dtype of its physical values.
struct DirectLeaf {
  int column = -1;
  int16_t max_def = 0;
  int16_t max_rep = 0;
  torch::Dtype dtype = torch::kFloat;
};

// Checks `column` against file `f` (exists, converts, fits the shape). DataError otherwise.
ColumnSource resolve_column(const TableState& table, int f, const Column& column);

// Rows of row group `group` of file `f`: order[begin, end) (a permutation of the group's
// rows), or rows [begin, end) when order is empty. One tensor per column, [end - begin,
// shape...], in the column's dtype, owning its memory - or, given `into` (tensors of that
// shape and dtype), written into them and returned.
class FileDecoder {
 public:
  FileDecoder(const TableState& table, const std::vector<Column>& columns);
  ~FileDecoder();
  std::vector<torch::Tensor> decode(int f, int group, int64_t begin, int64_t end,
                                    const std::vector<int64_t>& order,
                                    const std::vector<torch::Tensor>* into = nullptr);

 private:
  const TableState& table_;
  const std::vector<Column>& columns_;
  int open_file_ = -1;
  std::unique_ptr<parquet::arrow::FileReader> reader_;
  std::vector<ColumnSource> sources_;
  bool direct_enabled_;                            // DTRAIN_DATA_DIRECT
  std::vector<std::optional<DirectLeaf>> direct_;  // per column, where the direct path applies
  std::vector<torch::Tensor> scratch_;             // per column, the direct path's buffer
};

}  // namespace dtrain::data::detail
