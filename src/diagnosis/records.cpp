#include "diagnosis/records.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <sstream>

#include "dtrain/error.h"

namespace dtrain {

const char* to_string(CollectiveState state) {
  switch (state) {
    case CollectiveState::kStarted:
      return "started";
    case CollectiveState::kCompleted:
      return "completed";
    case CollectiveState::kFailed:
      return "failed";
    case CollectiveState::kUnwaited:
      return "unwaited";
  }
  return "?";
}

std::string format_record(const CollectiveRecord& r) {
  std::ostringstream s;
  s << "#" << r.seq << " " << r.op << " " << r.dtype << " " << r.shapes << " ";
  char buf[64];
  switch (r.state) {
    case CollectiveState::kCompleted:
      std::snprintf(buf, sizeof buf, "%.3f ms", (r.end_time - r.start_time) * 1e3);
      s << "completed at " << diagnosis::format_time(r.end_time) << " (" << buf << ")";
      break;
    case CollectiveState::kStarted:
      std::snprintf(buf, sizeof buf, "%.1f s", diagnosis::now_epoch_seconds() - r.start_time);
      s << "started at " << diagnosis::format_time(r.start_time) << ", not completed (" << buf
        << " ago)";
      break;
    case CollectiveState::kFailed:
      s << "failed at " << diagnosis::format_time(r.end_time) << " (started "
        << diagnosis::format_time(r.start_time) << ")";
      if (!r.error.empty()) s << ": " << r.error;
      break;
    case CollectiveState::kUnwaited:
      s << "started at " << diagnosis::format_time(r.start_time) << ", its Work destroyed unwaited";
      break;
  }
  return s.str();
}

namespace diagnosis {

using nlohmann::json;

namespace {

json to_json(const CollectiveRecord& r) {
  return {{"seq", r.seq},      {"op", r.op},
          {"dtype", r.dtype},  {"shapes", r.shapes},
          {"rank", r.rank},    {"start", r.start_time},
          {"end", r.end_time}, {"state", static_cast<int>(r.state)},
          {"error", r.error}};
}

CollectiveRecord record_from_json(const json& j) {
  CollectiveRecord r;
  r.seq = j.value("seq", std::uint64_t{0});
  r.op = j.value("op", "");
  r.dtype = j.value("dtype", "");
  r.shapes = j.value("shapes", "");
  r.rank = j.value("rank", -1);
  r.start_time = j.value("start", 0.0);
  r.end_time = j.value("end", 0.0);
  int state = j.value("state", 0);
  if (state < 0 || state > static_cast<int>(CollectiveState::kUnwaited)) state = 0;
  r.state = static_cast<CollectiveState>(state);
  r.error = j.value("error", "");
  return r;
}

}  // namespace

std::string encode(const Progress& p) {
  json j = {{"rank", p.rank},
            {"world_size", p.world_size},
            {"entered", p.entered},
            {"completed", p.completed},
            {"published_at", p.published_at}};
  if (p.last_entered) j["last_entered"] = to_json(*p.last_entered);
  if (p.last_completed) j["last_completed"] = to_json(*p.last_completed);
  json recent = json::array();
  for (const auto& r : p.recent) recent.push_back(to_json(r));
  j["recent"] = std::move(recent);
  return j.dump();
}

Progress decode_progress(const std::string& text) {
  try {
    json j = json::parse(text);
    Progress p;
    p.rank = j.at("rank").get<int>();
    p.world_size = j.value("world_size", 0);
    p.entered = j.value("entered", std::uint64_t{0});
    p.completed = j.value("completed", std::uint64_t{0});
    p.published_at = j.value("published_at", 0.0);
    if (j.contains("last_entered")) p.last_entered = record_from_json(j["last_entered"]);
    if (j.contains("last_completed")) p.last_completed = record_from_json(j["last_completed"]);
    for (const auto& r : j.value("recent", json::array())) p.recent.push_back(record_from_json(r));
    return p;
  } catch (const json::exception& e) {
    throw StoreError(std::string("a rank's published collective progress is not valid JSON (") +
                     e.what() + "): " + text.substr(0, 200));
  }
}

std::string groups_key(int rank) { return "dtrain_diag/groups/" + std::to_string(rank); }

std::string progress_key(const std::string& gid, int rank) {
  return "dtrain_diag/" + gid + "/progress/" + std::to_string(rank);
}

std::string detail_key(const std::string& gid, std::uint64_t seq, int rank) {
  return "dtrain_diag/" + gid + "/detail/" + std::to_string(seq) + "/" + std::to_string(rank);
}

double now_epoch_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string format_time(double epoch_seconds) {
  if (epoch_seconds <= 0) return "-";
  auto whole = static_cast<std::time_t>(epoch_seconds);
  int ms = static_cast<int>((epoch_seconds - static_cast<double>(whole)) * 1000);
  std::tm tm{};
  ::gmtime_r(&whole, &tm);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03d UTC", tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

std::vector<std::string> describe_published(
    const std::function<std::optional<std::string>(const std::string&)>& get,
    const std::string& prefix, int world_size, int per_rank) {
  std::vector<std::string> lines;
  // Groups are numbered from 1 in the order each rank joined them; a job rarely has more
  // than a few, and a missing g<n> ends the scan.
  for (int g = 1; g <= 16; ++g) {
    std::string gid = "g";
    gid += std::to_string(g);  // (not "g" + ...: GCC 12's -Wrestrict false positive)
    std::vector<std::string> group_lines;
    for (int rank = 0; rank < world_size; ++rank) {
      auto text = get(prefix + progress_key(gid, rank));
      if (!text) {
        continue;
      }
      Progress p;
      try {
        p = decode_progress(*text);
      } catch (const Error& e) {
        group_lines.push_back("rank " + std::to_string(rank) + ": " + e.what());
        continue;
      }
      std::string head =
          "rank " + std::to_string(rank) + " (published " + format_time(p.published_at) + ")";
      if (p.recent.empty()) {
        group_lines.push_back(head + ": no collective yet");
        continue;
      }
      group_lines.push_back(head + ":");
      size_t first =
          p.recent.size() > static_cast<size_t>(per_rank) ? p.recent.size() - per_rank : 0;
      for (size_t i = first; i < p.recent.size(); ++i)
        group_lines.push_back("  " + format_record(p.recent[i]));
    }
    if (group_lines.empty()) {
      if (g > 1) break;
      continue;
    }
    lines.push_back("group " + gid + ":");
    for (auto& l : group_lines) lines.push_back("  " + l);
  }
  return lines;
}

}  // namespace diagnosis
}  // namespace dtrain
