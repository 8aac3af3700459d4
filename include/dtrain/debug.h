// Debugging collectives: the stall report and DETAIL mode (PyTorch's
// TORCH_DISTRIBUTED_DEBUG=DETAIL and its flight recorder, for dtrain's groups).
//
// Levels (DTRAIN_DEBUG, or ProcessGroupOptions::debug, or set_debug_level()):
//   off     nothing is recorded or checked (the cost of a collective is Gloo's alone).
//   info    the default. The flight recorder (dtrain/flight_recorder.h) and the stall
//           watchdog: when a collective has waited stall_timeout, ONE report on stderr names
//           the ranks that have not entered it and what each of them last completed:
//
//             dtrain: stall report (group g1, rank 0 of 2): all_reduce #4 float32 [4] has
//             waited 1.0 s (stall timeout 1.0 s), since 10:32:01.123 UTC
//               not entered by 1 rank(s): 1
//                 rank 1: last completed #3 all_reduce float32 [4] at 10:32:00.101 UTC (2.0 s ago);
//                 ...
//               entered by: 0
//
//           Each rank's watchdog thread publishes its progress (last entered and last
//           completed collective) to the group's store at most once per tick (stall_timeout/4,
//           between 50 ms and 1 s), only when it changed; the report reads the other ranks'
//           published progress, so it can be up to one tick stale.
//           A collective counts as waiting from its issue until its Work is waited for (or
//           destroyed): an async Work kept unwaited longer than stall_timeout is reported too.
//   detail  info, plus: before each collective every rank publishes its fingerprint
//           (sequence number, op, dtype, shapes) through the store and compares it with every
//           other rank's. A mismatch throws CollectiveMismatchError on every rank, naming the
//           ranks on each side and both fingerprints, before anything is sent (so no rank
//           hangs in a collective its peers never enter). Costs a store round trip per rank
//           per collective: for finding a bug, not for production runs.
//
// stall_timeout (DTRAIN_STALL_TIMEOUT in seconds, or ProcessGroupOptions::stall_timeout, or
// set_stall_timeout()): default 60 s; it should stay below the group's timeout (30 min by
// default), which is when the collective fails.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "dtrain/error.h"

namespace dtrain {

class ProcessGroup;

enum class DebugLevel { kOff, kInfo, kDetail };

// "off", "info" or "detail" (any case); throws UsageError for anything else, naming the
// accepted values. `what` names the source in the message (e.g. "DTRAIN_DEBUG").
DebugLevel parse_debug_level(const std::string& text, const std::string& what);
const char* to_string(DebugLevel level);

// The ranks disagree on the next collective of a group (DETAIL mode). Thrown on every rank
// of the group; what() names the ranks on each side and their fingerprints, e.g.
//   collective mismatch at #5 of group g1 (seen by rank 0 of 2): rank 1 called
//   broadcast float32 [4] but ranks 0 called all_reduce float32 [4]
// The group stays usable: nothing was sent.
class CollectiveMismatchError : public UsageError {
 public:
  using UsageError::UsageError;
};

// Changes `group`'s level from now on. Every rank must make the same change between the same
// two collectives (DETAIL's check is collective).
void set_debug_level(ProcessGroup& group, DebugLevel level);
DebugLevel debug_level(const ProcessGroup& group);

// Changes `group`'s stall timeout (> 0; UsageError otherwise).
void set_stall_timeout(ProcessGroup& group, std::chrono::milliseconds timeout);
std::chrono::milliseconds stall_timeout(const ProcessGroup& group);

// The last stall report this rank printed for `group`, if any.
std::optional<std::string> last_stall_report(const ProcessGroup& group);

}  // namespace dtrain
