// Trial schedulers for dtrain::tune: FIFO, ASHA and PBT with Ray Tune's parameters, defaults
// and decision rules (ray/tune/schedulers/{trial_scheduler,async_hyperband,pbt}.py, Ray 2.60).
//
// The protocol, as Ray's TuneController drives a TrialScheduler (the Tuner does the same):
//   1. on_trial_add(ctx, trial) once per trial, in the order trials are created.
//   2. choose_trial_to_run(ctx) whenever there is room for another trial.
//   3. on_trial_result(ctx, trial, result) for every tune::report() of a running trial; the
//      Decision says what to do with it (Stop ends it as TERMINATED, Pause checkpoints and
//      requeues it, Noop: the scheduler already acted through ctx, e.g. PBT's exploit).
//   4. on_trial_complete(ctx, trial, last_result) when a trial ends normally or is stopped
//      by a Stop decision; on_trial_error(ctx, trial) when it fails for good.
// Schedulers are not thread-safe: the Tuner calls them from its one driver thread.
//
// Random decisions (ASHA's bracket for a new trial, PBT's explore and exploit) draw from a
// RandomSource (dtrain/tune_search_space.h). Ray draws from numpy's and Python's global
// generators; the parity test (tests/tune) replays the same recorded draws into both, with
// these mappings: random.random() = u, random.choice(seq) = seq[floor(u * len)], numpy's
// choice(n, p) = the first index whose cumulative probability exceeds u.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/tune_search_space.h"

namespace dtrain::tune {

// A result: the metrics of one tune::report() plus the fields the Tuner fills in as Ray does
// (training_iteration, time_total_s, time_this_iter_s, iterations_since_restore, trial_id,
// config, ...; dtrain/tune.h). Schedulers get it flattened as Ray's do: the config's keys as
// "config/<key>", nested ones joined by "/".
using Result = nlohmann::ordered_json;

enum class TrialStatus { Pending, Running, Paused, Terminated, Error };
const char* to_string(TrialStatus status);  // "PENDING", "RUNNING", ... as Ray spells them

enum class Decision { Continue, Pause, Stop, Noop };
const char* to_string(Decision decision);  // "CONTINUE", "PAUSE", "STOP", "NOOP"

// What a scheduler sees of a trial.
struct Trial {
  std::string id;
  TrialStatus status = TrialStatus::Pending;
  Config config;
  std::string experiment_tag;
  bool is_finished() const {
    return status == TrialStatus::Terminated || status == TrialStatus::Error;
  }
};

// What the driver offers a scheduler (Ray's TuneController as schedulers use it).
class SchedulerContext {
 public:
  virtual ~SchedulerContext() = default;
  // Every trial, in the order added.
  virtual std::vector<Trial*> trials() = 0;
  // The checkpoint of `trial`'s latest result, to be cloned later; "" when it has none
  // (Ray: _schedule_trial_save resolving to that result's checkpoint).
  virtual std::string save_checkpoint(Trial& trial) = 0;
  // Stop `trial` without ending it: it will be started again (status Paused).
  virtual void pause_trial(Trial& trial) = 0;
  // PBT exploit: `trial` continues from `checkpoint` (another trial's) with `config`. The
  // driver applies it when the trial next starts. `trial` is paused first by the caller.
  virtual void restore_trial(Trial& trial, const Config& config, const std::string& checkpoint,
                             const std::string& checkpoint_trial_id) = 0;
};

class TrialScheduler {
 public:
  virtual ~TrialScheduler() = default;
  virtual std::string name() const = 0;
  // Called by the Tuner with its metric and mode; a scheduler keeps the ones it was given.
  // UsageError: neither the scheduler nor the Tuner names a metric and a mode.
  virtual void set_search_properties(const std::string& metric, const std::string& mode);
  virtual void on_trial_add(SchedulerContext& ctx, Trial& trial);
  virtual Decision on_trial_result(SchedulerContext& ctx, Trial& trial, const Result& result) = 0;
  virtual void on_trial_complete(SchedulerContext& ctx, Trial& trial, const Result& result);
  virtual void on_trial_error(SchedulerContext& ctx, Trial& trial);
  // Ray's FIFOScheduler: the first pending trial, else the first paused one; nullptr if none.
  virtual Trial* choose_trial_to_run(SchedulerContext& ctx);
  // Replaces where random decisions come from (default: SeededRandom(0), or the Tuner's
  // seed when the scheduler runs under a Tuner and no source was set here).
  void set_random(std::shared_ptr<RandomSource> random) {
    random_ = std::move(random);
    random_set_ = true;
  }
  void seed_random(std::uint64_t seed) {
    if (!random_set_) random_ = std::make_shared<SeededRandom>(seed);
  }

 protected:
  RandomSource& random() { return *random_; }
  std::string metric_;
  std::string mode_;
  double metric_op_ = 0;  // +1 max, -1 min, 0 unset

  void set_metric_mode(const std::string& metric, const std::string& mode, const char* who);

 private:
  std::shared_ptr<RandomSource> random_ = std::make_shared<SeededRandom>(0);
  bool random_set_ = false;
};

// Runs every trial to its end (Ray's FIFOScheduler).
class FifoScheduler : public TrialScheduler {
 public:
  std::string name() const override { return "FIFO"; }
  Decision on_trial_result(SchedulerContext&, Trial&, const Result&) override {
    return Decision::Continue;
  }
};

// Asynchronous successive halving (Ray's AsyncHyperBandScheduler / ASHAScheduler).
struct AshaOptions {
  std::string time_attr = "training_iteration";  // must increase monotonically
  std::string metric;                            // default: the Tuner's
  std::string mode;                              // "min" | "max"; default: the Tuner's
  double max_t = 100;                            // a trial is stopped once time_attr reaches it
  double grace_period = 1;                       // the first rung: no trial stops before this
  double reduction_factor = 4;  // rungs at grace_period * rf^k; keeps the top 1/rf at each
  int brackets = 1;             // bracket s starts at grace_period * rf^s
  bool stop_last_trials = true;
};

class AshaScheduler : public TrialScheduler {
 public:
  // UsageError for what Ray asserts: max_t > 0, grace_period in (0, max_t],
  // reduction_factor > 1, brackets > 0, mode in {min, max}.
  explicit AshaScheduler(AshaOptions options = {});
  std::string name() const override { return "ASHA"; }
  void set_search_properties(const std::string& metric, const std::string& mode) override;
  void on_trial_add(SchedulerContext& ctx, Trial& trial) override;
  Decision on_trial_result(SchedulerContext& ctx, Trial& trial, const Result& result) override;
  void on_trial_complete(SchedulerContext& ctx, Trial& trial, const Result& result) override;

  // The rung milestones of bracket b, highest first (as Ray stores them), and the cutoff
  // of a rung: numpy's nanpercentile of the recorded scores at (1 - 1/rf) * 100, linear.
  std::vector<double> milestones(int bracket) const;
  int num_stopped() const { return num_stopped_; }

 private:
  struct Rung {
    double milestone;
    std::vector<std::pair<std::string, double>> recorded;  // trial id -> score, in order
  };
  struct Bracket {
    std::vector<Rung> rungs;  // highest milestone first
  };
  Decision bracket_on_result(Bracket& b, const std::string& trial_id, double cur_iter,
                             double cur_rew);
  bool cutoff(const Rung& rung, double* out) const;

  AshaOptions o_;
  std::vector<Bracket> brackets_;
  std::vector<std::pair<std::string, int>> trial_bracket_;  // trial id -> bracket index
  int num_stopped_ = 0;
};

// Population based training, asynchronous mode (Ray's PopulationBasedTraining, synch=False).
struct PbtOptions {
  std::string time_attr = "time_total_s";
  std::string metric;
  std::string mode;
  double perturbation_interval = 60.0;
  double burn_in_period = 0.0;
  // Parameter -> a list of values (shifted one step left or right), a domain (multiplied
  // by a perturbation factor, or resampled), or a nested object of those.
  Config hyperparam_mutations = Config::object();
  double quantile_fraction = 0.25;     // the bottom fraction clones the top fraction
  double resample_probability = 0.25;  // chance to resample instead of perturbing
  std::vector<double> perturbation_factors = {1.2, 0.8};
  bool require_attrs = true;  // a result without time_attr or metric is an error
};

class PbtScheduler : public TrialScheduler {
 public:
  // UsageError: no hyperparam_mutations, quantile_fraction outside [0, 0.5],
  // perturbation_interval <= 0, a mutation that is not a list, domain or object.
  explicit PbtScheduler(PbtOptions options);
  std::string name() const override { return "PBT"; }
  void set_search_properties(const std::string& metric, const std::string& mode) override;
  void on_trial_add(SchedulerContext& ctx, Trial& trial) override;
  Decision on_trial_result(SchedulerContext& ctx, Trial& trial, const Result& result) override;
  // Ray's fair share: of the PENDING and PAUSED trials, the one with the least time_attr at
  // its last perturbation point (the first of them on a tie), so no trial starves while
  // another is resumed again and again.
  Trial* choose_trial_to_run(SchedulerContext& ctx) override;

  int num_perturbations() const { return num_perturbations_; }
  int num_checkpoints() const { return num_checkpoints_; }

  // Ray's _explore: a new config from `config` by the mutation rules.
  Config explore(const Config& config, const Config& mutations);

 private:
  struct State {
    std::string orig_tag;
    bool has_score = false;
    double last_score = 0;
    std::string last_checkpoint;  // "" : none
    double last_perturbation_time = 0;
    double last_train_time = 0;
    Result last_result;
  };
  State& state(const Trial& trial);
  void quantiles(SchedulerContext& ctx, std::vector<Trial*>& lower, std::vector<Trial*>& upper);
  void checkpoint_or_exploit(SchedulerContext& ctx, Trial& trial, const std::vector<Trial*>& upper,
                             const std::vector<Trial*>& lower);
  void exploit(SchedulerContext& ctx, Trial& trial, Trial& clone);
  void fill_config(Config& config, const std::string& key, const Config& space);

  PbtOptions o_;
  std::vector<std::pair<std::string, State>> states_;  // in the order trials were added
  int num_checkpoints_ = 0;
  int num_perturbations_ = 0;
};

}  // namespace dtrain::tune
