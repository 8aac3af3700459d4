// LogReplay (delta_log.h): the Delta log's actions applied in order, and the snapshot they
// make. No file system and no Arrow here: what a fuzz target can run alone.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>

#include "data/delta_log.h"
#include "dtrain/data_table.h"

namespace dtrain::data::detail {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

DataError damaged_log(const std::string& where, const std::string& what) {
  return DataError("data: the Delta log file " + where + " " + what +
                   ": the log is damaged or was written by a broken writer");
}

// obj[key] as a string: `fallback` when absent or null, DataError when of another JSON type.
std::string string_field(const json& obj, const char* key, const std::string& fallback,
                         const std::string& where, const char* action) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) {
    throw damaged_log(where, std::string("has a ") + action + " action whose " + key +
                                 " is not a string (" + it->type_name() + ")");
  }
  return it->get<std::string>();
}

// delta.columnMapping.mode of the table's metaData ("none" when not set).
std::string column_mapping_mode(const json& metadata) {
  if (metadata.is_object() && metadata.contains("configuration") &&
      metadata["configuration"].is_object()) {
    const json& c = metadata["configuration"];
    if (auto it = c.find("delta.columnMapping.mode"); it != c.end() && it->is_string())
      return it->get<std::string>();
  }
  return "none";
}

// The reader features dtrain implements (the others change what a reader must do).
void check_protocol(const json& protocol, const json& metadata, const std::string& where) {
  int64_t reader = 1;
  if (auto it = protocol.find("minReaderVersion"); it != protocol.end() && !it->is_null()) {
    if (!it->is_number_integer()) {
      throw DataError("data: the Delta table " + where +
                      " has a protocol action whose minReaderVersion is not an integer (" +
                      it->type_name() + "): the log is damaged or was written by a broken writer");
    }
    reader = it->get<int64_t>();
  }
  const std::string mapping = column_mapping_mode(metadata);
  if (mapping != "none" && mapping != "name" && mapping != "id") {
    throw DataError("data: the Delta table " + where + " has delta.columnMapping.mode '" + mapping +
                    "'; the Delta protocol defines none, name and id");
  }
  if (reader > 3) {
    throw DataError("data: the Delta table " + where + " needs reader version " +
                    std::to_string(reader) + "; dtrain::data reads versions 1 to 3");
  }
  if (reader == 3 && protocol.contains("readerFeatures") && protocol["readerFeatures"].is_array()) {
    // v2Checkpoint: classic checkpoints in the V2 spec are read (checkpoint_actions); UUID-named
    // ones are never needed while the commits after a classic one (or from 0) are there.
    // variantType / variantShredding (and Delta Spark's -preview names of them): a reader
    // "must recognize and tolerate a variant data type in a Delta schema"; dtrain tolerates it
    // in the table and refuses a variant column a Reader asks for (resolve_column), so the
    // physical layout of variants (shredded or not) never matters to it.
    static const std::set<std::string> known = {
        "columnMapping",    "deletionVectors",          "timestampNtz", "vacuumProtocolCheck",
        "typeWidening",     "typeWidening-preview",     "variantType",  "variantType-preview",
        "variantShredding", "variantShredding-preview", "v2Checkpoint"};
    for (const auto& f : protocol["readerFeatures"]) {
      if (f.is_string() && !known.count(f.get<std::string>())) {
        throw DataError("data: the Delta table " + where + " needs the reader feature '" +
                        f.get<std::string>() +
                        "', which dtrain::data does not implement; read it with Spark and "
                        "write a copy without it (or read an older version)");
      }
    }
  }
}

// Percent-decoding of the URI paths add and remove actions hold.
std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// An action's deletionVector descriptor, if it has one. `file` is the action's data file.
std::optional<DeletionVectorRef> descriptor(const json& action, const std::string& file,
                                            const std::string& where) {
  auto it = action.find("deletionVector");
  if (it == action.end() || it->is_null()) return std::nullopt;
  auto damaged = [&](const std::string& what) {
    return damaged_log(where, "gives " + file + " a deletionVector " + what);
  };
  if (!it->is_object()) throw damaged("that is not an object");
  const json& d = *it;
  DeletionVectorRef dv;
  for (const char* key : {"storageType", "pathOrInlineDv"})
    if (!d.contains(key) || !d[key].is_string()) throw damaged(std::string("without ") + key);
  for (const char* key : {"sizeInBytes", "cardinality"})
    if (!d.contains(key) || !d[key].is_number_integer())
      throw damaged(std::string("without ") + key);
  dv.storage_type = d["storageType"].get<std::string>();
  dv.path_or_inline = d["pathOrInlineDv"].get<std::string>();
  dv.size_in_bytes = d["sizeInBytes"].get<int64_t>();
  dv.cardinality = d["cardinality"].get<int64_t>();
  if (d.contains("offset") && !d["offset"].is_null()) {
    if (!d["offset"].is_number_integer() || d["offset"].get<int64_t>() < 0)
      throw damaged("with an offset that is not a non-negative integer");
    dv.offset = d["offset"].get<int64_t>();
  }
  return dv;
}

// Whether a schema type (Spark's JSON form) is or holds a variant.
bool holds_variant(const json& type) {
  if (type.is_string()) return type.get<std::string>() == "variant";
  if (!type.is_object()) return false;
  if (type.contains("fields") && type["fields"].is_array())
    for (const auto& f : type["fields"])
      if (f.is_object() && f.contains("type") && holds_variant(f["type"])) return true;
  for (const char* key : {"elementType", "keyType", "valueType"})
    if (type.contains(key) && holds_variant(type[key])) return true;
  return false;
}

}  // namespace

std::string delta_path(const std::string& root, const std::string& uri) {
  std::string p = uri;
  if (p.rfind("file://", 0) == 0) {
    p = p.substr(7);
  } else if (p.rfind("file:", 0) == 0) {
    p = p.substr(5);
  } else {
    const auto colon = p.find(':'), slash = p.find('/');
    if (colon != std::string::npos && (slash == std::string::npos || colon < slash)) {
      throw DataError("data: the Delta table " + root + " names the file '" + uri +
                      "' on another file system; dtrain::data reads local paths only");
    }
  }
  p = percent_decode(p);
  if (!p.empty() && p[0] == '/') return p;
  return (fs::path(root) / p).lexically_normal().string();
}

void LogReplay::apply(const json& action, const std::string& where) {
  if (!action.is_object()) return;
  if (action.contains("add") && action["add"].is_object()) {
    const json& add = action["add"];
    DeltaFile f;
    const std::string path = string_field(add, "path", "", where, "add");
    if (path.empty()) throw damaged_log(where, "has an add action without a path");
    f.path = delta_path(root_, path);
    if (add.contains("partitionValues") && add["partitionValues"].is_object())
      for (const auto& [k, val] : add["partitionValues"].items())
        f.partition_values[k] = val.is_string() ? val.get<std::string>() : "";
    f.deletion_vector = descriptor(add, f.path, where);
    auto key = std::make_pair(f.path, f.deletion_vector ? f.deletion_vector->unique_id() : "");
    files_[std::move(key)] = std::move(f);
  } else if (action.contains("remove") && action["remove"].is_object()) {
    const json& remove = action["remove"];
    const std::string given = string_field(remove, "path", "", where, "remove");
    if (given.empty()) throw damaged_log(where, "has a remove action without a path");
    const std::string path = delta_path(root_, given);
    const auto dv = descriptor(remove, path, where);
    files_.erase(std::make_pair(path, dv ? dv->unique_id() : ""));
  } else if (action.contains("metaData") && action["metaData"].is_object()) {
    metadata_ = action["metaData"];
  } else if (action.contains("protocol") && action["protocol"].is_object()) {
    protocol_ = action["protocol"];
  }
}

void LogReplay::apply_line(std::string_view line, const std::string& where, int64_t line_number) {
  if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;
  json action;
  try {
    action = json::parse(line);
  } catch (const json::exception& e) {
    throw DataError("data: the Delta commit " + where + " line " + std::to_string(line_number) +
                    " is not JSON (" + e.what() + "): the log is damaged");
  }
  apply(action, where);
}

void LogReplay::apply_commit(std::string_view text, const std::string& where) {
  int64_t n = 0;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    apply_line(text.substr(0, end), where, ++n);
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
}

DeltaSnapshot LogReplay::snapshot(int64_t version) const {
  const std::string& root = root_;
  const std::string log = (fs::path(root) / "_delta_log").string();
  if (metadata_.empty()) {
    throw DataError("data: the Delta log " + log + " has no metaData action up to version " +
                    std::to_string(version) + ": it is not a valid Delta table");
  }
  check_protocol(protocol_, metadata_, root);

  DeltaSnapshot snap;
  snap.version = version;
  snap.table_id = string_field(metadata_, "id", "", log, "metaData");
  snap.column_mapping = column_mapping_mode(metadata_);
  // Partition columns' types, from the table schema (a JSON string of Spark's StructType).
  std::set<std::string> partition_columns;
  if (metadata_.contains("partitionColumns") && metadata_["partitionColumns"].is_array())
    for (const auto& c : metadata_["partitionColumns"])
      if (c.is_string()) partition_columns.insert(c.get<std::string>());
  {
    json schema;
    try {
      schema = json::parse(string_field(metadata_, "schemaString", "{}", log, "metaData"));
    } catch (const json::exception& e) {
      throw DataError("data: the Delta table " + root + " has a schemaString that is not JSON (" +
                      e.what() + ")");
    }
    if (schema.is_object() && schema.contains("fields") && schema["fields"].is_array()) {
      for (const auto& f : schema["fields"]) {
        if (!f.is_object()) continue;
        const std::string name = string_field(f, "name", "", log, "metaData schema field");
        if (f.contains("type") && holds_variant(f["type"])) snap.variant_columns.insert(name);
        if (partition_columns.count(name))
          snap.partition_types[name] =
              f.contains("type") && f["type"].is_string() ? f["type"].get<std::string>() : "struct";
        if (snap.column_mapping == "none") continue;
        // Column mapping: the field's metadata names its physical column and id.
        const json meta =
            f.contains("metadata") && f["metadata"].is_object() ? f["metadata"] : json::object();
        MappedColumn m{name, "", -1};
        if (auto it = meta.find("delta.columnMapping.physicalName");
            it != meta.end() && it->is_string())
          m.physical = it->get<std::string>();
        if (auto it = meta.find("delta.columnMapping.id");
            it != meta.end() && it->is_number_integer())
          m.id = it->get<int64_t>();
        if (m.physical.empty() || (snap.column_mapping == "id" && m.id < 0)) {
          throw DataError("data: the Delta table " + root + " maps its columns by " +
                          snap.column_mapping + ", but its schema gives column '" + name +
                          "' no delta.columnMapping." +
                          (m.physical.empty() ? "physicalName" : "id") +
                          ": the log is damaged or was written by a broken writer");
        }
        snap.mapped_columns.push_back(std::move(m));
      }
    }
  }
  // partitionValues are keyed by physical names under column mapping: the table's own names.
  std::map<std::string, std::string> logical_of;
  for (const auto& m : snap.mapped_columns) logical_of[m.physical] = m.logical;
  std::string previous;
  for (const auto& [key, file] : files_) {
    const std::string& path = key.first;
    if (path == previous) {
      throw DataError("data: the Delta table " + root + " at version " + std::to_string(version) +
                      " holds " + path +
                      " twice, with different deletion vectors (no remove action for the older "
                      "one): the log is damaged or was written by a broken writer");
    }
    previous = path;
    DeltaFile f = file;
    if (!logical_of.empty()) {
      std::map<std::string, std::string> renamed;
      for (auto& [k, v] : f.partition_values) {
        auto it = logical_of.find(k);
        renamed[it == logical_of.end() ? k : it->second] = std::move(v);
      }
      f.partition_values = std::move(renamed);
    }
    snap.files.push_back(std::move(f));
  }
  return snap;
}

}  // namespace dtrain::data::detail
