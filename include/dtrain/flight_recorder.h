// The collective flight recorder: every rank remembers its recent collectives.
//
// Each dtrain::ProcessGroup keeps a ring buffer of its last collectives (default 256): a
// sequence number (1, 2, ... per group, the same on every rank since every rank issues the
// group's collectives in the same order), the op, dtype and shapes, start and end time, and
// whether it completed, failed, is still in flight, or was never waited for. It is always on
// (the cost is one mutex and a few small strings per collective; bench/diagnosis_bench.cpp
// measures it) unless DTRAIN_DEBUG=off.
//
// Where it shows up without any code:
//   - a collective that times out or loses a peer throws an error whose message ends with
//     this rank's recent collectives;
//   - a watchdog thread publishes a digest of the buffer to the job's store (at most once
//     per tick, only when it changed), so `dtrain run`'s failure summary lists what every
//     rank last did, including ranks that were SIGKILLed;
//   - the stall report (dtrain/debug.h) names the ranks that have not entered a collective
//     and what each of them last completed.
// Point-to-point send/recv are not recorded (only two ranks take part, so they have no
// group-wide sequence number).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtrain {

class ProcessGroup;

enum class CollectiveState {
  kStarted,    // issued, not completed yet (or completed in the background, not waited for)
  kCompleted,  // wait() returned
  kFailed,     // wait() threw, or the DETAIL check rejected it
  kUnwaited,   // its Work was destroyed without wait() (it completes in the background)
};

// "started", "completed", "failed", "unwaited".
const char* to_string(CollectiveState state);

struct CollectiveRecord {
  std::uint64_t seq = 0;  // 1-based, per group; the same collective has the same seq on every rank
  std::string op;         // "all_reduce", "broadcast", ...
  std::string dtype;      // "float32", ... ("-" for barrier)
  std::string shapes;     // "[4, 3]"; several tensors: "[4, 3] [2]"
  int rank = -1;          // the recording rank, in its group
  double start_time = 0;  // seconds since the Unix epoch
  double end_time = 0;    // 0 while started
  CollectiveState state = CollectiveState::kStarted;
  std::string error;  // why it failed (first line), when kFailed
};

// One line: "#12 all_reduce float32 [4] completed at 10:32:01.123 UTC (1.2 ms)".
std::string format_record(const CollectiveRecord& record);

// The recent collectives of `group` on this rank, oldest first (empty with DTRAIN_DEBUG=off).
std::vector<CollectiveRecord> recent_collectives(const ProcessGroup& group);

// The same as text, one format_record() line per collective, each preceded by `indent`.
std::string format_recent_collectives(const ProcessGroup& group, const std::string& indent = "  ");

}  // namespace dtrain
