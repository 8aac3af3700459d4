// Ray Tune's stoppers (ray/tune/stopper/*.py, Ray 2.60), rule for rule. Where a line mirrors a
// non-obvious detail of Ray's code, the comment says which.
#include "dtrain/tune_stoppers.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dtrain/error.h"

namespace dtrain::tune {

namespace {

// numpy's pairwise summation of doubles (what np.add.reduce does over a contiguous array):
// under 8 values a plain loop, up to 128 eight accumulators added as a tree, then the rest.
// Summing in numpy's order keeps a plateau decision on a knife's edge the same as Ray's.
double pairwise_sum(const double* a, std::size_t n) {
  if (n < 8) {
    double res = -0.0;
    for (std::size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    std::size_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  std::size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

// np.std(values) (ddof 0) as numpy computes it: the mean, the squared deviations, their mean.
double np_std(const std::vector<double>& v) {
  const double n = static_cast<double>(v.size());
  const double mean = pairwise_sum(v.data(), v.size()) / n;
  std::vector<double> sq(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) sq[i] = (v[i] - mean) * (v[i] - mean);
  return std::sqrt(pairwise_sum(sq.data(), sq.size()) / n);
}

// A result's value as Python sees a number: a bool is 0 or 1; anything else is no number.
std::optional<double> number(const Result& result, const std::string& key) {
  if (!result.is_object()) return std::nullopt;
  auto it = result.find(key);
  if (it == result.end()) return std::nullopt;
  if (it->is_boolean()) return it->get<bool>() ? 1.0 : 0.0;
  if (it->is_number()) return it->get<double>();
  return std::nullopt;
}

}  // namespace

// ---- FunctionStopper ----------------------------------------------------------------------

FunctionStopper::FunctionStopper(Function fn) : fn_(std::move(fn)) {
  if (!fn_) {
    throw UsageError(
        "tune::FunctionStopper: the function is empty; pass a callable "
        "bool(const std::string& trial_id, const Result& result)");
  }
}

bool FunctionStopper::operator()(const std::string& trial_id, const Result& result) {
  return fn_(trial_id, result);
}

// ---- MaximumIterationStopper --------------------------------------------------------------

MaximumIterationStopper::MaximumIterationStopper(int max_iter) : max_iter_(max_iter) {}

bool MaximumIterationStopper::operator()(const std::string& trial_id, const Result&) {
  auto it =
      std::find_if(iter_.begin(), iter_.end(), [&](const auto& p) { return p.first == trial_id; });
  if (it == iter_.end()) it = iter_.insert(iter_.end(), {trial_id, 0});
  return ++it->second >= max_iter_;
}

// ---- TrialPlateauStopper ------------------------------------------------------------------

TrialPlateauStopper::TrialPlateauStopper(TrialPlateauOptions options) : o_(std::move(options)) {
  if (o_.metric.empty()) {
    throw UsageError("tune::TrialPlateauStopper: metric is required (the result key to watch)");
  }
  if (o_.num_results < 1) {
    // Ray's deque(maxlen=0) would hold nothing and np.std([]) is NaN: never a stop.
    throw UsageError("tune::TrialPlateauStopper: num_results must be >= 1, got " +
                     std::to_string(o_.num_results));
  }
  // Ray checks the mode only for a truthy threshold (`if self._metric_threshold:`).
  if (o_.metric_threshold && *o_.metric_threshold != 0 && o_.mode != "min" && o_.mode != "max") {
    throw UsageError(
        "tune::TrialPlateauStopper: with a metric_threshold, mode must be \"min\" or \"max\" "
        "(got \"" +
        o_.mode + "\"); set mode to say which side of the threshold a trial must reach");
  }
}

bool TrialPlateauStopper::operator()(const std::string& trial_id, const Result& result) {
  auto w = std::find_if(windows_.begin(), windows_.end(),
                        [&](const Window& x) { return x.trial_id == trial_id; });
  if (w == windows_.end()) w = windows_.insert(windows_.end(), Window{trial_id, 0, {}});
  const std::optional<double> value = number(result, o_.metric);
  w->values.push_back(value);
  if (static_cast<int>(w->values.size()) > o_.num_results) w->values.erase(w->values.begin());
  ++w->calls;
  if (w->calls < o_.grace_period) return false;
  if (static_cast<int>(w->values.size()) < o_.num_results) return false;
  if (o_.metric_threshold && (o_.mode == "min" || o_.mode == "max")) {
    if (!value) {
      // Ray compares None with the threshold and raises TypeError.
      throw UsageError("tune::TrialPlateauStopper: trial " + trial_id +
                       "'s result has no number \"" + o_.metric +
                       "\" to compare with metric_threshold; report it in every result");
    }
    if (o_.mode == "min" && *value > *o_.metric_threshold) return false;
    if (o_.mode == "max" && *value < *o_.metric_threshold) return false;
  }
  // Ray: np.std of the window, infinity when that raises (a None in it).
  std::vector<double> window;
  for (const auto& v : w->values) {
    if (!v) return false;
    window.push_back(*v);
  }
  return np_std(window) < o_.std;  // NaN: false, as in Python
}

// ---- ExperimentPlateauStopper -------------------------------------------------------------

ExperimentPlateauStopper::ExperimentPlateauStopper(ExperimentPlateauOptions options)
    : o_(std::move(options)) {
  const char* who = "tune::ExperimentPlateauStopper: ";
  if (o_.metric.empty()) throw UsageError(std::string(who) + "metric is required");
  if (o_.mode != "min" && o_.mode != "max") {
    throw UsageError(std::string(who) + "mode must be \"min\" or \"max\", got \"" + o_.mode + "\"");
  }
  if (o_.top <= 1) {
    throw UsageError(std::string(who) + "top (the best results to consider) must be > 1, got " +
                     std::to_string(o_.top));
  }
  if (o_.patience < 0) {
    throw UsageError(std::string(who) + "patience must be >= 0, got " +
                     std::to_string(o_.patience));
  }
  if (!(o_.std > 0)) {
    throw UsageError(std::string(who) + "std must be > 0, got " + std::to_string(o_.std));
  }
}

bool ExperimentPlateauStopper::operator()(const std::string& trial_id, const Result& result) {
  const std::optional<double> value = number(result, o_.metric);
  if (!value) {
    // Ray: result[metric] raises KeyError.
    throw UsageError("tune::ExperimentPlateauStopper: trial " + trial_id +
                     "'s result has no number \"" + o_.metric +
                     "\"; report it in every result, or watch another metric");
  }
  // Ray: sorted(values)[:top] for min, sorted(values)[-top:] for max; both ascending.
  top_values_.insert(std::upper_bound(top_values_.begin(), top_values_.end(), *value), *value);
  if (static_cast<int>(top_values_.size()) > o_.top) {
    if (o_.mode == "min") {
      top_values_.pop_back();
    } else {
      top_values_.erase(top_values_.begin());
    }
  }
  iterations_ = has_plateaued() ? iterations_ + 1 : 0;
  return stop_all();
}

bool ExperimentPlateauStopper::has_plateaued() const {
  return static_cast<int>(top_values_.size()) == o_.top && np_std(top_values_) <= o_.std;
}

bool ExperimentPlateauStopper::stop_all() { return has_plateaued() && iterations_ >= o_.patience; }

// ---- TimeoutStopper -----------------------------------------------------------------------

TimeoutStopper::TimeoutStopper(std::chrono::duration<double> timeout)
    : timeout_s_(timeout.count()), budget_s_(timeout.count()) {
  if (!(timeout_s_ >= 0)) {
    throw UsageError("tune::TimeoutStopper: timeout must be >= 0 seconds, got " +
                     std::to_string(timeout_s_));
  }
}

bool TimeoutStopper::stop_all() {
  const auto now = std::chrono::steady_clock::now();
  // Ray starts counting at the first call, so the setup before it is not charged.
  if (last_check_) budget_s_ -= std::chrono::duration<double>(now - *last_check_).count();
  last_check_ = now;
  return budget_s_ <= 0;
}

Config TimeoutStopper::saved_state() const { return {{"budget_s", budget_s_}}; }

void TimeoutStopper::restore_state(const Config& state) {
  const auto it = state.find("budget_s");
  if (it == state.end() || !it->is_number()) return;  // another stopper's: keep this one's
  budget_s_ = it->get<double>();
  last_check_.reset();
}

// ---- CombinedStopper ----------------------------------------------------------------------

CombinedStopper::CombinedStopper(std::vector<std::shared_ptr<Stopper>> stoppers)
    : stoppers_(std::move(stoppers)) {
  for (std::size_t i = 0; i < stoppers_.size(); ++i) {
    if (!stoppers_[i]) {
      throw UsageError("tune::CombinedStopper: stopper " + std::to_string(i) +
                       " is null; pass only stoppers that exist");
    }
  }
}

bool CombinedStopper::operator()(const std::string& trial_id, const Result& result) {
  for (auto& s : stoppers_) {
    if ((*s)(trial_id, result)) return true;
  }
  return false;
}

bool CombinedStopper::stop_all() {
  for (auto& s : stoppers_) {
    if (s->stop_all()) return true;
  }
  return false;
}

Config CombinedStopper::saved_state() const {
  Config out = Config::array();
  bool any = false;
  for (const auto& s : stoppers_) {
    out.push_back(s->saved_state());
    any = any || !out.back().is_null();
  }
  return any ? out : Config(nullptr);
}

void CombinedStopper::restore_state(const Config& state) {
  if (!state.is_array() || state.size() != stoppers_.size()) return;  // another combination
  for (std::size_t i = 0; i < stoppers_.size(); ++i) {
    if (!state[i].is_null()) stoppers_[i]->restore_state(state[i]);
  }
}

}  // namespace dtrain::tune
