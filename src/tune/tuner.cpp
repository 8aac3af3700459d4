// The Tuner's driver: trials as Distributor jobs, a scheduler deciding on their reports,
// retries, and a state file to resume from. One piece (~770 lines): everything here runs on
// the one driver thread described below and shares its state.
//
// One driver thread owns everything (trials, scheduler, state file). Each running trial has
// a thread of its own that only blocks in Distributor::run and then posts how the run ended.
// The driver thread loops: start trials while there is room (as many as the engine's free
// slots hold, asked again as runs end where its count follows its jobs: concurrency.h), read
// new reports from the store (polled every few milliseconds; a report blocks its worker until
// the decision is written back), handle runs that ended, and write the state after every
// change.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "core/params.h"
#include "distributor/internal.h"
#include "dtrain/store.h"
#include "dtrain/tune.h"
#include "engines/engine.h"
#include "launch/gpus.h"
#include "tune/checkpoint_keeper.h"
#include "tune/concurrency.h"
#include "tune/gpu_pool.h"
#include "tune/mlflow_trials.h"
#include "tune/report_wire.h"
#include "tune/state_json.h"
#include "tune/trial_files.h"
#include "tune/trial_names.h"
#include "tune/warm_fork_server.h"
#include "tune/warm_hosts.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace dtrain::tune {

namespace {

constexpr int kStateVersion = 1;

TrialStatus status_from(const std::string& s) {
  if (s == "PENDING") return TrialStatus::Pending;
  if (s == "RUNNING") return TrialStatus::Running;
  if (s == "PAUSED") return TrialStatus::Paused;
  if (s == "TERMINATED") return TrialStatus::Terminated;
  if (s == "ERROR") return TrialStatus::Error;
  throw UsageError("tune: unknown trial status \"" + s + "\" in a saved search");
}

bool better(double a, double b, const std::string& mode) { return mode == "max" ? a > b : a < b; }

// What the driver keeps per trial.
struct TrialRecord {
  Trial trial;
  std::vector<Result> history;
  std::vector<std::int64_t> history_seq;  // global order of reports (the stopper, on resume)
  // Reports a restore dropped from the history (they come again after it), with their place
  // in the global order: Ray's metric_analysis, which best_result's scopes read, counts them.
  std::vector<Result> rewound;
  std::vector<std::int64_t> rewound_seq;
  std::string latest_checkpoint;
  std::int64_t latest_checkpoint_iteration = 0;
  double latest_checkpoint_time = 0;   // time_total_s of the result it came with
  std::string restore_checkpoint;      // what the next run starts from
  std::int64_t restore_iteration = 0;  // training_iteration of that checkpoint
  double restore_time = 0;             // time_total_s of that checkpoint (Ray restores both)
  int num_failures = 0;
  int runs = 0;
  std::string error;
  std::string dir;
  std::string name;  // Ray's str(trial): trial_name_creator's or Ray's own; set when it is made
  std::string custom_dirname;  // trial_dirname_creator's, until its directory is made
  std::map<std::string, std::int64_t> checkpoint_iterations;  // checkpoint dir -> iteration
  std::map<std::string, double> checkpoint_times;             // checkpoint dir -> time_total_s
  std::string mlflow_run_id;        // its MLflow child run, "" when not logged
  detail::CheckpointKeeper keeper;  // which of its checkpoints stay (checkpoint_config)

  // While running.
  std::thread thread;
  std::atomic<bool> finished{false};
  std::string failure;  // "" : returned normally
  // Its trainable returned (not stopped, failed or paused): the stopper was given its last
  // result twice (Ray's __duplicate__), and is again when a resumed search replays it.
  bool returned = false;
  bool stopped_by_worker_exception = false;
  bool stop_requested = false;
  bool pause_requested = false;
  bool search_stopped = false;   // a stopper's stop_all() ended the search: its next report ends it
  bool exploit_pending = false;  // PBT set restore_checkpoint to another trial's
  int next_report = 1;
  Clock::time_point started;
  Clock::time_point first_report = Clock::time_point::max();  // read, in this run
  Clock::time_point last_report;                              // read, in this run
  double time_since_restore = 0;                              // this run's time_this_iter_s, summed
  std::string prefix;
  detail::GpuPool::Allocation gpus;  // the GPUs this run holds (local mode), empty: none
};

// The next run of `r` starts from its own latest checkpoint; the reports made after that
// checkpoint will come again, so they leave the history (kept in `rewound`).
void rewind_to_latest_checkpoint(TrialRecord& r) {
  r.restore_checkpoint = r.latest_checkpoint;
  r.restore_iteration = r.latest_checkpoint_iteration;
  r.restore_time = r.latest_checkpoint_time;
  while (!r.history.empty() &&
         r.history.back().value("training_iteration", std::int64_t{0}) > r.restore_iteration) {
    r.rewound.push_back(std::move(r.history.back()));
    r.rewound_seq.push_back(r.history_seq.back());
    r.history.pop_back();
    r.history_seq.pop_back();
  }
}

// When the driver took `r`'s last result (the global count of results taken), -1 without one:
// Ray's run_metadata.last_result_time, which orders a restored search's trials.
std::int64_t last_report_seq(const TrialRecord& r) {
  std::int64_t last = -1;
  for (std::int64_t s : r.history_seq) last = std::max(last, s);
  for (std::int64_t s : r.rewound_seq) last = std::max(last, s);
  return last;
}

// Every report of `r` in the order the driver took them: the history and the rewound ones.
std::vector<Result> all_reports(const TrialRecord& r) {
  std::vector<std::pair<std::int64_t, const Result*>> order;
  for (std::size_t i = 0; i < r.history.size(); ++i)
    order.emplace_back(r.history_seq[i], &r.history[i]);
  for (std::size_t i = 0; i < r.rewound.size(); ++i)
    order.emplace_back(r.rewound_seq[i], &r.rewound[i]);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Result> out;
  out.reserve(order.size());
  for (const auto& [s, res] : order) out.push_back(*res);
  return out;
}

// The scheduler's view of the driver.
class Context : public SchedulerContext {
 public:
  explicit Context(std::vector<std::unique_ptr<TrialRecord>>& trials) : trials_(trials) {}
  std::vector<Trial*> trials() override {
    std::vector<Trial*> v;
    for (auto& t : trials_) v.push_back(&t->trial);
    return v;
  }
  TrialRecord& record(Trial& t) {
    for (auto& r : trials_) {
      if (&r->trial == &t) return *r;
    }
    throw InternalError("tune: a scheduler named a trial the Tuner does not have");
  }
  std::string save_checkpoint(Trial& t) override { return record(t).latest_checkpoint; }
  void pause_trial(Trial& t) override {
    TrialRecord& r = record(t);
    if (t.status == TrialStatus::Running) r.pause_requested = true;
    t.status = TrialStatus::Paused;
  }
  void restore_trial(Trial& t, const Config& config, const std::string& checkpoint,
                     const std::string& from) override {
    TrialRecord& r = record(t);
    TrialRecord* donor = nullptr;
    for (auto& x : trials_) {
      if (x->trial.id == from) donor = x.get();
    }
    t.config = config;
    r.exploit_pending = true;
    r.restore_checkpoint = checkpoint;
    const bool known = donor && donor->checkpoint_iterations.count(checkpoint);
    r.restore_iteration = known ? donor->checkpoint_iterations.at(checkpoint) : 0;
    r.restore_time = known ? donor->checkpoint_times[checkpoint] : 0;
    if (verbose) {
      std::fprintf(stderr, "tune: %s exploits %s (checkpoint %s), new config %s\n", t.id.c_str(),
                   from.c_str(), checkpoint.c_str(), config.dump().c_str());
    }
  }
  bool verbose = true;

 private:
  std::vector<std::unique_ptr<TrialRecord>>& trials_;
};

// What every trial's Distributor gets from the options (start_trial adds the trial's own).
DistributorOptions trial_distributor_options(const TuneOptions& o) {
  DistributorOptions d;
  d.num_processes = o.trial_resources.processes;
  d.timeout = o.trial_timeout;
  d.env = o.env;
  d.local_mode = o.local_mode;
  d.cluster = o.cluster;
  return d;
}

// The Distributor's own checks of a cluster job, said in the Tuner's terms.
Distributor cluster_probe(const TuneOptions& o) {
  try {
    return Distributor(trial_distributor_options(o));
  } catch (const UsageError& e) {
    throw UsageError(
        std::string("tune::Tuner: the trials cannot run on cluster engine \"") + o.cluster.engine +
        "\" as configured (TuneOptions::cluster; trial_resources.processes is each trial's "
        "num_processes): " +
        e.what());
  }
}

}  // namespace

// ---- ResultGrid --------------------------------------------------------------------------

std::string TrialResult::get_best_checkpoint(const std::string& metric,
                                             const std::string& mode) const {
  return detail::best_checkpoint_of(best_checkpoints, metric, mode, id);
}

int ResultGrid::num_errors() const {
  return static_cast<int>(std::count_if(trials_.begin(), trials_.end(), [](const TrialResult& t) {
    return t.status == TrialStatus::Error;
  }));
}

namespace {

void check_scope(const std::string& scope) {
  if (scope != "last" && scope != "all" && scope != "avg" && scope != "last-5-avg" &&
      scope != "last-10-avg") {
    throw UsageError(
        "tune::ResultGrid: scope must be one of \"all\", \"last\", \"avg\", \"last-5-avg\", "
        "\"last-10-avg\" (as Ray's get_best_result), got \"" +
        scope + "\"");
  }
}

}  // namespace

std::optional<double> ResultGrid::score(const TrialResult& trial, const std::string& metric,
                                        const std::string& mode, const std::string& scope) {
  check_scope(scope);
  // Ray's _TrainingRunMetadata.update_metric, fed by Trial.update_last_result with every result
  // the controller took (rewound ones included): the first value sets every statistic; after
  // it "all" is Python's max(value, previous) (min), so a NaN makes it NaN until the next number
  // replaces it; "avg" is 1 / step * (value + (step - 1) * avg) with step the result's
  // training_iteration (not the mean when the metric skipped results or a restore repeated
  // iterations), and a NaN or infinity stays in it; "last-N-avg" is sum(last N) / count.
  constexpr std::size_t kWindows[] = {5, 10};
  const int window = scope == "last-5-avg" ? 0 : scope == "last-10-avg" ? 1 : -1;
  bool seen = false;
  double value = 0, avg = 0;
  std::deque<double> last_n[2];
  for (const auto& h : trial.reports.empty() ? trial.history : trial.reports) {
    if (!h.is_object()) continue;
    // Ray drops these keys (DEBUG_METRICS) before flattening; numbers and booleans count.
    Result r = h;
    for (const char* k :
         {"trial_id", "experiment_id", "date", "timestamp", "pid", "hostname", "node_ip", "config"})
      r.erase(k);
    r = detail::flatten(r);
    const auto it = r.find(metric);
    if (it == r.end() || !(it->is_number() || it->is_boolean())) continue;
    const double v = it->is_boolean() ? (it->get<bool>() ? 1.0 : 0.0) : it->get<double>();
    if (!seen) {
      value = avg = v;
      for (auto& w : last_n) w.assign(1, v);
      seen = true;
      continue;
    }
    const auto step_it = h.find("training_iteration");
    double step = step_it != h.end() && step_it->is_number() ? step_it->get<double>() : 0.0;
    if (step == 0) step = 1;  // Ray's `step or 1`
    avg = 1 / step * (v + (step - 1) * avg);
    for (int w = 0; w < 2; ++w) {
      last_n[w].push_back(v);
      if (last_n[w].size() > kWindows[w]) last_n[w].pop_front();
    }
    if (scope == "all") {
      // Python's max(v, value) keeps its first argument unless the second compares greater.
      value = (mode == "max" ? value > v : value < v) ? value : v;
    } else {
      value = v;
    }
  }
  if (!seen) return std::nullopt;
  if (scope == "avg") return avg;
  if (window >= 0) {
    double sum = 0;  // Python's sum(): left to right from 0
    for (double x : last_n[window]) sum += x;
    return sum / static_cast<double>(last_n[window].size());
  }
  return value;
}

const TrialResult& ResultGrid::best_result(const std::string& metric_in, const std::string& mode_in,
                                           const std::string& scope,
                                           bool filter_nan_and_inf) const {
  const std::string metric = metric_in.empty() ? metric_ : metric_in;
  const std::string mode = mode_in.empty() ? mode_ : mode_in;
  check_scope(scope);
  if (metric.empty() || (mode != "min" && mode != "max")) {
    throw UsageError(
        "tune::ResultGrid::best_result: needs a metric and mode \"min\"/\"max\" (got \"" + metric +
        "\", \"" + mode + "\"); pass them or set them in TuneOptions");
  }
  // Ray's ExperimentAnalysis.get_best_trial: with filter_nan_and_inf a NaN or infinite score
  // never wins; the first trial with a score is the best until one compares better (strictly:
  // on a tie the first trial wins, and nothing compares better than a NaN).
  const TrialResult* best = nullptr;
  double best_value = 0;
  for (const auto& t : trials_) {
    const std::optional<double> s = score(t, metric, mode, scope);
    if (!s || (filter_nan_and_inf && !std::isfinite(*s))) continue;
    if (best == nullptr || better(*s, best_value, mode)) {
      best = &t;
      best_value = *s;
    }
  }
  if (best == nullptr) {
    if (!filter_nan_and_inf)
      throw UsageError("tune::ResultGrid::best_result: no trial has a \"" + scope +
                       "\" score of \"" + metric + "\" (no trial reported it)");
    throw UsageError("tune::ResultGrid::best_result: no trial has a finite \"" + scope +
                     "\" score of \"" + metric +
                     "\" (NaN and infinite scores are never the best, as in Ray; pass "
                     "filter_nan_and_inf = false to rank them too)");
  }
  return *best;
}

void ResultGrid::write_csv(const std::string& path) const {
  // One header, the union of every trial's columns in the order they first appear; one row
  // per trial, empty where it has no such key. The config comes from the trial (a trial that
  // never reported has one too), the rest from its last result flattened as Ray's
  // get_dataframe() does; "logdir" is the trial's directory, as there.
  std::vector<std::string> cols;
  std::vector<Config> rows;
  for (const auto& t : trials_) {
    Config row = Config::object();
    const Config config = detail::flatten(Config{{"config", t.config}});
    for (auto it = config.begin(); it != config.end(); ++it) row[it.key()] = it.value();
    if (t.last_result.is_object()) {
      Config last = t.last_result;
      last.erase("config");
      last.erase("trial_id");
      last = detail::flatten(last);
      for (auto it = last.begin(); it != last.end(); ++it) row[it.key()] = it.value();
    }
    row["logdir"] = t.dir;
    for (auto it = row.begin(); it != row.end(); ++it) {
      if (std::find(cols.begin(), cols.end(), it.key()) == cols.end()) cols.push_back(it.key());
    }
    rows.push_back(std::move(row));
  }
  // "logdir" last, as in Ray's dataframe.
  cols.erase(std::remove(cols.begin(), cols.end(), "logdir"), cols.end());
  cols.push_back("logdir");
  std::ofstream out(path);
  if (!out) throw Error("tune: cannot write " + path);
  out << "trial_id,status,num_failures,iterations";
  for (const auto& c : cols) out << "," << detail::csv_quote(c);
  out << "\n";
  for (std::size_t i = 0; i < trials_.size(); ++i) {
    const auto& t = trials_[i];
    out << detail::csv_quote(t.id) << "," << to_string(t.status) << "," << t.num_failures << ","
        << t.history.size();
    for (const auto& c : cols)
      out << "," << (rows[i].contains(c) ? detail::csv_field(rows[i].at(c)) : "");
    out << "\n";
  }
}

// ---- Tuner -------------------------------------------------------------------------------

Tuner::Tuner(Runner runner, Config param_space, TuneOptions options, std::string trainable_name)
    : runner_(std::move(runner)),
      trainable_name_(std::move(trainable_name)),
      param_space_(std::move(param_space)),
      options_(std::move(options)) {
  auto& o = options_;
  if (!param_space_.is_object()) {
    throw UsageError("tune::Tuner: param_space must be a JSON object of parameters, got " +
                     param_space_.dump());
  }
  if (o.num_samples < 1)
    throw UsageError("tune::Tuner: num_samples must be >= 1, got " + std::to_string(o.num_samples));
  if (o.trial_resources.processes < 1) {
    throw UsageError("tune::Tuner: trial_resources.processes must be >= 1, got " +
                     std::to_string(o.trial_resources.processes));
  }
  const double gpus = o.trial_resources.gpus;
  if (!(gpus >= 0) || !std::isfinite(gpus)) {
    throw UsageError(
        "tune::Tuner: trial_resources.gpus must be a number >= 0 (0: none, 0.5: "
        "half a GPU, 2: two), got " +
        Config(gpus).dump());
  }
  if (gpus > 0 && detail::gpu_units(gpus) == 0) {
    throw UsageError("tune::Tuner: trial_resources.gpus is " + Config(gpus).dump() +
                     "; a fraction of a GPU is counted to 0.0001 at the finest (as Ray's), so "
                     "ask for 0.0001 or more");
  }
  if (gpus > 1 && gpus != std::floor(gpus)) {
    // Ray 2.60 fails the trial's actor: "GPU resource quantities >1 must be whole numbers".
    throw UsageError("tune::Tuner: trial_resources.gpus is " + Config(gpus).dump() +
                     "; more than 1 GPU must be a whole number (as Ray's), a fraction below 1 "
                     "shares one GPU");
  }
  if (o.num_gpus < -1) {
    throw UsageError(
        "tune::Tuner: num_gpus must be >= 0, or -1 for this machine's visible CUDA devices, "
        "got " +
        std::to_string(o.num_gpus));
  }
  if (o.num_gpus >= 0 && !o.local_mode) {
    throw UsageError(
        "tune::Tuner: num_gpus is for a local search (the GPUs of this machine it hands its "
        "trials); on a cluster the engine counts its GPUs: leave it -1");
  }
  if (gpus > 0 && !o.local_mode && !o.cluster.engine.empty()) {  // no engine: said below
    // The Ray engine asks Ray for GPUs per process; Ray assigns them and sets
    // CUDA_VISIBLE_DEVICES for each agent (python/dtrain/ray.py). The other engines place
    // processes on CPU slots and know no GPU ids.
    if (o.cluster.engine != "ray") {
      throw UsageError(
          "tune::Tuner: trial_resources.gpus > 0 is supported in local mode (GPUs of this "
          "machine, as ray.init(num_gpus=N)) and on cluster engine \"ray\" (Ray assigns them); "
          "engine \"" +
          o.cluster.engine +
          "\" does not place GPUs per trial: run the search locally, on engine \"ray\", or "
          "with gpus = 0");
    }
    const double per_process = gpus / o.trial_resources.processes;
    double& asked = o.cluster.ray.num_gpus_per_process;
    if (asked >= 0 && detail::gpu_units(asked) != detail::gpu_units(per_process)) {
      throw UsageError("tune::Tuner: trial_resources.gpus " + Config(gpus).dump() + " over " +
                       std::to_string(o.trial_resources.processes) + " process(es) is " +
                       Config(per_process).dump() +
                       " GPU(s) per process, but cluster.ray.num_gpus_per_process is " +
                       Config(asked).dump() + "; set one of them (the other follows)");
    }
    asked = per_process;
  }
  if (o.num_cpus < 0) {
    throw UsageError("tune::Tuner: num_cpus must be >= 0 (0: this machine's cores), got " +
                     std::to_string(o.num_cpus));
  }
  if (o.num_cpus > 0 && !o.local_mode) {
    throw UsageError(
        "tune::Tuner: num_cpus is for a local search (the CPUs of this machine it may use); on "
        "a cluster the engine counts its free slots: leave it 0, or cap the trials with "
        "max_concurrent_trials");
  }
  if (o.local_mode && !o.cluster.engine.empty()) {
    throw UsageError(
        "tune::Tuner: cluster.engine is \"" + o.cluster.engine +
        "\" but local_mode is true; set "
        "local_mode = false to run the trials on that engine, or leave cluster empty to run "
        "them on this machine");
  }
  if (!o.local_mode) {
    if (o.cluster.engine.empty()) {
      throw UsageError("tune::Tuner: local_mode = false needs cluster.engine (" +
                       engines::cluster_engine_list(false) +
                       ") and that engine's settings (ClusterOptions, dtrain/distributor.h)");
    }
    cluster_probe(o);  // UsageError: the engine's settings do not fit the trials
  }
  if (o.max_concurrent_trials < 0 || o.max_failures < 0) {
    throw UsageError("tune::Tuner: max_concurrent_trials and max_failures must be >= 0");
  }
  if (!o.mode.empty() && o.mode != "min" && o.mode != "max") {
    throw UsageError("tune::Tuner: mode must be \"min\" or \"max\", got \"" + o.mode + "\"");
  }
  if (o.name.empty() || o.name.find('/') != std::string::npos) {
    throw UsageError("tune::Tuner: name must be a non-empty directory name, got \"" + o.name +
                     "\"");
  }
  if (trainable_name_.empty() || trainable_name_.find('/') != std::string::npos) {
    throw UsageError(
        "tune::Tuner: the trainable's name (with_name) names its trials' directories; it must "
        "be non-empty and hold no \"/\", got \"" +
        trainable_name_ + "\"");
  }
  if (o.time_budget.count() < 0) {
    throw UsageError("tune::Tuner: time_budget must be >= 0 (0: no budget), got " +
                     std::to_string(o.time_budget.count()) + " ms");
  }
  if (o.time_budget.count() > 0) {
    // Ray's Experiment: CombinedStopper(stop, TimeoutStopper(time_budget_s)), or the timeout alone.
    auto timeout = std::make_shared<TimeoutStopper>(o.time_budget);
    o.stopper = o.stopper ? std::make_shared<CombinedStopper>(o.stopper, timeout)
                          : std::shared_ptr<Stopper>(timeout);
  }
  detail::check_checkpoint_config(o.checkpoint_config);
  if (o.storage_path.empty()) o.storage_path = "dtrain_tune_results";
  if (!o.scheduler) o.scheduler = std::make_shared<FifoScheduler>();
  o.scheduler->set_search_properties(o.metric, o.mode);
  o.scheduler->seed_random(o.seed ^ 0x9e3779b97f4a7c15ULL);
}

ResultGrid Tuner::fit() {
  auto& o = options_;
  // The GPUs the trials get, as a local Ray node's (gpu_pool.h); counted only when asked for,
  // and checked before anything is written.
  std::optional<detail::GpuPool> gpu_pool;
  const std::int64_t gpu_units = detail::gpu_units(o.trial_resources.gpus);
  std::optional<std::string> driver_devices;  // CUDA_VISIBLE_DEVICES the trials start with
  if (o.env.count("CUDA_VISIBLE_DEVICES")) {
    driver_devices = o.env.at("CUDA_VISIBLE_DEVICES");
  } else if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    driver_devices = v;
  }
  // Ray 2.60 leaves a 0-GPU worker's CUDA_VISIBLE_DEVICES alone unless its environment has
  // RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO true (Ray's env_bool: "1" or "true", any case); then it
  // sets "" (its behaviour before 2.47). Read from the trials' environment (TuneOptions::env),
  // else the driver's, where Ray's workers inherit it from.
  bool empty_devices_on_zero = false;
  {
    std::optional<std::string> v = param::kRayAccelEnvVarOverrideOnZero.get_if_set();
    if (o.env.count("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"))
      v = o.env.at("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO");
    if (v) {
      std::string lower = *v;
      for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      empty_devices_on_zero = lower == "1" || lower == "true";
    }
  }
  if (o.local_mode && gpu_units > 0) {
    int declared = o.num_gpus;
    std::string how = "TuneOptions::num_gpus";
    if (declared < 0) {
      const launch::GpuCount c = launch::count_gpus();
      declared = c.count;
      how = "this machine's visible CUDA devices, counted by " + c.how +
            "; declare them with TuneOptions::num_gpus";
    }
    gpu_pool.emplace(declared);
    if (!detail::GpuPool(declared).acquire(gpu_units)) {
      throw UsageError("tune: trial_resources.gpus is " +
                       Config(o.trial_resources.gpus.value).dump() + " but the search has " +
                       std::to_string(declared) + " GPU(s) (" + how +
                       "): no trial could ever start (Ray Tune would wait for them, with a "
                       "warning after 60 s). Ask for fewer GPUs per trial, or declare more with "
                       "TuneOptions::num_gpus");
    }
    if (o.verbose) {
      std::fprintf(stderr, "tune: %d GPU(s) for the trials (%s), %s each\n", declared, how.c_str(),
                   Config(o.trial_resources.gpus.value).dump().c_str());
    }
  }

  const fs::path exp_dir = fs::absolute(fs::path(o.storage_path) / o.name);
  const fs::path state_path = exp_dir / "tuner_state.json";

  std::vector<std::unique_ptr<TrialRecord>> trials;
  // Variants not yet made trials: with max_concurrent_trials, Ray's BasicVariantGenerator makes
  // the next trial only while fewer than that many are live (not ended; a paused trial is live).
  std::deque<std::unique_ptr<TrialRecord>> uncreated;
  // Checkpoints checkpoint_config no longer keeps that a trial not ended may still start from
  // (a PBT exploit's donor checkpoint): deleted once none does.
  std::vector<std::string> doomed;
  std::int64_t seq = 0;
  bool resumed = false;
  Config saved_stopper_state;  // what the stopper's saved_state() gave, saved with the search
  // Ray's uuid_prefix: the 5 hex characters of every trial id of this search (trial_names.h).
  // Saved; a search saved before dtrain named trials as Ray has none, and keeps its trial_00000
  // ids and directories (every trial of a search is in its state, so none is named anew).
  std::string experiment_id;
  std::string mlflow_parent_id;

  if (o.resume && fs::exists(state_path)) {
    std::ifstream in(state_path);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) throw Error("tune: cannot read " + state_path.string());
    // NaN and infinite metrics come back as the numbers they were (state_json.h).
    const Config state = detail::parse_state_json(text.str(), state_path.string());
    if (state.value("version", 0) != kStateVersion) {
      throw UsageError("tune: " + state_path.string() +
                       " was written by another version of dtrain::tune");
    }
    param_space_ = state.at("param_space");
    experiment_id = state.value("experiment_id", "");
    seq = state.value("seq", std::int64_t{0});
    mlflow_parent_id = state.value("mlflow_parent_run_id", "");
    for (const auto& s : state.at("trials")) {
      auto r = std::make_unique<TrialRecord>();
      r->trial.id = s.at("id");
      r->trial.config = s.at("config");
      r->trial.experiment_tag = s.value("tag", r->trial.id);
      r->trial.status = status_from(s.at("status"));
      for (const auto& h : s.at("history")) r->history.push_back(h);
      r->history_seq = s.at("history_seq").get<std::vector<std::int64_t>>();
      for (const auto& h : s.value("rewound", Config::array())) r->rewound.push_back(h);
      r->rewound_seq = s.value("rewound_seq", std::vector<std::int64_t>{});
      r->latest_checkpoint = s.value("latest_checkpoint", "");
      r->latest_checkpoint_iteration = s.value("latest_checkpoint_iteration", std::int64_t{0});
      r->restore_checkpoint = s.value("restore_checkpoint", "");
      r->restore_iteration = s.value("restore_iteration", std::int64_t{0});
      r->latest_checkpoint_time = s.value("latest_checkpoint_time", 0.0);
      r->restore_time = s.value("restore_time", 0.0);
      r->num_failures = s.value("num_failures", 0);
      r->runs = s.value("runs", 0);
      r->error = s.value("error", "");
      r->dir = s.at("dir");
      r->name = s.value("name", "");  // a state saved before names: named again when made
      r->mlflow_run_id = s.value("mlflow_run_id", "");
      r->keeper = detail::CheckpointKeeper(o.checkpoint_config);
      r->keeper.from_json(s.value("checkpoints", Config::object()));
      const Config cps = s.value("checkpoint_iterations", Config::object());
      for (auto it = cps.begin(); it != cps.end(); ++it) {
        r->checkpoint_iterations[it.key()] = it.value().get<std::int64_t>();
      }
      const Config times = s.value("checkpoint_times", Config::object());
      for (auto it = times.begin(); it != times.end(); ++it) {
        r->checkpoint_times[it.key()] = it.value().get<double>();
      }
      r->returned = s.value("returned", false);
      if (!r->trial.is_finished()) {
        // Interrupted: start again from its latest checkpoint (or a pending exploit's).
        // Reports after that checkpoint will be made again; they leave the history. Every trial
        // not ended is PENDING again, paused or not, as Ray's Tuner.restore re-queues it
        // (ResumeConfig's default RESUME for unfinished trials).
        if (r->trial.status == TrialStatus::Running) rewind_to_latest_checkpoint(*r);
        r->trial.status = TrialStatus::Pending;
      }
      trials.push_back(std::move(r));
    }
    // Ray's _requeue_restored_trials adds the saved trials again sorted by their last result's
    // time, the most recent first (those without a result last, in their order): the order a
    // FIFO search starts the unfinished ones in when they do not all fit at once, and the
    // order of the result grid. The driver's count of results taken stands for that time.
    std::stable_sort(trials.begin(), trials.end(), [](const auto& a, const auto& b) {
      return last_report_seq(*a) > last_report_seq(*b);
    });
    for (const auto& s : state.value("uncreated", Config::array())) {
      auto r = std::make_unique<TrialRecord>();
      r->trial.id = s.at("id");
      r->trial.config = s.at("config");
      r->trial.experiment_tag = s.value("tag", r->trial.id);
      r->dir = s.at("dir");
      r->keeper = detail::CheckpointKeeper(o.checkpoint_config);
      uncreated.push_back(std::move(r));
    }
    doomed = state.value("doomed_checkpoints", std::vector<std::string>{});
    saved_stopper_state = state.value("stopper_state", Config(nullptr));
    resumed = true;
  } else {
    if (!o.resume && fs::exists(state_path)) {
      throw UsageError("tune: " + state_path.string() +
                       " holds an earlier search; set TuneOptions::resume "
                       "to continue it, or choose another storage_path / name");
    }
    const auto configs = generate_variants(param_space_, o.num_samples, o.seed);
    experiment_id = detail::new_experiment_id();
    for (std::size_t i = 0; i < configs.size(); ++i) {
      auto r = std::make_unique<TrialRecord>();
      r->trial.id = detail::trial_id(experiment_id, i);
      r->trial.config = configs[i];
      r->trial.experiment_tag = detail::experiment_tag(i, param_space_, configs[i]);
      r->keeper = detail::CheckpointKeeper(o.checkpoint_config);
      uncreated.push_back(std::move(r));  // its directory is named when it is made
    }
  }
  // A trial's name and directory in Ray's order. Ray's Trial() calls trial_name_creator and
  // trial_dirname_creator when the trial is made, before the scheduler's on_trial_add (which
  // may fill its config: PBT's hyperparam_mutations), so a creator sees the config as the
  // search made it; the default name (Ray's str(trial), which reads the config's "env") and the
  // default directory name (<name>_<tag>_<date>, made when Ray schedules the trial) come after.
  // name_trial: the creators (nothing written). UsageError: a creator threw, or the directory
  // name is empty or has "/".
  auto name_trial = [&](TrialRecord& r) {
    if (r.name.empty() && o.trial_name_creator) {
      try {
        r.name = o.trial_name_creator(r.trial);
      } catch (const std::exception& e) {
        throw UsageError("tune: TuneOptions::trial_name_creator failed for trial " + r.trial.id +
                         ": " + e.what());
      }
    }
    if (r.dir.empty() && o.trial_dirname_creator) {
      std::string name;
      try {
        name = o.trial_dirname_creator(r.trial);
      } catch (const std::exception& e) {
        throw UsageError("tune: TuneOptions::trial_dirname_creator failed for trial " + r.trial.id +
                         ": " + e.what());
      }
      if (name.empty() || name.find('/') != std::string::npos) {
        throw UsageError("tune: TuneOptions::trial_dirname_creator gave trial " + r.trial.id +
                         " the directory name \"" + name +
                         "\"; return a non-empty name without \"/\"");
      }
      r.custom_dirname = detail::sanitize_dirname(name);
    }
  };
  // make_trial_dir, after on_trial_add: Ray's own name where no creator gave one (or it returned
  // ""), the directory (the creator's, or Ray's name, which starts with the trial's name) made
  // unique and created. UsageError: TUNE_MAX_LEN_IDENTIFIER is not an integer >= 1.
  auto make_trial_dir = [&](TrialRecord& r) {
    if (r.name.empty()) r.name = detail::trial_name(trainable_name_, r.trial.id, r.trial.config);
    if (r.dir.empty()) {
      std::string name = r.custom_dirname;
      if (name.empty()) {
        const auto max_len = param::Int{"TUNE_MAX_LEN_IDENTIFIER", 130, 1}.get();
        name = detail::trial_dirname(r.name, r.trial.experiment_tag, detail::date_str(),
                                     static_cast<std::size_t>(max_len));
      }
      r.dir = (exp_dir / detail::unique_dirname(exp_dir, name)).string();
    }
    fs::create_directories(r.dir);
  };
  // Trials not ended: what Ray's variant generator counts against max_concurrent_trials.
  auto live_trials = [&] {
    return static_cast<int>(std::count_if(trials.begin(), trials.end(),
                                          [](auto& r) { return !r->trial.is_finished(); }));
  };
  auto may_create = [&] {
    return !uncreated.empty() &&
           (o.max_concurrent_trials == 0 || live_trials() < o.max_concurrent_trials);
  };
  while (may_create()) {
    trials.push_back(std::move(uncreated.front()));
    uncreated.pop_front();
  }
  Context ctx(trials);
  ctx.verbose = o.verbose;
  TrialScheduler& sched = *o.scheduler;
  for (auto& r : trials) {
    name_trial(*r);
    sched.on_trial_add(ctx, r->trial);  // UsageError: no metric/mode
  }
  for (auto& r : trials) make_trial_dir(*r);
  if (resumed) {
    // The scheduler starts afresh, as Ray 2.60's Tuner.restore starts it: Ray saves no
    // scheduler state (TuneController.__getstate__ leaves _scheduler_alg out; the scheduler
    // comes back from tuner.pkl as it was before the search ran) and only adds every trial
    // again (on_trial_add, above). So ASHA's rungs hold only what is reported after the resume,
    // and PBT's quantiles and perturbation times start anew.
    //
    // The stopper goes on where it was, as Ray's does: Ray keeps it in its experiment state
    // (TuneController.__getstate__ keeps _stopper, pickled) and Tuner.restore takes it back as
    // it was at the last save. A C++ stopper cannot be pickled, so it is shown every result it
    // was shown before, in the order the driver took them: the ones a restore from a
    // checkpoint will bring again included (Ray's stopper counted them before the restore, and
    // counts them again), and a returned trial's last result twice (Ray's __duplicate__).
    // Its decisions were taken already; a TimeoutStopper's budget is restored below.
    std::vector<std::tuple<std::int64_t, int, const TrialRecord*, Result>> events;
    for (auto& r : trials) {
      for (std::size_t i = 0; i < r->history.size(); ++i)
        events.emplace_back(r->history_seq[i], 0, r.get(), r->history[i]);
      for (std::size_t i = 0; i < r->rewound.size(); ++i)
        events.emplace_back(r->rewound_seq[i], 0, r.get(), r->rewound[i]);
      if (r->returned && !r->history.empty())
        events.emplace_back(r->history_seq.back(), 1, r.get(), r->history.back());
    }
    std::stable_sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
      return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
    });
    if (o.stopper) {
      for (auto& [s, dup, r, result] : events) (*o.stopper)(r->trial.id, result);
      if (!saved_stopper_state.is_null()) o.stopper->restore_state(saved_stopper_state);
    }
  }

  fs::create_directories(exp_dir);
  detail::MlflowTrials mlflow(o.mlflow_tracking_uri, o.mlflow_experiment, o.name, mlflow_parent_id,
                              param_space_);
  Clock::time_point last_save = Clock::now();
  auto save_state = [&] {
    Config state{{"version", kStateVersion},
                 {"experiment_id", experiment_id},
                 {"param_space", param_space_},
                 {"metric", o.metric},
                 {"mode", o.mode},
                 {"scheduler", sched.name()},
                 {"seq", seq},
                 {"mlflow_parent_run_id", mlflow.parent_run_id()}};
    Config list = Config::array();
    for (auto& r : trials) {
      Config cp = Config::object();
      for (auto& [k, v] : r->checkpoint_iterations) cp[k] = v;
      Config times = Config::object();
      for (auto& [k, v] : r->checkpoint_times) times[k] = v;
      list.push_back({{"id", r->trial.id},
                      {"config", r->trial.config},
                      {"tag", r->trial.experiment_tag},
                      {"status", to_string(r->trial.status)},
                      {"history", r->history},
                      {"history_seq", r->history_seq},
                      {"rewound", r->rewound},
                      {"rewound_seq", r->rewound_seq},
                      {"latest_checkpoint", r->latest_checkpoint},
                      {"latest_checkpoint_iteration", r->latest_checkpoint_iteration},
                      {"restore_checkpoint", r->restore_checkpoint},
                      {"restore_iteration", r->restore_iteration},
                      {"latest_checkpoint_time", r->latest_checkpoint_time},
                      {"restore_time", r->restore_time},
                      {"num_failures", r->num_failures},
                      {"runs", r->runs},
                      {"returned", r->returned},
                      {"error", r->error},
                      {"dir", r->dir},
                      {"name", r->name},
                      {"mlflow_run_id", r->mlflow_run_id},
                      {"checkpoint_iterations", cp},
                      {"checkpoint_times", times},
                      {"checkpoints", r->keeper.to_json()}});
    }
    state["trials"] = list;
    Config later = Config::array();
    for (auto& r : uncreated) {
      later.push_back({{"id", r->trial.id},
                       {"config", r->trial.config},
                       {"tag", r->trial.experiment_tag},
                       {"dir", r->dir}});
    }
    state["uncreated"] = later;
    state["doomed_checkpoints"] = doomed;
    // Ray's experiment state holds the stopper itself; the results give back the rest.
    state["stopper_state"] = o.stopper ? o.stopper->saved_state() : Config(nullptr);
    last_save = Clock::now();
    const fs::path tmp = state_path.string() + ".tmp";
    {
      std::ofstream out(tmp);
      out << detail::dump_state_json(state);  // NaN / Infinity as Ray's experiment state has them
      if (!out) throw Error("tune: cannot write " + tmp.string());
    }
    fs::rename(tmp, state_path);  // atomic: a killed driver leaves the old or the new state
  };
  save_state();

  // The store the trials report to: loopback when they run on this machine; on a cluster
  // every interface, at the address the Distributor gives its nodes for this driver.
  std::string driver_addr = "127.0.0.1";
  if (!o.local_mode) {
    try {
      driver_addr = cluster_probe(o).driver_address();
    } catch (const UsageError& e) {
      throw UsageError(std::string("tune::Tuner: no address for the trials to report to: ") +
                       e.what());
    }
  }
  store::StoreServer::Options so;
  so.bind_host = o.local_mode ? "127.0.0.1" : "";
  auto server = store::StoreServer::start(so);
  const std::string store_addr =
      (driver_addr.find(':') != std::string::npos ? "[" + driver_addr + "]" : driver_addr) + ":" +
      std::to_string(server->port());
  store::StoreClient::Options co;
  co.timeout = std::chrono::seconds(30);
  auto client = store::StoreClient::connect("127.0.0.1", server->port(), co);
  // Run keys stay unique across driver restarts: a resumed search has its own store, but
  // the run counter keeps counting (runs) so logs and keys never repeat.

  // One fork server, libraries loaded once, forks every trial's workers (warm_fork_server.h).
  std::unique_ptr<detail::WarmForkServer> warm_server;
  if (o.local_mode) warm_server = detail::WarmForkServer::start(o.env);
  // On a cluster whose hosts the driver reaches itself (ssh), one on each host, kept for the
  // search (warm_hosts.h); other engines place the processes themselves (docs/tune.md).
  std::unique_ptr<detail::WarmHosts> warm_hosts;
  if (!o.local_mode) {
    const DistributorOptions d = trial_distributor_options(o);
    if (const auto hosts =
            engines::for_job(d).host_commands(d, distributor::find_launcher(d.launcher))) {
      warm_hosts = detail::WarmHosts::start(*hosts, o.env, o.verbose);
    }
  }

  // As many trials at once as the engine's free slots hold, asked again as runs end where the
  // engine's count follows its jobs (concurrency.h).
  detail::Concurrency concurrency({trial_distributor_options(o), o.trial_resources.processes,
                                   o.max_concurrent_trials, o.num_cpus, o.verbose,
                                   o.local_mode ? "" : o.cluster.engine});

  std::mutex done_mutex;
  std::condition_variable done_cv;

  // Runs whose processes are still up (a trial PBT paused counts until its run has ended).
  auto running_count = [&] {
    return static_cast<int>(
        std::count_if(trials.begin(), trials.end(), [](auto& r) { return r->thread.joinable(); }));
  };

  // Trials that would start if there were room (PBT's paused ones once their run has ended).
  auto waiting = [&] {
    return std::any_of(trials.begin(), trials.end(), [](auto& r) {
      return !r->thread.joinable() &&
             (r->trial.status == TrialStatus::Pending || r->trial.status == TrialStatus::Paused);
    });
  };
  // For the engine's free slots: runs not ended (one that ended may have freed its slots before
  // this loop took its end in), and of them those that held their slots at `t` (had reported).
  auto live_runs = [&] {
    return static_cast<int>(std::count_if(trials.begin(), trials.end(), [](auto& r) {
      return r->thread.joinable() && !r->finished;
    }));
  };
  auto counted = [&](Clock::time_point t) {
    return static_cast<int>(std::count_if(trials.begin(), trials.end(), [t](auto& r) {
      return r->thread.joinable() && !r->finished && r->first_report < t;
    }));
  };

  auto start_trial = [&](TrialRecord& r) {
    r.trial.status = TrialStatus::Running;
    ++r.runs;
    r.prefix = "trial/" + r.trial.id + "/run/" + std::to_string(r.runs) + "/";
    r.next_report = 1;
    r.first_report = Clock::time_point::max();
    r.stop_requested = r.pause_requested = false;
    r.finished = false;
    r.failure.clear();
    r.stopped_by_worker_exception = false;
    r.started = Clock::now();
    r.time_since_restore = 0;
    detail::write_params(r.dir, r.trial.config);  // Ray's params.json, at every start
    DistributorOptions d = trial_distributor_options(o);
    d.env["DTRAIN_TUNE_STORE"] = store_addr;
    d.env["DTRAIN_TUNE_PREFIX"] = r.prefix;
    d.env["DTRAIN_TUNE_TRIAL_ID"] = r.trial.id;
    d.env["DTRAIN_TUNE_TRIAL_DIR"] = r.dir;
    d.env["DTRAIN_TUNE_CHECKPOINT"] = r.restore_checkpoint;
    d.env["DTRAIN_TUNE_START_ITERATION"] = std::to_string(r.restore_iteration);
    d.env["DTRAIN_TUNE_RUN"] = std::to_string(r.runs);
    // Ray's storage index: the trial's last checkpoint's (one per checkpoint it reported).
    d.env["DTRAIN_TUNE_CHECKPOINT_INDEX"] =
        std::to_string(static_cast<std::int64_t>(r.checkpoint_iterations.size()) - 1);
    d.env["DTRAIN_TUNE_REPORT_TIMEOUT_MS"] = std::to_string(o.report_timeout.count());
    if (warm_server) d.env["DTRAIN_FORKSERVER_WARM_SOCKET"] = warm_server->agent_env();
    if (warm_hosts) d.env["DTRAIN_FORKSERVER_WARM_SOCKET"] = warm_hosts->agent_env();
    // An engine without dtrain agents (mpi) keeps no logs (the MPI launcher's own options do).
    if (engines::for_job(d).runs_agents()) d.log_dir = (fs::path(r.dir) / "logs").string();
    if (!r.gpus.empty()) {
      d.env["CUDA_VISIBLE_DEVICES"] =
          detail::GpuPool::visible_devices(detail::GpuPool::ids(r.gpus), driver_devices);
    } else if (o.local_mode && empty_devices_on_zero) {
      d.env["CUDA_VISIBLE_DEVICES"] = "";  // as Ray with RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO
    }
    if (mlflow.active()) {
      // The driver logs the trial's reports in its child run; the trial's own processes (and
      // its Distributor) open no runs of their own.
      d.env["MLFLOW_TRACKING_URI"] = "";
      r.mlflow_run_id =
          mlflow.trial_started(r.trial.id, r.name, r.trial.config, r.mlflow_run_id, r.runs == 1);
    }
    if (o.verbose) {
      std::fprintf(
          stderr, "tune: %s starts (run %d%s%s) %s\n", r.name.c_str(), r.runs,
          r.restore_checkpoint.empty() ? "" : (", from " + r.restore_checkpoint).c_str(),
          r.gpus.empty() ? "" : (", CUDA_VISIBLE_DEVICES=" + d.env["CUDA_VISIBLE_DEVICES"]).c_str(),
          r.trial.config.dump().c_str());
    }
    Config config = r.trial.config;
    r.thread = std::thread([&r, d, config, this, &done_mutex, &done_cv] {
      try {
        Distributor dist(d);
        runner_(dist, config);
      } catch (const WorkerError& e) {
        r.stopped_by_worker_exception =
            e.exception_type().find("TrialStopped") != std::string::npos;
        r.failure = e.what();
      } catch (const std::exception& e) {
        r.failure = e.what();
        if (r.failure.empty()) r.failure = "unknown error";
      }
      {
        std::lock_guard<std::mutex> lock(done_mutex);
        r.finished = true;
      }
      done_cv.notify_all();
    });
  };

  // A result the search cannot use (no metric, or the scheduler refused it): Ray fails the
  // search at that result. Every trial is told STOP at its next report, the runs are waited
  // for, and fit() throws this.
  std::string fatal;

  // The result of report `iteration` as Ray's Trainable and TuneController complete it: the
  // trial's metrics, then the fields Ray adds, in Ray's order. Times are the driver's: the
  // first report's time_this_iter_s counts from the run's start (its processes' start-up
  // included); a time_this_iter_s the trial reported replaces the measured one, as in Ray.
  auto complete_result = [&](TrialRecord& r, const Config& msg, std::int64_t iteration,
                             Clock::time_point now) {
    Result result = detail::metrics_of(msg);  // NaN and infinities as the trainable reported
    double this_iter =
        std::chrono::duration<double>(now - (r.next_report == 1 ? r.started : r.last_report))
            .count();
    if (result.contains("time_this_iter_s") && result.at("time_this_iter_s").is_number())
      this_iter = result.at("time_this_iter_s").get<double>();
    r.last_report = now;
    r.time_since_restore += this_iter;
    const auto wall = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(wall);
    std::tm local{};
    ::localtime_r(&t, &local);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d_%H-%M-%S", &local);
    result["timestamp"] = static_cast<std::int64_t>(t);
    if (msg.contains("checkpoint")) {
      result["checkpoint_dir_name"] =
          fs::path(msg.at("checkpoint").get<std::string>()).filename().string();
      result["should_checkpoint"] = true;
    } else {
      result["checkpoint_dir_name"] = nullptr;
    }
    if (!result.contains("done")) result["done"] = false;
    result["training_iteration"] = iteration;
    result["trial_id"] = r.trial.id;
    result["date"] = date;
    result["time_this_iter_s"] = this_iter;
    result["time_total_s"] = r.restore_time + r.time_since_restore;
    for (const char* k : {"pid", "hostname", "node_ip"}) {
      if (msg.contains(k)) result[k] = msg.at(k);
    }
    result["config"] = r.trial.config;
    result["time_since_restore"] = r.time_since_restore;
    result["iterations_since_restore"] = r.next_report;
    return result;
  };

  // Ray's Trial.should_stop on the flattened result: a true "done", or any `stop` key whose
  // value is >= its bound. A key the result lacks is said once and never stops the trial.
  bool warned_missing_stop_key = false;
  // Python's truth and comparisons: a done of 1 counts, a boolean compares as 0 or 1.
  auto as_number = [](const Config& v) {
    return v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>();
  };
  auto should_stop = [&](const Config& flat) {
    if (flat.contains("done") && (flat.at("done").is_boolean() || flat.at("done").is_number()) &&
        as_number(flat.at("done")) != 0)
      return true;
    for (const auto& [key, bound] : o.stop) {
      if (!flat.contains(key) || !(flat.at(key).is_number() || flat.at(key).is_boolean())) {
        if (!warned_missing_stop_key) {
          warned_missing_stop_key = true;
          std::string keys;
          for (auto it = flat.begin(); it != flat.end(); ++it)
            keys += (keys.empty() ? "" : ", ") + it.key();
          std::fprintf(stderr,
                       "tune: stopping criterion '%s' not found in result dict! Available keys "
                       "are %s. If '%s' is never reported, the run will continue until training "
                       "is finished.\n",
                       key.c_str(), keys.c_str(), key.c_str());
        }
        continue;
      }
      if (as_number(flat.at(key)) >= bound) return true;
    }
    return false;
  };

  // The stopper (Ray's RunConfig(stop=Stopper)) on one result, not flattened, as Ray's
  // controller passes it. What it throws ends the search as a refused result does.
  auto ask_stopper = [&](TrialRecord& r, const Result& result) {
    if (!o.stopper || !fatal.empty()) return false;
    try {
      return (*o.stopper)(r.trial.id, result);
    } catch (const std::exception& e) {
      fatal = "tune: the stopper (TuneOptions::stopper) failed on trial " + r.trial.id +
              "'s result " + result.value("training_iteration", Config(0)).dump() + ": " + e.what();
      return false;
    }
  };
  // The stopper's stop_all() (Ray's _stop_experiment_if_needed): when it says so, every trial
  // not ended is TERMINATED; a running one is answered STOP at its next report, which is not
  // recorded (Ray removes its actor and drops what it sends), and is not marked done. The
  // scheduler is not told (Ray's _schedule_trial_stop). Asked after every result and every
  // ended run, and every 100 ms otherwise (Ray: after every event, or 0.1 s without one).
  bool search_stopped = false;
  Clock::time_point last_stop_all{};
  auto end_search_if_asked = [&]() -> bool {
    if (!o.stopper || search_stopped || !fatal.empty()) return search_stopped;
    last_stop_all = Clock::now();
    try {
      if (!o.stopper->stop_all()) return false;
    } catch (const std::exception& e) {
      fatal =
          std::string("tune: the stopper's stop_all() (TuneOptions::stopper) failed: ") + e.what();
      return false;
    }
    search_stopped = true;
    int ended = 0;
    for (auto& x : trials) {
      // A trial its own STOP ends is TERMINATED by that already in Ray.
      if (x->trial.is_finished() || x->stop_requested) continue;
      x->trial.status = TrialStatus::Terminated;
      x->search_stopped = true;
      ++ended;
      if (!x->thread.joinable()) mlflow.trial_ended(x->trial.id, TrialStatus::Terminated, "");
    }
    if (o.verbose) {
      std::fprintf(stderr,
                   "tune: the stopper's stop_all() ended the search; %d trial(s) not finished "
                   "are TERMINATED\n",
                   ended);
    }
    save_state();
    return true;
  };

  // Deletes the checkpoints checkpoint_config let go that no trial not ended starts from.
  auto delete_doomed = [&] {
    std::erase_if(doomed, [&](const std::string& path) {
      for (auto& x : trials) {
        if (!x->trial.is_finished() && x->restore_checkpoint == path) return false;
      }
      std::error_code ec;
      fs::remove_all(path, ec);
      return true;
    });
  };

  // Reads and decides every report the trial has made so far.
  auto poll_reports = [&](TrialRecord& r) -> bool {
    bool any = false;
    for (;;) {
      const std::string key = r.prefix + "result/" + std::to_string(r.next_report);
      if (!client->check({key})) return any;
      any = true;
      if (r.search_stopped) {
        client->set(r.prefix + "decision/" + std::to_string(r.next_report), "STOP");
        ++r.next_report;
        continue;
      }
      const Clock::time_point now = Clock::now();
      if (r.next_report == 1) r.first_report = now;
      const Config msg = Config::parse(client->get(key));
      const std::int64_t iteration = r.restore_iteration + r.next_report;
      Result result = complete_result(r, msg, iteration, now);
      const Config flat = detail::flatten(result);  // what Ray's schedulers and `stop` see
      if (msg.contains("checkpoint")) {
        r.latest_checkpoint = msg.at("checkpoint");
        r.latest_checkpoint_iteration = iteration;
        r.latest_checkpoint_time = result.at("time_total_s").get<double>();
        r.checkpoint_iterations[r.latest_checkpoint] = iteration;
        r.checkpoint_times[r.latest_checkpoint] = r.latest_checkpoint_time;
        try {
          for (auto& gone : r.keeper.add(r.latest_checkpoint, result))
            doomed.push_back(std::move(gone));
          delete_doomed();
        } catch (const UsageError& e) {
          if (fatal.empty()) fatal = e.what();
        }
      }
      std::string decision = "CONTINUE";
      if (fatal.empty() && !o.metric.empty() && !flat.contains(o.metric)) {
        std::string keys;
        const Config& metrics = msg.at("metrics");
        for (auto it = metrics.begin(); it != metrics.end(); ++it)
          keys += (keys.empty() ? "" : ", ") + it.key();
        fatal = "tune: trial " + r.trial.id + "'s result " + std::to_string(iteration) +
                " has no metric \"" + o.metric + "\" (TuneOptions::metric); it reports " +
                (keys.empty() ? "nothing" : keys) + ". Report \"" + o.metric +
                "\" in every tune::report() call, or set "
                "TuneOptions::metric to one of these";
      }
      if (!fatal.empty()) r.stop_requested = true;
      if (!r.stop_requested && !r.pause_requested) {
        Decision d = Decision::Continue;
        // Ray: `stopper(trial_id, result) or trial.should_stop(flat)`, the scheduler not asked.
        if (ask_stopper(r, result) || (fatal.empty() && should_stop(flat))) {
          d = Decision::Stop;
        } else if (!fatal.empty()) {
          r.stop_requested = true;
          d = Decision::Stop;
        } else {
          try {
            d = sched.on_trial_result(ctx, r.trial, flat);
          } catch (const UsageError& e) {
            fatal = e.what();
            r.stop_requested = true;
            d = Decision::Stop;
          }
        }
        if (d == Decision::Stop) {
          r.stop_requested = true;
          decision = "STOP";
        } else if (d == Decision::Pause || r.pause_requested) {
          r.pause_requested = true;
          r.trial.status = TrialStatus::Paused;
          decision = "PAUSE";
        }
      } else {
        decision = r.stop_requested ? "STOP" : "PAUSE";
      }
      // Ray marks a result the trial stops at done before it logs it.
      if (decision == "STOP") result["done"] = true;
      detail::append_result(r.dir, result);  // result.json, progress.csv
      r.history.push_back(result);
      r.history_seq.push_back(seq++);
      mlflow.trial_result(r.trial.id, detail::flatten(result));  // as Ray's MLflow callback
      if (end_search_if_asked() && r.search_stopped) decision = "STOP";
      client->set(r.prefix + "decision/" + std::to_string(r.next_report), decision);
      ++r.next_report;
      save_state();
    }
  };

  auto finish_run = [&](TrialRecord& r) {
    r.thread.join();
    // Its processes are gone: its GPUs are free for the next trial (a paused one acquires anew).
    if (gpu_pool) gpu_pool->release(r.gpus);
    r.gpus.clear();
    poll_reports(r);  // none should be left (reports block their worker); be sure
    // A trial that ended (returned, or stopped) has its last result marked done, as Ray's
    // last_result (result.json keeps the line as it was logged).
    const bool returned = !r.search_stopped && !r.stop_requested && !r.pause_requested &&
                          r.failure.empty() && !r.history.empty();
    if (!r.search_stopped && !r.history.empty() &&
        (r.stop_requested || (!r.pause_requested && r.failure.empty())))
      r.history.back()["done"] = true;
    // Ray's function trainable that returns sends its last result again (__duplicate__), done,
    // and the controller gives it to the stopper once more before it stops the trial.
    r.returned = returned;
    if (returned) ask_stopper(r, r.history.back());
    const Result last = r.history.empty() ? Result::object() : detail::flatten(r.history.back());
    const char* how;
    // A run the driver asked to end (STOP, PAUSE for PBT, or the search's end) ended as asked,
    // however its processes went: report() throws TrialStopped on the ranks that call it, and
    // the launcher may summarise that as rank 0's exit code rather than the exception type.
    if (r.search_stopped) {
      r.trial.status = TrialStatus::Terminated;
      how = "ended with the search (the stopper's stop_all)";
    } else if (r.stop_requested) {
      r.trial.status = TrialStatus::Terminated;
      sched.on_trial_complete(ctx, r.trial, last);
      how = "stopped by the scheduler";
    } else if (r.pause_requested) {
      r.trial.status = TrialStatus::Paused;
      if (!r.exploit_pending) {
        // A plain pause resumes from its own latest checkpoint; an exploit set another's.
        rewind_to_latest_checkpoint(r);
      }
      how = r.exploit_pending ? "paused for an exploit" : "paused";
      r.exploit_pending = false;
    } else if (r.failure.empty()) {
      r.trial.status = TrialStatus::Terminated;
      sched.on_trial_complete(ctx, r.trial, last);
      how = "finished";
    } else {
      ++r.num_failures;
      r.error = r.failure;
      if (r.num_failures <= o.max_failures) {
        r.trial.status = TrialStatus::Pending;
        rewind_to_latest_checkpoint(r);
        how = "failed, retrying";
      } else {
        r.trial.status = TrialStatus::Error;
        sched.on_trial_error(ctx, r.trial);
        how = "failed";
      }
    }
    if (r.trial.status == TrialStatus::Terminated || r.trial.status == TrialStatus::Error) {
      mlflow.trial_ended(r.trial.id, r.trial.status,
                         r.trial.status == TrialStatus::Error ? r.error : "");
    }
    if (o.verbose) {
      std::string m;
      if (!o.metric.empty() && last.contains(o.metric))
        m = ", " + o.metric + "=" + last.at(o.metric).dump();
      std::fprintf(stderr, "tune: %s %s after %zu report(s)%s%s\n", r.name.c_str(), how,
                   r.history.size(), m.c_str(),
                   r.failure.empty() || r.stop_requested || r.pause_requested ||
                           r.stopped_by_worker_exception || r.search_stopped
                       ? ""
                       : (": " + r.failure.substr(0, 300)).c_str());
    }
    save_state();
    end_search_if_asked();
  };

  for (;;) {
    if (!fatal.empty()) {
      for (auto& r : trials)
        if (r->thread.joinable()) r->stop_requested = true;
    }
    if (Clock::now() - last_stop_all >= std::chrono::milliseconds(100)) end_search_if_asked();
    // A stopper's state may change without any event (a TimeoutStopper's budget): saved at
    // least every 10 s, Ray's shortest period between automatic experiment state saves.
    if (o.stopper && Clock::now() - last_save >= std::chrono::seconds(10)) save_state();
    // Make the next trials where max_concurrent_trials leaves room (a trial ended).
    bool created = false;
    while (fatal.empty() && !search_stopped && may_create()) {
      try {
        name_trial(*uncreated.front());
      } catch (const UsageError& e) {
        fatal = e.what();  // trials may be running: end the search as a refused result does
        break;
      }
      TrialRecord& r = *trials.emplace_back(std::move(uncreated.front()));
      uncreated.pop_front();
      sched.on_trial_add(ctx, r.trial);
      try {
        make_trial_dir(r);
      } catch (const UsageError& e) {
        fatal = e.what();
        break;
      }
      created = true;
    }
    if (created) save_state();
    concurrency.poll(live_runs(), fatal.empty() && waiting(), counted);
    // Start what fits.
    while (fatal.empty() && !search_stopped && running_count() < concurrency.limit()) {
      Trial* next = sched.choose_trial_to_run(ctx);
      if (next == nullptr) break;
      TrialRecord& r = ctx.record(*next);
      if (r.thread.joinable()) break;  // paused, but its last run has not ended yet
      if (gpu_pool) {
        // Ray's placement group: the trial starts once its GPUs are free.
        auto taken = gpu_pool->acquire(gpu_units);
        if (!taken) break;
        r.gpus = std::move(*taken);
      }
      start_trial(r);
      save_state();
    }
    bool active = false;
    for (auto& r : trials) {
      if (r->thread.joinable()) active = true;
    }
    if (!active) break;
    // Reports first (a trial's last report comes before its run ends), then ended runs.
    bool progressed = false;
    for (auto& r : trials) {
      if (r->thread.joinable() && !r->finished) progressed |= poll_reports(*r);
    }
    for (auto& r : trials) {
      if (r->thread.joinable() && r->finished) {
        finish_run(*r);
        delete_doomed();
        concurrency.want();  // dropped when no trial waits
        progressed = true;
      }
    }
    if (!progressed) {
      std::unique_lock<std::mutex> lock(done_mutex);
      done_cv.wait_for(lock, std::chrono::milliseconds(3));
    }
  }
  delete_doomed();  // every trial has ended: nothing starts from them any more
  save_state();

  if (!fatal.empty()) {
    mlflow.end();
    throw UsageError(fatal);
  }
  mlflow.end();
  std::vector<TrialResult> out;
  for (auto& r : trials) {
    TrialResult t;
    t.id = r->trial.id;
    t.name = r->name;
    t.config = r->trial.config;
    t.status = r->trial.status;
    t.history = r->history;
    t.reports = all_reports(*r);
    t.last_result = r->history.empty() ? Result::object() : r->history.back();
    // Ray's Trial.update_last_result adds the trial's tag to its last result (not to what
    // result.json logged); PBT's exploit changes the tag.
    if (!t.last_result.empty() && !r->trial.experiment_tag.empty())
      t.last_result["experiment_tag"] = r->trial.experiment_tag;
    t.best_result = Result::object();
    double best = 0;
    for (const auto& h : r->history) {
      const Config flat = detail::flatten(h);  // the metric may be nested ("acc/top1")
      if (o.metric.empty() || !flat.contains(o.metric) || !flat.at(o.metric).is_number() ||
          std::isnan(flat.at(o.metric).get<double>()))
        continue;  // a NaN is never the best (as ResultGrid::best_result)
      const double v = flat.at(o.metric).get<double>();
      if (t.best_result.empty() || better(v, best, o.mode)) {
        t.best_result = h;
        best = v;
      }
    }
    t.checkpoint = r->latest_checkpoint;
    for (auto& k : r->keeper.best()) t.best_checkpoints.emplace_back(k.path, k.metrics);
    t.num_failures = r->num_failures;
    t.error = r->trial.status == TrialStatus::Error ? r->error : "";
    t.dir = r->dir;
    out.push_back(std::move(t));
  }
  ResultGrid grid(std::move(out), o.metric, o.mode, exp_dir.string());
  grid.write_csv((exp_dir / "results.csv").string());
  return grid;
}

}  // namespace dtrain::tune
