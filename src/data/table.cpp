#include <arrow/type.h>
#include <arrow/util/key_value_metadata.h>
#include <parquet/metadata.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "data/deletion_vector.h"
#include "data/delta_log.h"
#include "data/fnv.h"
#include "data/parquet_file.h"
#include "data/table_state.h"
#include "dtrain/data_table.h"

namespace dtrain::data {

namespace fs = std::filesystem;
using detail::TableState;

namespace {

// Spark and pyarrow keep their own files beside the data: _SUCCESS, _committed_*, .crc ...
bool hidden(const fs::path& p) {
  const std::string n = p.filename().string();
  return n.empty() || n[0] == '_' || n[0] == '.';
}

std::vector<std::string> parquet_files(const fs::path& root) {
  std::vector<std::string> out;
  if (fs::is_regular_file(root)) return {fs::absolute(root).string()};
  if (!fs::is_directory(root)) {
    throw DataError("data: " + root.string() +
                    " does not exist (expected a Parquet file or a directory of them)");
  }
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (hidden(it->path())) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && it->path().extension() == ".parquet")
      out.push_back(fs::absolute(it->path()).lexically_normal().string());
  }
  if (ec) throw DataError("data: cannot list " + root.string() + ": " + ec.message());
  std::sort(out.begin(), out.end());
  if (out.empty()) {
    throw DataError("data: " + root.string() +
                    " holds no *.parquet file (files starting with '_' or '.' are skipped)");
  }
  return out;
}

// Under Delta's column mapping a file names its columns by physical names ("name" mode) or
// Parquet field ids ("id" mode): its schema is given the table's own (logical) names, so that
// Columns, columns() and the messages use them. Fields the table does not map keep their names.
std::shared_ptr<arrow::Schema> logical_schema(const std::shared_ptr<arrow::Schema>& schema,
                                              const detail::DeltaSnapshot& snap) {
  if (snap.column_mapping == "none") return schema;
  std::map<std::string, std::string> by_name;
  std::map<int64_t, std::string> by_id;
  for (const auto& m : snap.mapped_columns) {
    by_name[m.physical] = m.logical;
    by_id[m.id] = m.logical;
  }
  arrow::FieldVector fields;
  for (const auto& f : schema->fields()) {
    std::string logical;
    if (snap.column_mapping == "id") {
      if (f->metadata()) {
        const int k = f->metadata()->FindKey("PARQUET:field_id");
        if (k >= 0) {
          try {
            auto it = by_id.find(std::stoll(f->metadata()->value(k)));
            if (it != by_id.end()) logical = it->second;
          } catch (const std::exception&) {
          }
        }
      }
    } else if (auto it = by_name.find(f->name()); it != by_name.end()) {
      logical = it->second;
    }
    fields.push_back(logical.empty() ? f : f->WithName(logical));
  }
  return arrow::schema(std::move(fields), schema->metadata());
}

// A deletion vector's rows (positions in the file, sorted) per row group of the file, as
// positions in the group. DataError for a row the file does not have.
std::vector<std::vector<int64_t>> split_deleted(const parquet::FileMetaData& metadata,
                                                const std::vector<uint64_t>& rows,
                                                const std::string& root, int64_t version,
                                                const std::string& file) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(metadata.num_row_groups()));
  size_t next = 0;
  int64_t start = 0;
  for (int g = 0; g < metadata.num_row_groups(); ++g) {
    const int64_t end = start + metadata.RowGroup(g)->num_rows();
    for (; next < rows.size() && rows[next] < static_cast<uint64_t>(end); ++next)
      out[static_cast<size_t>(g)].push_back(static_cast<int64_t>(rows[next]) - start);
    start = end;
  }
  if (next < rows.size()) {
    throw DataError("data: the deletion vector of " + file + " (Delta table " + root +
                    " at version " + std::to_string(version) + ") deletes row " +
                    std::to_string(rows[next]) + ", but the file has " + std::to_string(start) +
                    " rows: the vector belongs to another file, or the log is damaged");
  }
  return out;
}

// TableState::digest. Paths relative to the root, so that a copy of the table elsewhere (or
// mounted at another path on another host) has the same digest.
std::string digest(const TableState& state) {
  uint64_t h = detail::fnv1a(state.format == TableFormat::kDelta ? "delta" : "parquet");
  for (size_t i = 0; i < state.files.size(); ++i) {
    const fs::path path(state.paths[i]);
    std::string rel = path.lexically_relative(state.root).string();
    if (rel.empty() || rel == ".") rel = path.filename().string();  // "parquet:FILE"
    h = detail::fnv1a(rel, detail::fnv1a(std::string_view("\0", 1), h));
    const auto& file = state.files[i];
    if (state.format == TableFormat::kDelta) {
      h = detail::fnv1a(" dv " + file.deletion_vector_id, h);
    } else {
      std::error_code ec;
      const auto size = fs::file_size(path, ec);
      std::string sized = " ";  // " SIZE " (appended, not "literal" + string: GCC 12 warns)
      sized += std::to_string(ec ? 0 : size);
      sized += ' ';
      h = detail::fnv1a(sized, h);
      h = detail::fnv1a(file.metadata->SerializeToString(), h);
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

}  // namespace

Table Table::open(const std::string& location, TableOptions options) {
  auto state = std::make_shared<TableState>();
  std::string path = location;
  TableFormat format = options.format;
  if (path.rfind("delta:", 0) == 0) {
    format = TableFormat::kDelta;
    path = path.substr(6);
  } else if (path.rfind("parquet:", 0) == 0) {
    format = TableFormat::kParquet;
    path = path.substr(8);
  }
  if (path.rfind("file://", 0) == 0) path = path.substr(7);
  if (path.empty()) throw UsageError("data: an empty table location ('" + location + "')");
  if (format == TableFormat::kAuto)
    format = fs::is_directory(fs::path(path) / "_delta_log") ? TableFormat::kDelta
                                                             : TableFormat::kParquet;
  if (options.version && format != TableFormat::kDelta) {
    throw UsageError("data: a version was asked of " + location +
                     ", which is not a Delta table (only Delta tables have versions)");
  }
  state->format = format;
  state->root = fs::absolute(path).lexically_normal().string();
  std::vector<std::map<std::string, std::string>> partitions;
  std::vector<std::optional<detail::DeletionVectorRef>> deletion_vectors;
  detail::DeltaSnapshot snap;
  if (format == TableFormat::kDelta) {
    snap = detail::read_delta_snapshot(state->root, options.version);
    state->version = snap.version;
    state->table_id = snap.table_id;
    state->partition_types = snap.partition_types;
    state->variant_columns = snap.variant_columns;
    for (auto& f : snap.files) {
      state->paths.push_back(f.path);
      partitions.push_back(std::move(f.partition_values));
      deletion_vectors.push_back(std::move(f.deletion_vector));
    }
  } else {
    state->paths = parquet_files(path);
    partitions.resize(state->paths.size());
  }
  deletion_vectors.resize(state->paths.size());
  for (size_t i = 0; i < state->paths.size(); ++i) {
    if (!fs::exists(state->paths[i])) {
      throw DataError("data: " + state->paths[i] + ", a file of the Delta table " + state->root +
                      (state->version ? " at version " + std::to_string(*state->version) : "") +
                      ", does not exist: the table was vacuumed past this version or copied "
                      "in part");
    }
    auto file = detail::read_footer(state->paths[i]);
    file.schema = logical_schema(file.schema, snap);
    file.partition_values = std::move(partitions[i]);
    if (const auto& dv = deletion_vectors[i]) {
      file.deletion_vector_id = dv->unique_id();
      file.deleted =
          split_deleted(*file.metadata,
                        detail::read_deletion_vector(state->root, *state->version, state->paths[i],
                                                     file.metadata->num_rows(), *dv),
                        state->root, *state->version, state->paths[i]);
    }
    for (int g = 0; g < file.metadata->num_row_groups(); ++g) {
      RowGroup rg;
      rg.file = static_cast<int>(i);
      rg.index = g;
      rg.deleted = file.deleted.empty()
                       ? 0
                       : static_cast<int64_t>(file.deleted[static_cast<size_t>(g)].size());
      rg.rows = file.metadata->RowGroup(g)->num_rows() - rg.deleted;
      rg.first = state->num_rows;
      state->num_rows += rg.rows;
      state->row_groups.push_back(rg);
    }
    state->files.push_back(std::move(file));
  }
  state->digest = digest(*state);
  return Table(std::move(state));
}

TableFormat Table::format() const { return state_->format; }
const std::string& Table::root() const { return state_->root; }
const std::vector<std::string>& Table::files() const { return state_->paths; }
const std::vector<RowGroup>& Table::row_groups() const { return state_->row_groups; }
int64_t Table::num_rows() const { return state_->num_rows; }
std::optional<int64_t> Table::version() const { return state_->version; }

const std::map<std::string, std::string>& Table::partition_values(int file) const {
  return state_->files.at(static_cast<size_t>(file)).partition_values;
}

std::vector<ColumnInfo> Table::columns() const {
  std::vector<ColumnInfo> out;
  if (!state_->files.empty())
    for (const auto& f : state_->files[0].schema->fields())
      out.push_back({f->name(), f->type()->ToString(), false});
  for (const auto& [name, type] : state_->partition_types) out.push_back({name, type, true});
  return out;
}

}  // namespace dtrain::data
