// Which of a trial's checkpoints the search keeps on disk (TuneOptions::checkpoint_config), as
// Ray 2.60's _CheckpointManager (ray/train/_internal/checkpoint_manager.py) decides it:
//   - the checkpoints are listed worst first: by checkpoint_score_attribute (order "max": the
//     largest last; "min": the smallest last), a checkpoint whose result has that key at its top
//     level placed after every one that scores the same or lower; a NaN score below every number;
//     a result without the key (or no attribute set) appended last, as by recency;
//   - with num_to_keep, every checkpoint but the last num_to_keep goes, except the latest one,
//     which stays until a newer one comes (so the list can hold num_to_keep + 1);
//   - best(): the last num_to_keep of the list (all without num_to_keep), Ray's
//     best_checkpoint_results, which Result.best_checkpoints lists.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dtrain/tune.h"

namespace dtrain::tune::detail {

struct KeptCheckpoint {
  std::string path;
  Result metrics;  // the result it was reported with
};

class CheckpointKeeper {
 public:
  CheckpointKeeper() = default;
  explicit CheckpointKeeper(CheckpointConfig config) : config_(std::move(config)) {}

  // The trial's newest checkpoint and its result; returns the paths no longer kept (the caller
  // deletes them). UsageError: the result's score attribute is not a number (Ray's "Unable to
  // persist checkpoint ... must be numerical").
  std::vector<std::string> add(const std::string& path, const Result& metrics);
  std::vector<KeptCheckpoint> best() const;
  const std::vector<KeptCheckpoint>& all() const { return kept_; }
  const std::string& latest() const { return latest_; }

  // tuner_state.json's form, and back (a resumed search keeps deciding from there).
  Config to_json() const;
  void from_json(const Config& saved);

 private:
  // (not NaN, order * value), compared as Python compares the tuples.
  std::pair<bool, double> score(const Result& metrics) const;

  CheckpointConfig config_;
  std::vector<KeptCheckpoint> kept_;  // worst first
  std::string latest_;
};

// Checks a CheckpointConfig as Ray's CheckpointConfig and _CheckpointManager check theirs, and
// refuses checkpoint_frequency / checkpoint_at_end as Ray refuses them for a function
// trainable; UsageError naming the field.
void check_checkpoint_config(const CheckpointConfig& config);

// Ray's Result.get_best_checkpoint(metric, mode) over `best_checkpoints`.
std::string best_checkpoint_of(const std::vector<std::pair<std::string, Result>>& checkpoints,
                               const std::string& metric, const std::string& mode,
                               const std::string& trial);

}  // namespace dtrain::tune::detail
