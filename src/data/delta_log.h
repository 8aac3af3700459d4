// A Delta Lake table's snapshot at one version, rebuilt from its _delta_log (the Delta
// protocol's "Action Reconciliation"): the newest complete classic checkpoint at or before the
// version, then the JSON commits after it, in order; add and remove actions keyed by the
// logical file, (path, deletion vector uniqueId): a file re-added with a new deletion vector
// and removed with its old one, in either order within a commit, keeps the new one.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "data/deletion_vector.h"

namespace dtrain::data::detail {

struct DeltaFile {
  std::string path;  // absolute, percent-decoded
  std::map<std::string, std::string> partition_values;
  std::optional<DeletionVectorRef> deletion_vector;  // the rows deleted from it, if any
};

// A column under Delta's column mapping: the name the table shows, the name its Parquet files
// and partitionValues use, and its id (the Parquet field id in "id" mode).
struct MappedColumn {
  std::string logical, physical;
  int64_t id = -1;
};

struct DeltaSnapshot {
  int64_t version = 0;
  // delta.columnMapping.mode: "none", "name" or "id"; the top-level columns when not "none"
  // (partition_values and partition_types are keyed by logical names already).
  std::string column_mapping = "none";
  std::vector<MappedColumn> mapped_columns;
  std::vector<DeltaFile> files;  // sorted by path
  // partition column -> its Delta type ("integer", "long", "double", "string", ...)
  std::map<std::string, std::string> partition_types;
  // Top-level columns (logical names) that are or hold a variant (readerFeatures variantType):
  // tolerated in the table, refused when a Reader asks for them.
  std::set<std::string> variant_columns;
};

// Throws DataError naming the log file and what is wrong: no _delta_log, a missing commit, a
// version the log does not hold, an unreadable checkpoint or commit line, a reader feature
// dtrain does not implement (with the feature's name), a malformed deletion vector descriptor,
// one path live twice, a column mapping whose schema lacks a column's physical name or id.
// Deletion vectors are only described here; Table::open reads them (deletion_vector.h).
DeltaSnapshot read_delta_snapshot(const std::string& root, std::optional<int64_t> version);

// "a%20b/c.parquet" -> "a b/c.parquet"; a "file:" URI -> its path. DataError for other schemes.
std::string delta_path(const std::string& root, const std::string& uri);

}  // namespace dtrain::data::detail
