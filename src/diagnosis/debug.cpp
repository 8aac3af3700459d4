// The public face of collective diagnosis (dtrain/debug.h, dtrain/flight_recorder.h): thin
// wrappers over the group's GroupMonitor.
#include "dtrain/debug.h"

#include <cctype>

#include "diagnosis/monitor.h"
#include "dtrain/flight_recorder.h"
#include "dtrain/process_group.h"

namespace dtrain {

namespace {

diagnosis::GroupMonitor& monitor_of(const ProcessGroup& group) {
  DTRAIN_ASSERT(group.monitor() != nullptr, "every ProcessGroup has a GroupMonitor");
  return *group.monitor();
}

}  // namespace

DebugLevel parse_debug_level(const std::string& text, const std::string& what) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "off") return DebugLevel::kOff;
  if (t == "info") return DebugLevel::kInfo;
  if (t == "detail") return DebugLevel::kDetail;
  throw UsageError(
      what + "='" + text +
      "' is not a debug level; use off (no recording), info (the default: flight recorder "
      "and stall report) or detail (info plus a cross-rank check of every collective)");
}

const char* to_string(DebugLevel level) {
  switch (level) {
    case DebugLevel::kOff:
      return "off";
    case DebugLevel::kInfo:
      return "info";
    case DebugLevel::kDetail:
      return "detail";
  }
  return "?";
}

void set_debug_level(ProcessGroup& group, DebugLevel level) { monitor_of(group).set_level(level); }
DebugLevel debug_level(const ProcessGroup& group) { return monitor_of(group).level(); }

void set_stall_timeout(ProcessGroup& group, std::chrono::milliseconds timeout) {
  monitor_of(group).set_stall_timeout(timeout);
}
std::chrono::milliseconds stall_timeout(const ProcessGroup& group) {
  return monitor_of(group).stall_timeout();
}

std::optional<std::string> last_stall_report(const ProcessGroup& group) {
  return monitor_of(group).last_stall_report();
}

std::vector<CollectiveRecord> recent_collectives(const ProcessGroup& group) {
  return monitor_of(group).recent();
}

std::string format_recent_collectives(const ProcessGroup& group, const std::string& indent) {
  std::string out;
  for (const auto& r : recent_collectives(group)) out += indent + format_record(r) + "\n";
  return out;
}

}  // namespace dtrain
