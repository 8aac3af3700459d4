// A Delta Lake table's snapshot at one version, rebuilt from its _delta_log (the Delta
// protocol's "Action Reconciliation"): the newest complete classic checkpoint at or before the
// version, then the JSON commits after it, in order; add and remove actions keyed by the
// logical file, (path, deletion vector uniqueId): a file re-added with a new deletion vector
// and removed with its old one, in either order within a commit, keeps the new one.
//
// Two parts: read_delta_snapshot (delta_log.cpp) lists the log and reads its files - the
// checkpoint's Parquet through Arrow, the commits line by line; LogReplay (delta_replay.cpp)
// applies the actions and makes the snapshot, with no file system and no Arrow (so the
// delta_log fuzz target runs it on its own: tests/fuzz/delta_log_fuzz.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
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
  std::string table_id;  // metaData.id (a uuid; "" when the log gives none)
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

// The replay of the table at `root` (for paths and messages): feed it the checkpoint's actions
// (each as the one-key object a commit line holds), then each commit's lines in order; then
// snapshot(). Every malformed action (a field of the wrong JSON type, a deletionVector without
// its fields, a line that is not JSON) is a DataError naming `where`, never another exception.
class LogReplay {
 public:
  explicit LogReplay(std::string root) : root_(std::move(root)) {}
  // One action; objects other than add, remove, metaData and protocol are ignored, as the
  // protocol asks (commitInfo, txn, domainMetadata, checkpointMetadata, ...).
  void apply(const nlohmann::json& action, const std::string& where);
  // Line `line_number` (from 1) of the commit `where`: one JSON action; blank lines skipped.
  void apply_line(std::string_view line, const std::string& where, int64_t line_number);
  // A whole commit file's text, line by line.
  void apply_commit(std::string_view text, const std::string& where);
  // The snapshot the actions so far make at `version`. DataError: no metaData, a reader
  // feature dtrain does not implement, a bad schemaString or column mapping, a path live twice.
  DeltaSnapshot snapshot(int64_t version) const;

 private:
  std::string root_;
  // Logical files by (path, deletion vector uniqueId; "" without one), the protocol's key.
  std::map<std::pair<std::string, std::string>, DeltaFile> files_;
  nlohmann::json protocol_ = nlohmann::json::object(), metadata_ = nlohmann::json::object();
};

}  // namespace dtrain::data::detail
