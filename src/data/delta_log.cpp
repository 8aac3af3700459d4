#include "data/delta_log.h"

#include "data/parquet_file.h"

#include <arrow/api.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "dtrain/data_table.h"

namespace dtrain::data::detail {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// What the log directory holds, by version.
struct LogListing {
  std::set<int64_t> commits;                                  // NNN.json
  std::map<int64_t, std::map<int, std::string>> checkpoints;  // version -> part -> file name
  std::map<int64_t, int> checkpoint_parts;                    // version -> parts expected
  std::set<int64_t> v2_checkpoints;                           // NNN.checkpoint.<uuid>.*
};

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string commit_name(int64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%020lld.json", static_cast<long long>(v));
  return buf;
}

LogListing list_log(const fs::path& log) {
  LogListing out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(log, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() < 21 || !all_digits(name.substr(0, 20)) || name[20] != '.') continue;
    const int64_t v = std::stoll(name.substr(0, 20));
    const std::string rest = name.substr(21);
    if (rest == "json") {
      out.commits.insert(v);
    } else if (rest == "checkpoint.parquet") {
      out.checkpoints[v][1] = name;
      out.checkpoint_parts[v] = 1;
    } else if (rest.rfind("checkpoint.", 0) == 0) {
      // checkpoint.PART.PARTS.parquet (multi-part, 10 digits each) or checkpoint.UUID.* (v2)
      const std::string tail = rest.substr(11);
      if (tail.size() == 10 + 1 + 10 + 8 && all_digits(tail.substr(0, 10)) &&
          all_digits(tail.substr(11, 10)) && tail.substr(21) == ".parquet") {
        const int part = std::stoi(tail.substr(0, 10)), parts = std::stoi(tail.substr(11, 10));
        out.checkpoints[v][part] = name;
        out.checkpoint_parts[v] = parts;
      } else {
        out.v2_checkpoints.insert(v);
      }
    }
  }
  if (ec) throw DataError("data: cannot list the Delta log " + log.string() + ": " + ec.message());
  return out;
}

// One value of an Arrow array as JSON (what the same action holds in a JSON commit).
json arrow_value(const arrow::Array& a, int64_t i) {
  if (a.IsNull(i)) return nullptr;
  switch (a.type_id()) {
    case arrow::Type::BOOL:
      return static_cast<const arrow::BooleanArray&>(a).Value(i);
    case arrow::Type::INT8:
      return static_cast<const arrow::Int8Array&>(a).Value(i);
    case arrow::Type::INT16:
      return static_cast<const arrow::Int16Array&>(a).Value(i);
    case arrow::Type::INT32:
      return static_cast<const arrow::Int32Array&>(a).Value(i);
    case arrow::Type::INT64:
      return static_cast<const arrow::Int64Array&>(a).Value(i);
    case arrow::Type::DOUBLE:
      return static_cast<const arrow::DoubleArray&>(a).Value(i);
    case arrow::Type::FLOAT:
      return static_cast<const arrow::FloatArray&>(a).Value(i);
    case arrow::Type::STRING:
      return static_cast<const arrow::StringArray&>(a).GetString(i);
    case arrow::Type::LARGE_STRING:
      return static_cast<const arrow::LargeStringArray&>(a).GetString(i);
    case arrow::Type::STRING_VIEW:
      return std::string(static_cast<const arrow::StringViewArray&>(a).GetView(i));
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(a);
      json obj = json::object();
      for (int f = 0; f < s.num_fields(); ++f)
        obj[s.struct_type()->field(f)->name()] = arrow_value(*s.field(f), i);
      return obj;
    }
    case arrow::Type::MAP: {
      const auto& m = static_cast<const arrow::MapArray&>(a);
      json obj = json::object();
      for (int64_t j = m.value_offset(i); j < m.value_offset(i + 1); ++j) {
        json k = arrow_value(*m.keys(), j);
        if (k.is_string()) obj[k.get<std::string>()] = arrow_value(*m.items(), j);
      }
      return obj;
    }
    case arrow::Type::LIST: {
      const auto& l = static_cast<const arrow::ListArray&>(a);
      json arr = json::array();
      for (int64_t j = l.value_offset(i); j < l.value_offset(i + 1); ++j)
        arr.push_back(arrow_value(*l.values(), j));
      return arr;
    }
    case arrow::Type::LARGE_LIST: {
      const auto& l = static_cast<const arrow::LargeListArray&>(a);
      json arr = json::array();
      for (int64_t j = l.value_offset(i); j < l.value_offset(i + 1); ++j)
        arr.push_back(arrow_value(*l.values(), j));
      return arr;
    }
    default:
      return nullptr;  // binary, timestamps...: no field the snapshot needs
  }
}

// The actions of a checkpoint file, each as the one-key object a JSON commit line holds.
// A classic checkpoint may follow the V2 spec (readerFeatures v2Checkpoint; delta-rs writes
// such with a checkpointMetadata action): read the same, unless its file actions are in
// sidecar files, which dtrain does not read - refused, as reading it would miss files.
std::vector<json> checkpoint_actions(const fs::path& file) {
  std::vector<json> out;
  int64_t sidecars = 0;
  try {
    auto reader = open_reader(file.string());
    std::shared_ptr<arrow::Table> table;
    PARQUET_ASSIGN_OR_THROW(table, reader->ReadTable());
    if (auto column = table->GetColumnByName("sidecar"))
      sidecars = column->length() - column->null_count();
    for (const char* kind : {"add", "metaData", "protocol"}) {
      auto column = table->GetColumnByName(kind);
      if (!column) continue;
      for (const auto& chunk : column->chunks())
        for (int64_t i = 0; i < chunk->length(); ++i)
          if (!chunk->IsNull(i)) out.push_back(json{{kind, arrow_value(*chunk, i)}});
    }
  } catch (const std::exception& e) {
    throw DataError("data: the Delta checkpoint " + file.string() +
                    " is not a readable Parquet file (" + e.what() +
                    "): the log is damaged; restore it, or read an older version");
  }
  if (sidecars > 0) {
    throw DataError("data: the Delta checkpoint " + file.string() + " keeps its file actions in " +
                    std::to_string(sidecars) +
                    " sidecar files (a v2 checkpoint), which dtrain::data does not read: read a "
                    "version before the checkpoint, or write one without sidecars (a V1 or "
                    "V2-spec checkpoint holding its add actions itself)");
  }
  return out;
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
  const int reader = protocol.value("minReaderVersion", 1);
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
    return DataError("data: the Delta log file " + where + " gives " + file + " a deletionVector " +
                     what + ": the log is damaged or was written by a broken writer");
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

DeltaSnapshot read_delta_snapshot(const std::string& root, std::optional<int64_t> version) {
  const fs::path log = fs::path(root) / "_delta_log";
  if (!fs::is_directory(log)) {
    throw DataError("data: " + root +
                    " is not a Delta table: it has no _delta_log directory (for plain Parquet "
                    "files use parquet:" +
                    root + ")");
  }
  const LogListing listing = list_log(log);
  int64_t newest = -1;
  if (!listing.commits.empty()) newest = *listing.commits.rbegin();
  for (const auto& [v, parts] : listing.checkpoints) newest = std::max(newest, v);
  if (newest < 0) {
    throw DataError("data: the Delta log " + log.string() +
                    " holds no commit (no 00000000000000000000.json): it is empty or not a "
                    "Delta log");
  }
  const int64_t target = version.value_or(newest);
  if (target < 0 || target > newest) {
    throw DataError("data: the Delta table " + root + " has no version " + std::to_string(target) +
                    ": its newest is " + std::to_string(newest));
  }
  // The newest complete classic checkpoint at or before the target.
  std::optional<int64_t> checkpoint;
  for (auto it = listing.checkpoints.rbegin(); it != listing.checkpoints.rend(); ++it) {
    const auto& [v, parts] = *it;
    if (v > target) continue;
    if (static_cast<int>(parts.size()) == listing.checkpoint_parts.at(v)) {
      checkpoint = v;
      break;
    }
  }
  const int64_t first = checkpoint ? *checkpoint + 1 : 0;
  for (int64_t v = first; v <= target; ++v) {
    if (listing.commits.count(v)) continue;
    std::string held = listing.commits.empty() ? "none"
                                               : std::to_string(*listing.commits.begin()) + " to " +
                                                     std::to_string(*listing.commits.rbegin());
    if (auto v2 = listing.v2_checkpoints.lower_bound(v);
        v2 != listing.v2_checkpoints.end() && *v2 <= target) {
      throw DataError("data: the Delta table " + root + " at version " + std::to_string(target) +
                      " needs its UUID-named v2 checkpoint at version " + std::to_string(*v2) +
                      " (the commit " + (log / commit_name(v)).string() +
                      " before it is gone), which dtrain::data does not read: read a version "
                      "that has a classic checkpoint or every commit");
    }
    throw DataError(
        "data: the Delta log is missing the commit " + (log / commit_name(v)).string() +
        ": version " + std::to_string(target) + " needs every commit from " +
        (checkpoint ? "the checkpoint at " + std::to_string(*checkpoint) : std::string("0")) +
        " on (the log holds commits " + held +
        "). The log was damaged or cleaned up: restore the file, or read a version that has a "
        "checkpoint after the gap");
  }

  // Logical files by (path, deletion vector uniqueId; "" without one), the protocol's key.
  std::map<std::pair<std::string, std::string>, DeltaFile> files;
  json protocol = json::object(), metadata = json::object();
  auto apply = [&](const json& action, const std::string& where) {
    if (!action.is_object()) return;
    if (action.contains("add") && action["add"].is_object()) {
      const json& add = action["add"];
      DeltaFile f;
      f.path = delta_path(root, add.value("path", ""));
      if (add.contains("partitionValues") && add["partitionValues"].is_object())
        for (const auto& [k, val] : add["partitionValues"].items())
          f.partition_values[k] = val.is_string() ? val.get<std::string>() : "";
      f.deletion_vector = descriptor(add, f.path, where);
      auto key = std::make_pair(f.path, f.deletion_vector ? f.deletion_vector->unique_id() : "");
      files[std::move(key)] = std::move(f);
    } else if (action.contains("remove") && action["remove"].is_object()) {
      const json& remove = action["remove"];
      const std::string path = delta_path(root, remove.value("path", ""));
      const auto dv = descriptor(remove, path, where);
      files.erase(std::make_pair(path, dv ? dv->unique_id() : ""));
    } else if (action.contains("metaData") && action["metaData"].is_object()) {
      metadata = action["metaData"];
    } else if (action.contains("protocol") && action["protocol"].is_object()) {
      protocol = action["protocol"];
    }
  };
  if (checkpoint) {
    for (const auto& [part, name] : listing.checkpoints.at(*checkpoint))
      for (const json& a : checkpoint_actions(log / name)) apply(a, name);
  }
  for (int64_t v = first; v <= target; ++v) {
    const fs::path file = log / commit_name(v);
    std::ifstream in(file);
    if (!in) throw DataError("data: cannot read the Delta commit " + file.string());
    std::string line;
    int64_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      json action;
      try {
        action = json::parse(line);
      } catch (const json::exception& e) {
        throw DataError("data: the Delta commit " + file.string() + " line " + std::to_string(n) +
                        " is not JSON (" + e.what() + "): the log is damaged");
      }
      apply(action, file.string());
    }
  }
  if (metadata.empty()) {
    throw DataError("data: the Delta log " + log.string() +
                    " has no metaData action up to version " + std::to_string(target) +
                    ": it is not a valid Delta table");
  }
  check_protocol(protocol, metadata, root);

  DeltaSnapshot snap;
  snap.version = target;
  snap.column_mapping = column_mapping_mode(metadata);
  // Partition columns' types, from the table schema (a JSON string of Spark's StructType).
  std::set<std::string> partition_columns;
  if (metadata.contains("partitionColumns") && metadata["partitionColumns"].is_array())
    for (const auto& c : metadata["partitionColumns"])
      if (c.is_string()) partition_columns.insert(c.get<std::string>());
  {
    json schema;
    try {
      schema = json::parse(metadata.value("schemaString", "{}"));
    } catch (const json::exception& e) {
      throw DataError("data: the Delta table " + root + " has a schemaString that is not JSON (" +
                      e.what() + ")");
    }
    if (schema.contains("fields") && schema["fields"].is_array()) {
      for (const auto& f : schema["fields"]) {
        if (!f.is_object()) continue;
        const std::string name = f.value("name", "");
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
  for (auto& [key, f] : files) {
    const std::string& path = key.first;
    if (path == previous) {
      throw DataError("data: the Delta table " + root + " at version " + std::to_string(target) +
                      " holds " + path +
                      " twice, with different deletion vectors (no remove action for the older "
                      "one): the log is damaged or was written by a broken writer");
    }
    previous = path;
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
