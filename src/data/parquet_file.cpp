#include "data/parquet_file.h"

#include <arrow/api.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/column_reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>

#include <limits>
#include <numeric>
#include <set>
#include <sstream>

#include "core/params.h"

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

// The direct path: a column of numbers, or of lists of numbers, read with Parquet's own column
// reader straight into a tensor - half the time of Arrow's column read (1.4x the whole reader's
// samples/s), which assembles list arrays (offsets, validity) that dtrain would only check and
// drop. It covers the common case only: the values' physical type is the tensor's (INT32 holding
// 8-32 bit signed or 8-16 bit unsigned integers, INT64 holding signed ones, FLOAT, DOUBLE), no
// nulls, and, for lists, every row exactly `values_per_row` long. Anything else - other types, a
// null, a row of another length, a corrupt page - returns an undefined tensor and the column goes
// Arrow's way, which also says what is wrong.
std::optional<DirectLeaf> direct_leaf(const parquet::arrow::FileReader& reader,
                                      const arrow::Schema& schema, int field) {
  const auto& fields = reader.manifest().schema_fields;
  if (field < 0 || static_cast<size_t>(field) >= fields.size()) return std::nullopt;
  const parquet::arrow::SchemaField* node = &fields[static_cast<size_t>(field)];
  auto type_id = schema.field(field)->type()->id();
  const bool list = type_id == arrow::Type::LIST || type_id == arrow::Type::LARGE_LIST ||
                    type_id == arrow::Type::FIXED_SIZE_LIST;
  if (list) {
    if (node->children.size() != 1) return std::nullopt;
    type_id =
        static_cast<const arrow::BaseListType&>(*schema.field(field)->type()).value_type()->id();
    node = &node->children[0];
  }
  if (node->column_index < 0 || !node->children.empty()) return std::nullopt;
  const parquet::ColumnDescriptor* descr =
      reader.parquet_reader()->metadata()->schema()->Column(node->column_index);
  if (descr->max_repetition_level() != (list ? 1 : 0)) return std::nullopt;
  const auto& logical = *descr->logical_type();
  const bool plain_int = logical.is_none() || logical.is_int();
  const auto* as_int =
      logical.is_int() ? static_cast<const parquet::IntLogicalType*>(&logical) : nullptr;
  std::optional<torch::Dtype> dtype;
  switch (descr->physical_type()) {
    case parquet::Type::INT32:
      if (plain_int && (!as_int || as_int->is_signed() || as_int->bit_width() <= 16) &&
          (type_id == arrow::Type::INT8 || type_id == arrow::Type::INT16 ||
           type_id == arrow::Type::INT32 || type_id == arrow::Type::UINT8 ||
           type_id == arrow::Type::UINT16))
        dtype = torch::kInt;
      break;
    case parquet::Type::INT64:
      if (plain_int && (!as_int || as_int->is_signed()) && type_id == arrow::Type::INT64)
        dtype = torch::kLong;
      break;
    case parquet::Type::FLOAT:
      if (logical.is_none() && type_id == arrow::Type::FLOAT) dtype = torch::kFloat;
      break;
    case parquet::Type::DOUBLE:
      if (logical.is_none() && type_id == arrow::Type::DOUBLE) dtype = torch::kDouble;
      break;
    default:
      break;
  }
  if (!dtype) return std::nullopt;
  return DirectLeaf{node->column_index, descr->max_definition_level(),
                    descr->max_repetition_level(), *dtype};
}

template <typename Reader, typename Value>
bool read_values(Reader& reader, const DirectLeaf& leaf, int64_t want, int64_t per, Value* out) {
  constexpr int64_t kChunk = 1 << 16;  // levels per call
  std::vector<int16_t> def(leaf.max_def > 0 ? kChunk : 0);
  std::vector<int16_t> rep(leaf.max_rep > 0 ? kChunk : 0);
  int64_t got = 0;
  int64_t in_row = 0;  // values of the current row so far
  while (reader.HasNext()) {
    if (got == want) return false;  // more values than the footer's rows hold
    int64_t values = 0;
    const int64_t levels =
        reader.ReadBatch(std::min(kChunk, want - got), leaf.max_def > 0 ? def.data() : nullptr,
                         leaf.max_rep > 0 ? rep.data() : nullptr, out + got, &values);
    // A level without a value is a null or an empty list.
    if (levels <= 0 || values != levels) return false;
    if (leaf.max_rep > 0) {
      // Each row is `per` levels long, so rows start (repetition level 0) at every per-th
      // level and nowhere else: as many zeros as row starts, and a zero at each of them.
      int64_t zeros = 0;
      for (int64_t i = 0; i < levels; ++i) zeros += rep[static_cast<size_t>(i)] == 0;
      int64_t starts = 0;
      for (int64_t i = (per - in_row) % per; i < levels; i += per, ++starts)
        if (rep[static_cast<size_t>(i)] != 0) return false;
      if (zeros != starts) return false;
      in_row = (in_row + levels) % per;
    }
    got += values;
  }
  return got == want && in_row == 0;
}

// Row group `group`'s values of `leaf`, flat ([rows * per]), or an undefined tensor where the
// direct path does not apply (see above). The values land in `scratch` (grown as needed), which
// is reused while nothing else holds its memory: fresh pages for every row group cost more
// than the decoding (page faults and zeroing, measured with perf).
torch::Tensor read_direct(parquet::ParquetFileReader& file, int group, const DirectLeaf& leaf,
                          int64_t rows, int64_t per, torch::Tensor& scratch) {
  try {
    auto column = file.RowGroup(group)->Column(leaf.column);
    if (!scratch.defined() || scratch.storage().use_count() != 1 ||
        scratch.scalar_type() != leaf.dtype || scratch.numel() < rows * per)
      scratch = torch::empty({rows * per}, leaf.dtype);
    torch::Tensor out = scratch.narrow(0, 0, rows * per);
    bool ok = false;
    switch (leaf.dtype) {
      case torch::kInt:
        ok = read_values(static_cast<parquet::Int32Reader&>(*column), leaf, rows * per, per,
                         out.data_ptr<int32_t>());
        break;
      case torch::kLong:
        ok = read_values(static_cast<parquet::Int64Reader&>(*column), leaf, rows * per, per,
                         out.data_ptr<int64_t>());
        break;
      case torch::kFloat:
        ok = read_values(static_cast<parquet::FloatReader&>(*column), leaf, rows * per, per,
                         out.data_ptr<float>());
        break;
      case torch::kDouble:
        ok = read_values(static_cast<parquet::DoubleReader&>(*column), leaf, rows * per, per,
                         out.data_ptr<double>());
        break;
      default:
        break;
    }
    return ok ? out : torch::Tensor();
  } catch (const std::exception&) {
    return torch::Tensor();  // Arrow's path reads it again and names the problem
  }
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

// Row group `group`'s values of the column through Arrow (any type resolve_column accepts), flat
// ([rows * values_per_row]); `view_of_arrow` says whether the tensor borrows Arrow's buffers,
// which `array` then keeps alive.
torch::Tensor read_arrow(parquet::arrow::FileReader& reader, int group, const ColumnSource& src,
                         const Column& column, const Place& at, int64_t rows, bool& view_of_arrow,
                         std::shared_ptr<arrow::ChunkedArray>& array) {
  try {
    PARQUET_THROW_NOT_OK(reader.RowGroup(group)->Column(src.field)->Read(&array));
  } catch (const std::exception& e) {
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
  view_of_arrow = borrowed && parts.size() == 1;
  return t;
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
  if (table.variant_columns.count(column.name)) {
    throw DataError("data: column '" + column.name + "' of the Delta table " + table.root +
                    " is (or holds) a variant, semi-structured data that does not convert to a "
                    "tensor: read other columns, or write a copy of the table with the values "
                    "you need as numeric columns");
  }
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
    : table_(table), columns_(columns), direct_enabled_(param::kDataDirect.get()) {}

FileDecoder::~FileDecoder() = default;

std::vector<torch::Tensor> FileDecoder::decode(int f, int group, int64_t begin, int64_t end,
                                               const std::vector<int64_t>& order,
                                               const std::vector<torch::Tensor>* into) {
  const FileState& file = table_.files[static_cast<size_t>(f)];
  if (f != open_file_) {
    reader_.reset();
    open_file_ = -1;
    sources_.clear();
    direct_.clear();
    scratch_.assign(columns_.size(), torch::Tensor());
    for (const auto& c : columns_) sources_.push_back(resolve_column(table_, f, c));
    reader_ = open_reader(file.path, file.metadata);
    for (const auto& src : sources_)
      direct_.push_back(src.field < 0 || !direct_enabled_
                            ? std::nullopt
                            : direct_leaf(*reader_, *file.schema, src.field));
    open_file_ = f;
  }
  const int64_t rows = file.metadata->RowGroup(group)->num_rows();
  // A deletion vector's rows are not in the row group as the plan sees it: its rows
  // [begin, end) and `order` count the rows left, which `live` maps to rows of the file's group.
  const std::vector<int64_t>* deleted =
      file.deleted.empty() || file.deleted[static_cast<size_t>(group)].empty()
          ? nullptr
          : &file.deleted[static_cast<size_t>(group)];
  const int64_t left = rows - (deleted ? static_cast<int64_t>(deleted->size()) : 0);
  DTRAIN_ASSERT(0 <= begin && begin <= end && end <= left, "rows outside the row group");
  // The rows to take, when not a plain range: order[begin, end), through `live`.
  torch::Tensor pick;
  if (!order.empty()) {
    pick =
        torch::from_blob(const_cast<int64_t*>(order.data()) + begin, {end - begin}, torch::kLong);
  }
  if (deleted) {
    torch::Tensor live = torch::empty({left}, torch::kLong);
    int64_t* l = live.data_ptr<int64_t>();
    auto d = deleted->begin();
    for (int64_t r = 0; r < rows; ++r) {
      if (d != deleted->end() && *d == r) {
        ++d;
        continue;
      }
      *l++ = r;
    }
    pick = pick.defined() ? live.index_select(0, pick) : live.narrow(0, begin, end - begin);
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
      out.push_back(into ? (*into)[c].fill_(value)
                         : torch::full(shape, value, torch::TensorOptions().dtype(column.dtype)));
      continue;
    }
    Place at{file.path, column.name, group};
    bool view_of_arrow = false;  // a view into Arrow's buffers: copied before they go
    torch::Tensor t;
    if (direct_[c])
      t = read_direct(*reader_->parquet_reader(), group, *direct_[c], rows, src.values_per_row,
                      scratch_[c]);
    std::shared_ptr<arrow::ChunkedArray> array;
    if (!t.defined()) {
      try {
        t = read_arrow(*reader_, group, src, column, at, rows, view_of_arrow, array);
      } catch (const DataError&) {
        // A reader that failed half way may hold state about the file: open it again next time.
        open_file_ = -1;
        throw;
      }
    }
    shape[0] = rows;
    t = t.view(shape);
    // Select the rows first, convert after: one pass over the piece's values, in their own
    // (often narrower) dtype.
    if (into) {
      DTRAIN_ASSERT((*into)[c].size(0) == end - begin, "decode into a tensor of another size");
      t = pick.defined() ? (*into)[c].copy_(t.index_select(0, pick))
                         : (*into)[c].copy_(t.narrow(0, begin, end - begin));
    } else if (pick.defined()) {
      t = t.index_select(0, pick).to(column.dtype);
    } else {
      t = t.narrow(0, begin, end - begin).to(column.dtype, false, view_of_arrow);
    }
    out.push_back(t);
  }
  return out;
}

}  // namespace dtrain::data::detail
