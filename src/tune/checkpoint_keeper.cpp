// Which of a trial's checkpoints the search keeps; see checkpoint_keeper.h.
#include "tune/checkpoint_keeper.h"

#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "tune/trial_files.h"

namespace dtrain::tune::detail {

namespace {

// Ray's unflattened_lookup: "a/b" walks nested objects ("a/0" a list's element); nullptr when
// a step is missing.
const Config* lookup(const Result& metrics, const std::string& key) {
  if (metrics.is_object() && metrics.contains(key)) return &metrics.at(key);
  const Config* at = &metrics;
  std::size_t from = 0;
  for (;;) {
    const std::size_t slash = key.find('/', from);
    const std::string part = key.substr(from, slash == std::string::npos ? slash : slash - from);
    if (at->is_object() && at->contains(part)) {
      at = &at->at(part);
    } else if (at->is_array() && !part.empty() &&
               part.find_first_not_of("0123456789") == std::string::npos &&
               std::stoull(part) < at->size()) {
      at = &at->at(std::stoull(part));
    } else {
      return nullptr;
    }
    if (slash == std::string::npos) return at;
    from = slash + 1;
  }
}

// A value as a Python number (bool is one); nullopt for anything else.
std::optional<double> number(const Config& v) {
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  if (v.is_number()) return v.get<double>();
  return std::nullopt;
}

}  // namespace

void check_checkpoint_config(const CheckpointConfig& c) {
  if (c.num_to_keep < 0) {
    throw UsageError(
        "tune::Tuner: checkpoint_config.num_to_keep must be >= 1 (0 keeps every "
        "checkpoint), got " +
        std::to_string(c.num_to_keep));
  }
  if (c.checkpoint_score_order != "max" && c.checkpoint_score_order != "min") {
    throw UsageError(
        "tune::Tuner: checkpoint_config.checkpoint_score_order must be \"max\" or "
        "\"min\", got \"" +
        c.checkpoint_score_order + "\"");
  }
  // Ray 2.60 raises ValueError for both with a function trainable (Experiment.__init__), and
  // CheckpointConfig itself refuses a negative frequency.
  if (c.checkpoint_frequency < 0) {
    throw UsageError("tune::Tuner: checkpoint_config.checkpoint_frequency must be >= 0, got " +
                     std::to_string(c.checkpoint_frequency));
  }
  if (c.checkpoint_frequency != 0) {
    throw UsageError(
        "tune::Tuner: checkpoint_config.checkpoint_frequency cannot be set for a function "
        "trainable (got " +
        std::to_string(c.checkpoint_frequency) +
        ", as Ray Tune refuses it); report a checkpoint every that many iterations with "
        "tune::report(metrics, dir) in the trainable and leave it 0");
  }
  if (c.checkpoint_at_end) {
    throw UsageError(
        "tune::Tuner: checkpoint_config.checkpoint_at_end cannot be used with a function "
        "trainable (as Ray Tune refuses it); report a checkpoint with the trainable's last "
        "tune::report(metrics, dir) and leave it false");
  }
}

std::pair<bool, double> CheckpointKeeper::score(const Result& metrics) const {
  // Ray: the flattened result's value, -inf (and an error in its log) when it has none.
  const Config flat = flatten(metrics);
  const std::string& key = config_.checkpoint_score_attribute;
  if (!flat.contains(key)) return {true, -std::numeric_limits<double>::infinity()};
  const auto v = number(flat.at(key));
  if (!v) {
    throw UsageError("tune: cannot keep a checkpoint by checkpoint_score_attribute \"" + key +
                     "\": the result it came with has " + flat.at(key).dump() +
                     " there, not a number; report a number under that key, or choose another "
                     "attribute in TuneOptions::checkpoint_config");
  }
  const double s = (config_.checkpoint_score_order == "max" ? 1.0 : -1.0) * *v;
  if (std::isnan(s)) return {false, -std::numeric_limits<double>::infinity()};
  return {true, s};
}

std::vector<std::string> CheckpointKeeper::add(const std::string& path, const Result& metrics) {
  latest_ = path;
  const std::string& key = config_.checkpoint_score_attribute;
  KeptCheckpoint item{path, metrics};
  if (!key.empty() && metrics.is_object() && metrics.contains(key)) {
    // After every checkpoint that scores the same or lower (Ray's _insert_into_sorted_list).
    const auto mine = score(metrics);
    std::size_t i = 0;
    while (i < kept_.size() && !(score(kept_[i].metrics) > mine)) ++i;
    kept_.insert(kept_.begin() + static_cast<std::ptrdiff_t>(i), std::move(item));
  } else {
    kept_.push_back(std::move(item));
  }
  std::vector<std::string> gone;
  if (config_.num_to_keep <= 0 || kept_.size() <= static_cast<std::size_t>(config_.num_to_keep))
    return gone;
  const std::size_t worst = kept_.size() - static_cast<std::size_t>(config_.num_to_keep);
  std::vector<KeptCheckpoint> still;
  for (std::size_t i = 0; i < kept_.size(); ++i) {
    if (i < worst && kept_[i].path != latest_) {
      gone.push_back(kept_[i].path);
    } else {
      still.push_back(std::move(kept_[i]));
    }
  }
  kept_ = std::move(still);
  return gone;
}

std::vector<KeptCheckpoint> CheckpointKeeper::best() const {
  if (config_.num_to_keep <= 0 || kept_.size() <= static_cast<std::size_t>(config_.num_to_keep))
    return kept_;
  return {kept_.end() - config_.num_to_keep, kept_.end()};
}

Config CheckpointKeeper::to_json() const {
  Config list = Config::array();
  for (const auto& k : kept_) list.push_back({{"path", k.path}, {"metrics", k.metrics}});
  return {{"kept", list}, {"latest", latest_}};
}

void CheckpointKeeper::from_json(const Config& saved) {
  kept_.clear();
  for (const auto& k : saved.value("kept", Config::array()))
    kept_.push_back({k.at("path").get<std::string>(), k.at("metrics")});
  latest_ = saved.value("latest", "");
}

std::string best_checkpoint_of(const std::vector<std::pair<std::string, Result>>& checkpoints,
                               const std::string& metric, const std::string& mode,
                               const std::string& trial) {
  if (checkpoints.empty()) {
    throw UsageError("tune: trial " + trial +
                     " kept no checkpoint (it reported none): "
                     "get_best_checkpoint needs a trial that reported checkpoints");
  }
  if (mode != "max" && mode != "min") {
    throw UsageError("tune: get_best_checkpoint: mode must be \"max\" or \"min\", got \"" + mode +
                     "\"");
  }
  const std::string* best = nullptr;
  double best_value = 0;
  std::set<std::string> keys;
  for (const auto& [path, metrics] : checkpoints) {
    for (auto it = metrics.begin(); metrics.is_object() && it != metrics.end(); ++it)
      keys.insert(it.key());
    const Config* v = lookup(metrics, metric);
    if (v == nullptr || v->is_null()) continue;
    const auto x = number(*v);
    if (!x) {
      throw UsageError("tune: get_best_checkpoint: trial " + trial + "'s \"" + metric + "\" is " +
                       v->dump() + ", not a number");
    }
    // Python's max/min: the first stays unless a later one compares above (below) it.
    if (best == nullptr || (mode == "max" ? *x > best_value : *x < best_value)) {
      best = &path;
      best_value = *x;
    }
  }
  if (best == nullptr) {
    std::string names;
    for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
    throw UsageError("tune: get_best_checkpoint: no checkpoint of trial " + trial +
                     " has the metric \"" + metric + "\"; its results have " + names);
  }
  return *best;
}

}  // namespace dtrain::tune::detail
