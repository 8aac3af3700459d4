// Stoppers for dtrain::tune: Ray Tune's tune.Stopper classes (ray/tune/stopper/, Ray 2.60) with
// their parameters, defaults and rules.
//
//     using namespace dtrain::tune;
//     Tuner tuner(train, space, {.metric = "loss", .mode = "min",
//         .stopper = std::make_shared<CombinedStopper>(
//             std::make_shared<MaximumIterationStopper>(20),
//             std::make_shared<TrialPlateauStopper>(TrialPlateauOptions{.metric = "loss"})),
//         .time_budget = std::chrono::minutes(30)});
//
// How the Tuner drives a stopper (Ray's TuneController does the same):
//   1. Every result of a running trial goes to `(*stopper)(trial_id, result)` first, before
//      the `stop` dict and before the scheduler; true ends the trial there: TERMINATED, that
//      result marked "done": true, and neither the `stop` dict nor the scheduler is asked
//      about it. The result is the one Ray's stopper gets: not flattened ("config" is an
//      object), with every field the Tuner adds (dtrain/tune.h, report()).
//   2. `stop_all()` after every result and every ended run, and every 100 ms otherwise (Ray:
//      after every event, or after 0.1 s without one), the first time before any trial starts. True
//      ends the search: every trial not yet TERMINATED or ERROR becomes TERMINATED (PENDING and
//      PAUSED ones too, without running); a running trial's next report is answered "stop" and not
//      recorded, so its last result is the one before (not marked done, as in Ray). The scheduler
//      is not told (Ray's _schedule_trial_stop). fit() returns the grid as usual: no error.
//   3. A trial whose trainable returns has its last result (now "done": true) given to the
//      stopper once more, as Ray's function trainable sends it again (__duplicate__); so an
//      ExperimentPlateauStopper counts a finished trial's last value twice, as Ray's does.
// What a stopper throws ends the search as a refused result does: fit() throws UsageError.
// Stoppers are not thread-safe: the Tuner calls them from its one driver thread.
// On `resume` the stopper goes on where it was, as Ray's (Tuner.restore takes back the stopper
// its experiment state pickled): the saved results are replayed into it in the order they
// arrived (the ones a trial reports again after a restore from its checkpoint included, and a
// returned trial's last one twice), so counting and plateau stoppers count on from there; what
// results do not give back is saved with the search (saved_state()): a TimeoutStopper's budget
// goes on from what was left, as Ray's does.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/tune_schedulers.h"

namespace dtrain::tune {

// Ray's tune.Stopper. Derive and implement both (Ray's base raises NotImplementedError).
class Stopper {
 public:
  virtual ~Stopper() = default;
  // True: the trial `trial_id` is to end at `result`.
  virtual bool operator()(const std::string& trial_id, const Result& result) = 0;
  // True: the whole search is to end now.
  virtual bool stop_all() = 0;
  // What the Tuner saves with the search for a resumed one to give back to restore_state(),
  // beyond the results it replays (Ray pickles the whole stopper). Default: null, nothing.
  virtual Config saved_state() const { return nullptr; }
  // Takes back what saved_state() gave (never called with null). Default: nothing.
  virtual void restore_state(const Config& state) { (void)state; }
};

// Ray's FunctionStopper, the form of `RunConfig(stop=callable)`: a trial ends when `fn`
// returns true; never stops the search.
class FunctionStopper : public Stopper {
 public:
  using Function = std::function<bool(const std::string& trial_id, const Result& result)>;
  // UsageError: `fn` is empty.
  explicit FunctionStopper(Function fn);
  bool operator()(const std::string& trial_id, const Result& result) override;
  bool stop_all() override { return false; }

 private:
  Function fn_;
};

// Ray's MaximumIterationStopper: a trial ends at its max_iter-th result seen by this stopper
// (it counts the calls, not training_iteration: a restored trial counts on).
class MaximumIterationStopper : public Stopper {
 public:
  explicit MaximumIterationStopper(int max_iter);
  bool operator()(const std::string& trial_id, const Result& result) override;
  bool stop_all() override { return false; }

 private:
  int max_iter_;
  std::vector<std::pair<std::string, int>> iter_;  // trial id -> calls
};

// Ray's TrialPlateauStopper.
struct TrialPlateauOptions {
  std::string metric;                      // required: the result key to watch
  double std = 0.01;                       // plateau: population sd of the window below this
  int num_results = 4;                     // the window: the trial's last num_results values
  int grace_period = 4;                    // no stop before a trial's grace_period-th result
  std::optional<double> metric_threshold;  // also required to be reached (by `mode`)
  std::string mode;                        // "min" | "max"; required with a non-zero threshold
};

// A trial ends when, after its grace period and with a full window, the population standard
// deviation of its last num_results values of `metric` is < std (and, with metric_threshold
// and a mode, the latest value is <= it for "min" or >= it for "max"). A result without the
// metric puts a hole in the window (Ray appends None): no stop while it is there (with a
// threshold set and a mode, UsageError at that result, where Ray's comparison raises).
// Ray's quirk kept: a metric_threshold of exactly 0 needs no mode and is then not checked.
class TrialPlateauStopper : public Stopper {
 public:
  // UsageError: metric empty; num_results < 1 (Ray's empty window never stops); a non-zero
  // metric_threshold without mode "min"/"max".
  explicit TrialPlateauStopper(TrialPlateauOptions options);
  bool operator()(const std::string& trial_id, const Result& result) override;
  bool stop_all() override { return false; }

 private:
  struct Window {
    std::string trial_id;
    int calls = 0;
    std::vector<std::optional<double>> values;  // at most num_results, oldest first
  };
  TrialPlateauOptions o_;
  std::vector<Window> windows_;
};

// Ray's ExperimentPlateauStopper.
struct ExperimentPlateauOptions {
  std::string metric;  // required: every result must have it (UsageError at one without)
  double std = 0.001;  // plateau: population sd of the top values <= this
  int top = 10;        // how many best values (by mode) across all trials to keep
  std::string mode = "min";
  int patience = 0;  // results in a row that must find a plateau before the search ends
};

// Keeps the `top` best values of `metric` over every result of every trial. A result after
// which there are `top` of them with population sd <= std counts a plateau (one without resets
// the count); once `patience` results in a row found one, stop_all() and every later call
// return true, and the trial whose result got there is stopped with the search.
class ExperimentPlateauStopper : public Stopper {
 public:
  // UsageError (Ray's ValueError): metric empty, mode not "min"/"max", top <= 1,
  // patience < 0, std <= 0.
  explicit ExperimentPlateauStopper(ExperimentPlateauOptions options);
  bool operator()(const std::string& trial_id, const Result& result) override;
  bool stop_all() override;

 private:
  bool has_plateaued() const;
  ExperimentPlateauOptions o_;
  int iterations_ = 0;
  std::vector<double> top_values_;  // sorted ascending, at most `top`
};

// Ray's TimeoutStopper (also what TuneOptions::time_budget adds): the search ends once
// `timeout` has passed, counted from the first stop_all() call (the Tuner's first look, before
// any trial starts), as the sum of the wall-clock gaps between calls. Never stops one trial.
class TimeoutStopper : public Stopper {
 public:
  // UsageError: a negative timeout (Ray takes it and stops at once).
  explicit TimeoutStopper(std::chrono::duration<double> timeout);
  bool operator()(const std::string&, const Result&) override { return false; }
  bool stop_all() override;
  // {"budget_s": what is left}. A resumed search goes on with it, its clock starting again at
  // the next stop_all() (Ray's __setstate__ clears _last_check).
  Config saved_state() const override;
  void restore_state(const Config& state) override;

 private:
  double timeout_s_;
  double budget_s_;
  std::optional<std::chrono::steady_clock::time_point> last_check_;
};

// Ray's CombinedStopper: a trial ends if any stopper says so, the search if any stop_all()
// does. Every stopper is asked in order until one says true (Python's any(): the later ones
// are not called for that result, so their counts skip it, as in Ray).
class CombinedStopper : public Stopper {
 public:
  // UsageError: a null stopper.
  explicit CombinedStopper(std::vector<std::shared_ptr<Stopper>> stoppers);
  template <class... S>
  explicit CombinedStopper(std::shared_ptr<S>... stoppers)
      : CombinedStopper(std::vector<std::shared_ptr<Stopper>>{std::move(stoppers)...}) {}
  bool operator()(const std::string& trial_id, const Result& result) override;
  bool stop_all() override;
  // The stoppers' states in order (null when none has one); restored by position when the
  // saved list is as long as this one's stoppers.
  Config saved_state() const override;
  void restore_state(const Config& state) override;

 private:
  std::vector<std::shared_ptr<Stopper>> stoppers_;
};

}  // namespace dtrain::tune
