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
    // 20 digits hold more than an int64_t: such a name is no version a writer makes.
    if (name.substr(0, 20) > "09223372036854775807") continue;
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

}  // namespace

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

  LogReplay replay(root);
  if (checkpoint) {
    for (const auto& [part, name] : listing.checkpoints.at(*checkpoint))
      for (const json& a : checkpoint_actions(log / name)) replay.apply(a, name);
  }
  for (int64_t v = first; v <= target; ++v) {
    const fs::path file = log / commit_name(v);
    std::ifstream in(file);
    if (!in) throw DataError("data: cannot read the Delta commit " + file.string());
    std::string line;
    int64_t n = 0;
    while (std::getline(in, line)) replay.apply_line(line, file.string(), ++n);
  }
  return replay.snapshot(target);
}

}  // namespace dtrain::data::detail
