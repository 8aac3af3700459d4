// What a rank publishes about its collectives, and how it is read back: the torch-free half
// of the flight recorder (dtrain/flight_recorder.h), shared by the workers (which write it,
// src/diagnosis/monitor.cpp) and the launcher's agent (which prints it in its failure summary
// and has no libtorch).
//
// Keys, under the store prefix the workers' group uses (/worker/attempt_<restart> under
// `dtrain run`):
//   dtrain_diag/groups/<rank>               add() counter: the n-th group this rank joined on
//                                           this store is "g<n>" (the same on every rank)
//   dtrain_diag/<gid>/progress/<rank>       JSON Progress, rewritten by the rank's watchdog
//   dtrain_diag/<gid>/detail/<seq>/<rank>   DETAIL mode's fingerprint of collective <seq>
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/flight_recorder.h"

namespace dtrain::diagnosis {

// A rank's published progress in one group.
struct Progress {
  int rank = -1;
  int world_size = 0;
  std::uint64_t entered = 0;    // seq of the last collective it entered (0: none yet)
  std::uint64_t completed = 0;  // seq of the last collective it completed
  double published_at = 0;      // seconds since the Unix epoch
  std::optional<CollectiveRecord> last_entered;
  std::optional<CollectiveRecord> last_completed;
  std::vector<CollectiveRecord> recent;  // its newest records, oldest first
};

std::string encode(const Progress& progress);
// Throws StoreError when `text` is not what encode() wrote.
Progress decode_progress(const std::string& text);

std::string groups_key(int rank);
std::string progress_key(const std::string& gid, int rank);
std::string detail_key(const std::string& gid, std::uint64_t seq, int rank);

// "10:32:01.123 UTC" for seconds since the Unix epoch.
std::string format_time(double epoch_seconds);
double now_epoch_seconds();

// The lines the launcher's failure summary shows: for each group (g1, g2, ...) and rank
// 0..world_size-1 whose progress `get` finds under `prefix` (get returns nullopt for a key
// that is not there), the rank's last `per_rank` records. Empty when no rank published.
std::vector<std::string> describe_published(
    const std::function<std::optional<std::string>(const std::string&)>& get,
    const std::string& prefix, int world_size, int per_rank = 4);

}  // namespace dtrain::diagnosis
