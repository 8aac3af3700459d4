#include "data/parquet_file.h"

#include <arrow/api.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>

#include <limits>
#include <numeric>
#include <set>
#include <sstream>

namespace dtrain::data::detail {

namespace {

std::string not_readable(const std::string& path, const std::string& why) {
  return "data: " + path + " is not a readable Parquet file (" + why +
         "): it is truncated or corrupt, or not Parquet. Rewrite it, or remove it from the "
         "table's directory";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool is_scalar(arrow::Type::type id) {
  return arrow::is_integer(id) || arrow::is_floating(id) || id == arrow::Type::BOOL;
}

// Arrow's scalar types whose values torch holds as they are.
std::optional<torch::Dtype> same_layout(arrow::Type::type id) {
  switch (id) {
    case arrow::Type::INT8:
      return torch::kChar;
    case arrow::Type::UINT8:
      return torch::kByte;
    case arrow::Type::INT16:
      return torch::kShort;
    case arrow::Type::INT32:
      return torch::kInt;
    case arrow::Type::INT64:
      return torch::kLong;
    case arrow::Type::HALF_FLOAT:
      return torch::kHalf;
    case arrow::Type::FLOAT:
      return torch::kFloat;
    case arrow::Type::DOUBLE:
      return torch::kDouble;
    default:
      return std::nullopt;
  }
}

// Where a value is, for error messages.
struct Place {
  const std::string& file;
  const std::string& column;
  int group;
};

std::string where(const Place& p) {
  return "column '" + p.column + "' of " + p.file + " (row group " + std::to_string(p.group) + ")";
}

// values[offset, offset + length) of a scalar-typed array as a 1-D tensor in the values' own
// dtype, or int64/bool where torch has none. `borrowed`: set when the tensor is a view of
// Arrow's buffer (valid only while the array lives), left alone otherwise.
torch::Tensor scalar_values(const arrow::Array& values, int64_t offset, int64_t length,
                            const Place& at, bool& borrowed) {
  if (values.null_count() > 0) {
    int64_t nulls = 0;
    for (int64_t i = offset; i < offset + length; ++i) nulls += values.IsNull(i);
    if (nulls > 0) {
      throw DataError("data: " + where(at) + " has " + std::to_string(nulls) +
                      " null values: dtrain::data needs a value in every row (fill or drop them "
                      "before writing the table)");
    }
  }
  const auto id = values.type_id();
  if (auto src = same_layout(id)) {
    const int width = values.type()->byte_width();
    const auto* base = values.data()->buffers[1]->data() + (values.offset() + offset) * width;
    borrowed = true;
    return torch::from_blob(const_cast<uint8_t*>(base), {length}, *src);
  }
  auto out = torch::empty({length}, torch::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  switch (id) {
    case arrow::Type::BOOL: {
      const auto& b = static_cast<const arrow::BooleanArray&>(values);
      auto bools = torch::empty({length}, torch::kBool);
      bool* p = bools.data_ptr<bool>();
      for (int64_t i = 0; i < length; ++i) p[i] = b.Value(offset + i);
      return bools;
    }
    case arrow::Type::UINT16: {
      const auto& a = static_cast<const arrow::UInt16Array&>(values);
      for (int64_t i = 0; i < length; ++i) o[i] = a.Value(offset + i);
      break;
    }
    case arrow::Type::UINT32: {
      const auto& a = static_cast<const arrow::UInt32Array&>(values);
      for (int64_t i = 0; i < length; ++i) o[i] = a.Value(offset + i);
      break;
    }
    case arrow::Type::UINT64: {
      const auto& a = static_cast<const arrow::UInt64Array&>(values);
      for (int64_t i = 0; i < length; ++i) {
        const uint64_t v = a.Value(offset + i);
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          throw DataError("data: " + where(at) + " holds the uint64 value " + std::to_string(v) +
                          ", which no torch dtype holds");
        }
        o[i] = static_cast<int64_t>(v);
      }
      break;
    }
    default:
      throw DataError("data: " + where(at) + " has values of type " + values.type()->ToString() +
                      ", which do not convert to a tensor");
  }
  return out;
}

template <typename ListArray>
torch::Tensor variable_list(const ListArray& list, int64_t per, const Place& at,
                            const std::vector<int64_t>& shape, bool& borrowed) {
  for (int64_t i = 0; i < list.length(); ++i) {
    if (list.IsNull(i)) {
      throw DataError("data: " + where(at) + " row " + std::to_string(i) +
                      " is null: every row needs a list of " + std::to_string(per) + " values");
    }
    if (list.value_length(i) != per) {
      throw DataError("data: " + where(at) + " row " + std::to_string(i) + " has " +
                      std::to_string(list.value_length(i)) + " values; the shape " +
                      shape_str(shape) + " needs " + std::to_string(per));
    }
  }
  const int64_t begin = list.length() ? list.value_offset(0) : 0;
  return scalar_values(*list.values(), begin, list.length() * per, at, borrowed);
}

torch::Tensor chunk_to_tensor(const arrow::Array& chunk, const ColumnSource& src,
                              const Column& column, const Place& at, bool& borrowed) {
  const auto id = chunk.type_id();
  if (is_scalar(id)) return scalar_values(chunk, 0, chunk.length(), at, borrowed);
  if (id == arrow::Type::LIST)
    return variable_list(static_cast<const arrow::ListArray&>(chunk), src.values_per_row, at,
                         column.shape, borrowed);
  if (id == arrow::Type::LARGE_LIST)
    return variable_list(static_cast<const arrow::LargeListArray&>(chunk), src.values_per_row, at,
                         column.shape, borrowed);
  if (id == arrow::Type::FIXED_SIZE_LIST) {
    const auto& list = static_cast<const arrow::FixedSizeListArray&>(chunk);
    if (list.null_count() > 0) {
      throw DataError("data: " + where(at) + " has " + std::to_string(list.null_count()) +
                      " null rows: every row needs its list of values");
    }
    const int64_t begin = list.length() ? list.value_offset(0) : 0;
    return scalar_values(*list.values(), begin, list.length() * src.values_per_row, at, borrowed);
  }
  throw DataError("data: " + where(at) + " has the type " + chunk.type()->ToString() +
                  ", which does not convert to a tensor");
}

int64_t product(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

std::string column_names(const arrow::Schema& schema, const TableState& table) {
  std::string s;
  for (const auto& f : schema.fields()) s += (s.empty() ? "" : ", ") + f->name();
  for (const auto& [name, type] : table.partition_types)
    s += (s.empty() ? "" : ", ") + name + " (partition)";
  return s;
}

}  // namespace

std::unique_ptr<parquet::arrow::FileReader> open_reader(
    const std::string& path, std::shared_ptr<parquet::FileMetaData> metadata) {
  try {
    parquet::arrow::FileReaderBuilder builder;
    PARQUET_THROW_NOT_OK(
        builder.OpenFile(path, false, parquet::default_reader_properties(), std::move(metadata)));
    std::unique_ptr<parquet::arrow::FileReader> reader;
    PARQUET_THROW_NOT_OK(builder.memory_pool(arrow::default_memory_pool())->Build(&reader));
    return reader;
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& e) {
    throw DataError(not_readable(path, e.what()));
  }
}

FileState read_footer(const std::string& path) {
  FileState f;
  f.path = path;
  auto reader = open_reader(path);
  f.metadata = reader->parquet_reader()->metadata();
  try {
    PARQUET_THROW_NOT_OK(reader->GetSchema(&f.schema));
  } catch (const std::exception& e) {
    throw DataError(not_readable(path, e.what()));
  }
  return f;
}

ColumnSource resolve_column(const TableState& table, int f, const Column& column) {
  const FileState& file = table.files[static_cast<size_t>(f)];
  ColumnSource src;
  src.values_per_row = product(column.shape);
  if (column.name.empty()) throw UsageError("data: a Column has no name");
  if (src.values_per_row < 1)
    throw UsageError("data: column '" + column.name + "' has the shape " + shape_str(column.shape) +
                     " of no values");
  if (!torch::isFloatingType(column.dtype) && !torch::isIntegralType(column.dtype, true))
    throw UsageError("data: column '" + column.name + "' asks for a dtype that is not numeric");
  const int idx = file.schema->GetFieldIndex(column.name);
  if (idx < 0) {
    auto part = table.partition_types.find(column.name);
    if (part == table.partition_types.end()) {
      throw DataError("data: column '" + column.name + "' is missing from " + file.path +
                      " (its columns: " + column_names(*file.schema, table) +
                      "): fix the Column's name, or rewrite the file with it");
    }
    static const std::set<std::string> numeric = {"byte",  "short",  "integer", "long",
                                                  "float", "double", "boolean"};
    if (!numeric.count(part->second) || src.values_per_row != 1) {
      throw DataError("data: column '" + column.name + "' of " + file.path +
                      " is a partition column of type " + part->second +
                      ", which does not convert to a tensor of shape " + shape_str(column.shape));
    }
    src.partition_type = part->second;
    auto value = file.partition_values.find(column.name);
    src.partition_value = value == file.partition_values.end() ? "" : value->second;
    if (src.partition_value.empty()) {
      throw DataError("data: column '" + column.name + "' (a partition column) is null for " +
                      file.path + ": every row needs a value");
    }
    return src;
  }
  src.field = idx;
  const auto& type = file.schema->field(idx)->type();
  const auto id = type->id();
  std::string problem;
  if (is_scalar(id)) {
    if (src.values_per_row != 1)
      problem = "holds one " + type->ToString() + " per row, not the " +
                std::to_string(src.values_per_row) + " values of the shape " +
                shape_str(column.shape);
  } else if (id == arrow::Type::LIST || id == arrow::Type::LARGE_LIST ||
             id == arrow::Type::FIXED_SIZE_LIST) {
    const auto& value_type = *static_cast<const arrow::BaseListType&>(*type).value_type();
    if (!is_scalar(value_type.id())) {
      problem = "is a list of " + value_type.ToString() +
                " (a list of numbers converts; nested lists and strings do not)";
    } else if (id == arrow::Type::FIXED_SIZE_LIST &&
               static_cast<const arrow::FixedSizeListType&>(*type).list_size() !=
                   src.values_per_row) {
      problem = "holds " +
                std::to_string(static_cast<const arrow::FixedSizeListType&>(*type).list_size()) +
                " values per row, but the shape " + shape_str(column.shape) + " needs " +
                std::to_string(src.values_per_row);
    }
  } else {
    problem = "has the type " + type->ToString() +
              ", which does not convert to a tensor (numbers and lists of numbers do)";
  }
  if (!problem.empty())
    throw DataError("data: column '" + column.name + "' of " + file.path + " " + problem);
  return src;
}

FileDecoder::FileDecoder(const TableState& table, const std::vector<Column>& columns)
    : table_(table), columns_(columns) {}

FileDecoder::~FileDecoder() = default;

std::vector<torch::Tensor> FileDecoder::decode(int f, int group, int64_t begin, int64_t end,
                                               const std::vector<int64_t>& order) {
  const FileState& file = table_.files[static_cast<size_t>(f)];
  if (f != open_file_) {
    reader_.reset();
    open_file_ = -1;
    sources_.clear();
    for (const auto& c : columns_) sources_.push_back(resolve_column(table_, f, c));
    reader_ = open_reader(file.path, file.metadata);
    open_file_ = f;
  }
  const int64_t rows = file.metadata->RowGroup(group)->num_rows();
  DTRAIN_ASSERT(0 <= begin && begin <= end && end <= rows, "rows outside the row group");
  // The rows to take, when not a plain range: order[begin, end).
  torch::Tensor pick;
  if (!order.empty()) {
    pick =
        torch::from_blob(const_cast<int64_t*>(order.data()) + begin, {end - begin}, torch::kLong);
  }
  std::vector<torch::Tensor> out;
  for (size_t c = 0; c < columns_.size(); ++c) {
    const Column& column = columns_[c];
    const ColumnSource& src = sources_[c];
    std::vector<int64_t> shape{end - begin};
    if (src.values_per_row != 1 || !column.shape.empty())
      shape.insert(shape.end(), column.shape.begin(), column.shape.end());
    if (src.field < 0) {
      const std::string& v = src.partition_value;
      double value = 0;
      try {
        value = src.partition_type == "boolean" ? (v == "true" ? 1.0 : 0.0) : std::stod(v);
      } catch (const std::exception&) {
        throw DataError("data: column '" + column.name + "' (a partition column) of " + file.path +
                        " has the value '" + v + "', which is not a number");
      }
      out.push_back(torch::full(shape, value, torch::TensorOptions().dtype(column.dtype)));
      continue;
    }
    Place at{file.path, column.name, group};
    std::shared_ptr<arrow::ChunkedArray> array;
    try {
      PARQUET_THROW_NOT_OK(reader_->RowGroup(group)->Column(src.field)->Read(&array));
    } catch (const std::exception& e) {
      // A reader that failed half way may hold state about the file: open it again next time.
      open_file_ = -1;
      throw DataError("data: cannot read " + where(at) + ": " + e.what() +
                      ". The file is truncated or corrupt: rewrite it, or remove it from the "
                      "table's directory");
    }
    std::vector<torch::Tensor> parts;
    bool borrowed = false;
    for (const auto& chunk : array->chunks())
      if (chunk->length() > 0) parts.push_back(chunk_to_tensor(*chunk, src, column, at, borrowed));
    torch::Tensor t = parts.empty() ? torch::empty({0}, torch::TensorOptions().dtype(column.dtype))
                      : parts.size() == 1 ? parts[0]
                                          : torch::cat(parts);
    if (t.numel() != rows * src.values_per_row) {
      throw DataError("data: " + where(at) + " has " + std::to_string(t.numel()) +
                      " values where the footer's " + std::to_string(rows) + " rows need " +
                      std::to_string(rows * src.values_per_row) + ": the file is corrupt");
    }
    shape[0] = rows;
    t = t.view(shape);
    // Select the rows first, convert after: one pass over the piece's values, in their own
    // (often narrower) dtype. A view into Arrow's buffers must be copied before they go.
    const bool view_of_arrow = borrowed && parts.size() == 1;
    if (pick.defined()) {
      t = t.index_select(0, pick).to(column.dtype);
    } else {
      t = t.narrow(0, begin, end - begin).to(column.dtype, false, view_of_arrow);
    }
    out.push_back(t);
  }
  return out;
}

}  // namespace dtrain::data::detail
