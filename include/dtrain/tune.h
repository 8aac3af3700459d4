// dtrain::tune: hyperparameter search over distributed trials (Ray Tune for C++ users).
//
//     void train(dtrain::tune::Config config) {             // runs on every process of a trial
//       auto pg = dtrain::init_process_group();              // the trial's own group
//       int start = 0;
//       if (auto ckpt = dtrain::tune::get_checkpoint()) start = load(*ckpt);  // a directory
//       for (int epoch = start; epoch < 10; ++epoch) {
//         double acc = train_epoch(config["lr"].get<double>(), ...);
//         save(tmp_dir);
//         dtrain::tune::report({{"accuracy", acc}}, tmp_dir);  // all ranks; rank 0's counts
//       }
//     }
//     int main(int argc, char** argv) {
//       dtrain::init(argc, argv);   // trial workers run train() here and exit
//       using namespace dtrain::tune;
//       Tuner tuner(train, {{"lr", loguniform(1e-4, 1e-1)}, {"hidden", grid_search({64, 128})}},
//                   {.metric = "accuracy", .mode = "max", .num_samples = 4,
//                    .scheduler = std::make_shared<AshaScheduler>(AshaOptions{.max_t = 10}),
//                    .trial_resources = {.processes = 2}, .storage_path = "/tmp/search"});
//       ResultGrid results = tuner.fit();
//       std::cout << results.best_result().config << "\n";
//     }
//
// How it works. fit() generates the trials (dtrain/tune_search_space.h), then runs them, as
// many at once as fit in the engine's free slots (the machine's cores; a cluster's free
// processes of a trial's size, counted again as trials end where the engine's count follows
// its jobs), the GPUs free (trial_resources.gpus, as Ray assigns them) and
// max_concurrent_trials.
// Each trial is one Distributor job (dtrain/distributor.h): the trainable runs on
// `processes` worker processes under the `dtrain` launcher, so a trial is itself
// data-parallel; with local_mode = false the jobs run on a cluster engine (ClusterOptions). The
// driver hosts a small store (dtrain/store.h); report() on rank 0 puts the result there, the
// driver's scheduler (dtrain/tune_schedulers.h) decides, and report() returns (continue) or throws
// TrialStopped (stop, or pause for PBT) on every rank that calls it. A trial that fails is started
// again from its latest checkpoint up to max_failures times. Everything the search knows is written
// to storage_path/<name>/tuner_state.json after every event (NaN and infinite metrics written
// NaN / Infinity, as Python's json and Ray's experiment state have them); with `resume`, a search
// whose driver was killed continues from there, with those values as they were, and runs no
// finished trial again.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/codec.h"
#include "dtrain/distributor.h"
#include "dtrain/error.h"
#include "dtrain/tune_schedulers.h"
#include "dtrain/tune_search_space.h"
#include "dtrain/tune_stoppers.h"

namespace dtrain {

// A Config crosses to the trial's workers as its JSON text.
template <>
struct Codec<tune::Config> {
  static void encode(Encoder& out, const tune::Config& c) { out.put(c.dump()); }
  static tune::Config decode(Decoder& in) { return tune::Config::parse(in.get<std::string>()); }
};

namespace tune {

// ---- in a trial (worker side) ----------------------------------------------------------

// Thrown by report() when the scheduler stopped (or paused) this trial: let it propagate
// out of the trainable. The driver knows why the trial ended; this is not a failure.
class TrialStopped : public Error {
 public:
  using Error::Error;
};

// Reports one result (a flat object of numbers: {"accuracy", 0.91}, ...) and, optionally, a
// checkpoint directory (or file) that is copied into the trial's storage. Call it on every
// rank once per iteration (epoch): rank 0's metrics and checkpoint count; every caller blocks
// until the driver decided, and throws TrialStopped if the trial is to end here. Only rank 0
// calling it also works (the other ranks are stopped with it). The driver completes every
// result as Ray Tune does, in Ray's order after the trial's own keys: "timestamp" (Unix
// seconds), "checkpoint_dir_name" (null without a checkpoint), "should_checkpoint" (with
// one), "done" (false; true on the result the trial stops at, and on a finished trial's last
// result), "training_iteration" (1, 2, ... continuing after a restore), "trial_id", "date"
// (local, %Y-%m-%d_%H-%M-%S), "time_this_iter_s" (since the previous report, or since the
// run started; a reported value is kept), "time_total_s" (the restored checkpoint's plus the
// time since), "pid", "hostname", "node_ip" (of rank 0), "config", "time_since_restore",
// "iterations_since_restore". A reported `"done": true` ends the trial after this result.
// `metrics` is an object whose values are what Ray's tune.report takes as JSON: numbers (NaN and
// infinities too), booleans, strings, null, lists and nested objects ({"acc": {"top1": 0.9}},
// which schedulers, `stop`, best_result and checkpoint_config name "acc/top1", as Ray flattens
// it); those read numbers only.
// UsageError: called outside a trial, or metrics not a JSON object.
// TimeoutError: the driver did not answer within the report timeout (it is gone).
void report(const Result& metrics, const std::string& checkpoint = "");

// The checkpoint directory this trial should start from (its own latest after a failure or
// a pause; a better trial's after a PBT exploit), or nothing for a fresh start.
std::optional<std::string> get_checkpoint();

// True inside a trial's worker; the trial's id (Ray's form, "4554a_00003": the search's 5 hex
// characters and the trial's index) and its own directory (for files), named as Ray names it
// (TuneOptions::trial_dirname_creator).
bool in_trial();
std::string trial_id();
std::string trial_dir();

// ---- the search (driver side) ----------------------------------------------------------

// A number of GPUs, whole or fractional, set from an int or a double alike and read as a double
// (`.gpus = 1`, `.gpus = 0.5`, `.gpus = n` for an int n all compile, as they did when it was int).
struct GpuAmount {
  double value = 0;
  constexpr GpuAmount() = default;
  template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  constexpr GpuAmount(T v) : value(static_cast<double>(v)) {}  // NOLINT: implicit, as a number
  constexpr operator double() const { return value; }
};

// What one trial holds while it runs, as Ray Tune's tune.with_resources(fn, {"cpu": processes,
// "gpu": gpus}): `processes` worker processes, each counted as one of TuneOptions::num_cpus.
struct TrialResources {
  int processes = 1;  // worker processes per trial (the Distributor's num_processes)
  // GPUs per trial (Ray's "gpu"): 0 (default), a fraction below 1 (0.5: two trials share a GPU)
  // or a number of whole GPUs (2; 1.5 is a UsageError, as Ray refuses it). Local
  // mode: the trial's ids are taken from TuneOptions::num_gpus' as Ray's raylet assigns them
  // (whole GPUs lowest free id first, fractions packed onto the fullest GPU they fit), and every
  // process of the trial starts with CUDA_VISIBLE_DEVICES = those ids (the driver's own list's
  // entries where it has one); a trial of 0 GPUs keeps the driver's CUDA_VISIBLE_DEVICES as it is
  // (unset stays unset), as Ray 2.60 leaves it. Trials start only while their GPUs are free
  // (docs/tune.md, "GPUs per trial"). On the "ray" engine each process asks Ray for gpus /
  // processes GPUs (ClusterOptions::ray.num_gpus_per_process) and Ray assigns them; other cluster
  // engines: UsageError.
  GpuAmount gpus = 0;
};

// Ray's CheckpointConfig (RunConfig(checkpoint_config=...)): which of each trial's checkpoints
// stay on disk. By default every one. num_to_keep (>= 1) keeps the best that many by
// checkpoint_score_attribute ("max": the largest; "min": the smallest; no attribute: the most
// recent), and the latest checkpoint always, until a newer one comes; the others are deleted
// as the trial reports (Ray 2.60's _CheckpointManager, to its tie and NaN rules: a NaN scores
// below every number, a result without the attribute counts as the most recent). A checkpoint
// a PBT exploit is about to restore from is deleted only once no trial waits to start from it.
//
// checkpoint_frequency and checkpoint_at_end are Ray's too, and Ray 2.60 refuses them for a
// function trainable (a ValueError from Tuner.fit: a function checkpoints by reporting one, every
// so many iterations or at its end, itself). Every dtrain trainable is a function, so the
// Tuner's constructor throws UsageError when checkpoint_frequency is not 0 (negative: Ray's
// CheckpointConfig refuses that too) or checkpoint_at_end is true; their defaults (0, false)
// are what Ray takes for a function.
struct CheckpointConfig {
  int num_to_keep = 0;                     // 0: keep all (Ray's None)
  std::string checkpoint_score_attribute;  // a key of the results ("a/b" nested); "": recency
  std::string checkpoint_score_order = "max";
  int checkpoint_frequency = 0;    // must stay 0: report a checkpoint every N iterations instead
  bool checkpoint_at_end = false;  // must stay false: report a checkpoint with the last result
};

struct TuneOptions {
  std::string metric;   // the result key to optimise; required with a scheduler but FIFO
  std::string mode;     // "min" | "max"
  int num_samples = 1;  // repeats of the grid (random domains drawn anew each time)
  // Default: FIFO (every trial runs to its end).
  std::shared_ptr<TrialScheduler> scheduler;
  // Ray's RunConfig(stop={...}): a trial stops (TERMINATED, not a failure) at the first result
  // in which any of these keys is >= its value ("a/b" names a nested key, "config/lr" the
  // config). A key a result lacks never stops it (said once on stderr), as in Ray.
  std::map<std::string, double> stop;
  // Ray's RunConfig(stop=Stopper or callable) (dtrain/tune_stoppers.h): asked about every result
  // before `stop` and the scheduler; its stop_all() ends the whole search (every trial not
  // ended becomes TERMINATED; fit() returns as usual). A callable is
  // std::make_shared<FunctionStopper>(fn), Ray's list of stoppers a CombinedStopper. Ray takes
  // either the dict or a stopper in `stop`; dtrain takes both: the stopper first, then the dict,
  // the order Ray's controller asks its stopper and a trial's stopping criteria in.
  std::shared_ptr<Stopper> stopper;
  // Ray's TuneConfig(time_budget_s): > 0 ends the search after this long (a TimeoutStopper,
  // combined after `stopper` as Ray combines them). 0: no budget.
  std::chrono::milliseconds time_budget{0};
  // Trials running at once, at most. 0: as many as the engine's free slots allow (free slots /
  // processes, at least 1), counted when fit() starts: this machine's cores; on a cluster the
  // engine's (ray: the processes of a trial's CPUs and GPUs its alive nodes hold free; slurm:
  // the partition's idle CPUs; ssh: the hosts' slots; spark: the kept application's free task
  // slots). On spark and ray, whose counts are net of running jobs, the driver counts again
  // whenever a trial's run ends while trials wait, and runs more at once when room appeared
  // (never fewer than at the start; docs/tune.md, "Concurrency follows the cluster"). An engine
  // that cannot tell (mpi; spark without a kept application): one trial at a time unless this
  // is set. As Ray's max_concurrent_trials (its BasicVariantGenerator(max_concurrent)), it also
  // caps the trials that exist: the next trial of the search is made only while fewer than this
  // many are live (not ended; a trial PBT paused is live), so with PBT the first ones run to
  // their end exploiting only each other. Fewer slots than live trials (num_cpus, or the
  // engine's count) is what makes PBT pause trials to share them, as Ray's CPUs do.
  int max_concurrent_trials = 0;
  // Local mode: the CPUs the search may use, as ray.init(num_cpus=N) for a local Ray: trials
  // at once = num_cpus / trial_resources.processes (at least 1), and of those only as many as
  // have their GPUs free (trial_resources.gpus, num_gpus). 0: this machine's cores. On a
  // cluster the engine counts its slots (UsageError if set).
  int num_cpus = 0;
  // Local mode: the GPUs the search hands its trials, as ray.init(num_gpus=N): ids 0..N-1
  // (mapped through the driver's CUDA_VISIBLE_DEVICES when it is set), declared even where the
  // machine has none, as Ray hands them out then too. -1 (default): this machine's CUDA devices
  // that CUDA_VISIBLE_DEVICES lets it see, counted in a short-lived child process (the driver
  // never initialises CUDA), only when trial_resources.gpus > 0. fit() throws UsageError when a
  // trial asks for more than there are (Ray would wait for them forever). On a cluster the
  // engine counts them (UsageError if set).
  int num_gpus = -1;
  TrialResources trial_resources;
  // Where trials run, as the Distributor has it (dtrain/distributor.h). true: this machine.
  // false: every trial is a Distributor job with local_mode = false on `cluster`'s engine
  // ("ssh" host file or list, "slurm", "mpi", "spark", "ray"), trial_resources.processes
  // workers placed by that engine; the workers report to a store the driver hosts at
  // cluster.driver_addr (default: as the Distributor finds it). On a cluster storage_path must
  // be a directory every host sees at the same path (rank 0 copies its checkpoints into the trial's
  // directory, and restored trials read them from there). UsageError in the Tuner's
  // constructor when the cluster options do not fit (what the Distributor would say).
  bool local_mode = true;
  ClusterOptions cluster;
  int max_failures = 0;  // a failed trial is started again (from its checkpoint) this often
  // Where trials, checkpoints, tuner_state.json and results.csv go: storage_path/name/.
  // Default: ./dtrain_tune_results.
  std::string storage_path;
  std::string name = "tune";
  // Ray's TuneConfig(trial_dirname_creator=...): the name of a trial's directory under
  // storage_path/name, from the trial (its id, config and experiment tag), called once when the
  // trial is made, before the scheduler's on_trial_add (as Ray's Trial() calls it: a config PBT
  // fills in there is not in it yet). Ray's characters /()<>:"\|?* become "_"; a name taken already
  // gets "_" and 4 random hex characters, as Ray's. Empty (default): Ray's own name,
  // "<trainable>_<id>_<tag>_<date>" (docs/tune.md, "Names"). The name must be non-empty and
  // hold no "/" (fit() throws UsageError otherwise, as Ray's ValueError).
  std::function<std::string(const Trial&)> trial_dirname_creator;
  // Ray's TuneConfig(trial_name_creator=...): the trial's name (Ray's str(trial)), from the trial
  // (its id, config and experiment tag), called once when the trial is made, before
  // trial_dirname_creator and the scheduler's on_trial_add (PBT's hyperparam_mutations keys the
  // space lacks are not in its config yet, as in Ray), and kept in tuner_state.json (a resumed
  // search does not ask again). The name is used wherever Ray uses str(trial): the start of the
  // trial's default directory name ("<name>_<tag>_<date>"), its MLflow run's name and "trial_name"
  // tag, TrialResult::name and the verbose lines. "" returned: Ray's own name,
  // "<trainable>[_<env>]_<id>", as Ray falls back on an empty (falsy) name; a name is used as
  // given (a "/" stays in the run name and becomes "_" in the directory, as in Ray). Empty
  // (default): Ray's own name. A creator that throws ends fit() with UsageError naming the trial
  // (Ray's fit() raises the creator's exception).
  std::function<std::string(const Trial&)> trial_name_creator;
  CheckpointConfig checkpoint_config;
  bool resume = false;     // continue the search saved there instead of starting anew
  std::uint64_t seed = 0;  // variants and the schedulers' random choices
  // A trial (one run of it) that takes longer is stopped and counts as a failure.
  std::chrono::milliseconds trial_timeout{std::chrono::hours(24)};
  // How long report() in a worker waits for the driver's decision.
  std::chrono::milliseconds report_timeout{std::chrono::minutes(10)};
  std::map<std::string, std::string> env;  // extra environment for every trial's workers
  // MLflow (dtrain/mlflow.h), the role of Ray's MLflowLoggerCallback: with a tracking URI
  // (default: MLFLOW_TRACKING_URI; neither set: no logging) the search is a parent run named
  // `name` and every trial a child run of it (tag mlflow.parentRunId): its config as params,
  // every reported metric as history (step = training_iteration), FINISHED or FAILED as the
  // trial ended. The driver logs them; the trials' processes get MLFLOW_TRACKING_URI emptied
  // (no extra run per trial). A resumed search continues the same runs.
  std::string mlflow_tracking_uri;
  std::string mlflow_experiment;  // default: MLFLOW_EXPERIMENT_NAME, else "Default"
  bool verbose = true;            // one line per trial start/end on stderr
};

// One trial as fit() ended it.
struct TrialResult {
  std::string id;
  std::string name;  // Ray's str(trial): TuneOptions::trial_name_creator's, or Ray's own
  Config config;
  TrialStatus status = TrialStatus::Pending;
  // Empty if it never reported. Ray's Result.metrics: the last report, with "experiment_tag"
  // (the trial's tag as the search ended: PBT's "<tag>@perturbed[...]" after an exploit) added
  // after its keys, as Ray's Trial.update_last_result adds it (result.json and `history` have no
  // such key, as Ray's result.json has none).
  Result last_result;
  Result best_result;           // the best report by metric/mode
  std::vector<Result> history;  // every report, in order (a restore replaces what it repeats)
  // Every result the driver took, in order: the history and, where a restore from an earlier
  // checkpoint made iterations again, the results it dropped from the history (Ray's
  // metric_analysis counts them; best_result reads this).
  std::vector<Result> reports;
  std::string checkpoint;  // its latest checkpoint directory, "" if none
  int num_failures = 0;
  std::string error;  // why it ended in Error
  std::string dir;    // its directory under storage_path/name
  // Ray's Result.best_checkpoints: the checkpoints kept (TuneOptions::checkpoint_config) with
  // the result each was reported with, worst first (by the score attribute, else oldest first);
  // with num_to_keep, that many (the latest checkpoint, kept too, may not be among them).
  std::vector<std::pair<std::string, Result>> best_checkpoints;
  // Ray's Result.get_best_checkpoint(metric, mode): the checkpoint of best_checkpoints whose
  // result has the best `metric` ("a/b" nested; on a tie the first; a NaN first in line is
  // never displaced, as Python's max/min). UsageError: no checkpoint, a mode not "min"/"max",
  // or no checkpoint's result has the metric.
  std::string get_best_checkpoint(const std::string& metric, const std::string& mode) const;
};

class ResultGrid {
 public:
  ResultGrid() = default;
  ResultGrid(std::vector<TrialResult> trials, std::string metric, std::string mode, std::string dir)
      : trials_(std::move(trials)),
        metric_(std::move(metric)),
        mode_(std::move(mode)),
        dir_(std::move(dir)) {}
  const std::vector<TrialResult>& trials() const { return trials_; }
  std::size_t size() const { return trials_.size(); }
  const TrialResult& operator[](std::size_t i) const { return trials_.at(i); }
  int num_errors() const;
  // The trial best by metric/mode (default: the Tuner's), as Ray's get_best_result with its
  // default filter_nan_and_inf, over each trial's `reports` (its history when empty) as Ray's
  // metric_analysis keeps them: the metric found in the result flattened ("a/b"), numbers and
  // booleans; a trial's score is, by `scope`: "last" (Ray's default) its last value; "all" the
  // running max (min) as Python's max(value, previous) in order (a NaN makes it NaN until the
  // next number replaces it); "avg" Ray's running 1 / step * (value + (step - 1) * avg), step the
  // result's training_iteration (the mean when every iteration has the metric once); "last-5-avg"
  // and "last-10-avg" the mean of its last 5 (10) values. A NaN or infinite score is never the
  // best (`filter_nan_and_inf`, Ray's default); on a tie the first trial wins. Without the filter
  // every score counts, compared as Ray compares them: +inf wins "max", a NaN first in line is
  // never displaced (no number compares above or below it), a later one never wins.
  // UsageError: a scope not among those five, or no trial with a (finite) score.
  const TrialResult& best_result(const std::string& metric = "", const std::string& mode = "",
                                 const std::string& scope = "last",
                                 bool filter_nan_and_inf = true) const;
  // `trial`'s score as best_result ranks it (Ray's trial.metric_analysis[metric][scope], or
  // [mode] for scope "all"); nullopt when it has no number for `metric`. UsageError: bad scope.
  static std::optional<double> score(const TrialResult& trial, const std::string& metric,
                                     const std::string& mode, const std::string& scope);
  // One row per trial under one header (the union of the trials' columns): id, status,
  // failures, iterations, the config (nested keys joined by "/"), the last result's keys.
  // Also written to storage_path/name/results.csv.
  void write_csv(const std::string& path) const;
  const std::string& experiment_dir() const { return dir_; }

 private:
  std::vector<TrialResult> trials_;
  std::string metric_, mode_, dir_;
};

// A trainable with its name: what Ray takes from the function's __name__ for the trial
// directories ("<name>_<trial id>_<tag>_<date>"); a C++ function has none, so a trainable given
// bare is named "train_fn".
//     Tuner tuner(with_name(train, "train"), space, options);   // train_<id>_..., as Ray's
struct NamedTrainable {
  void (*fn)(Config);
  std::string name;
};
template <class F>
NamedTrainable with_name(F trainable, std::string name) {
  return {+trainable, std::move(name)};
}

class Tuner {
 public:
  using Runner = std::function<void(Distributor&, const Config&)>;

  // `trainable`: void(Config), a plain function or a capture-less lambda (it runs in the
  // trial's worker processes, see dtrain/distributor.h), or with_name(fn, "name") to name its
  // trials' directories (default "train_fn"). dtrain::init() must be called first thing in
  // main(). UsageError for bad options (what is wrong and what to set), an empty name or one
  // holding "/".
  template <class F>
  Tuner(F trainable, Config param_space, TuneOptions options)
      : Tuner(make_runner(+trainable), std::move(param_space), std::move(options), "train_fn") {}
  Tuner(NamedTrainable trainable, Config param_space, TuneOptions options)
      : Tuner(make_runner(trainable.fn), std::move(param_space), std::move(options),
              std::move(trainable.name)) {}

  // Runs the search to its end. Returns every trial's outcome; a trial that failed for good
  // is in the grid with status Error (fit() throws only for the search itself: bad options,
  // storage that cannot be written). A result without TuneOptions::metric (when set), one the
  // scheduler refuses, or one the stopper throws on, ends the search at that result as Ray does:
  // every running trial is stopped at its next report, and fit() throws UsageError naming the
  // trial, the metric and the keys the result has.
  ResultGrid fit();

 private:
  Tuner(Runner runner, Config param_space, TuneOptions options, std::string trainable_name);
  static Runner make_runner(void (*fn)(Config)) {
    return [fn](Distributor& d, const Config& c) { d.run(fn, c); };
  }

  Runner runner_;
  std::string trainable_name_;
  Config param_space_;
  TuneOptions options_;
};

}  // namespace tune
}  // namespace dtrain
