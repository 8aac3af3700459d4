// How many trials a search runs at once (Tuner::fit), following the engine's free slots.
//
// fit() asks the engine once before the first trial: its free slots / a trial's processes, at
// least 1 (with less room than one trial needs, trials still run one at a time: oversubscribed,
// or waiting in the cluster's queue), at most TuneOptions::max_concurrent_trials when that is
// > 0. An engine that cannot tell (nullopt: mpi, spark without a kept application) runs
// max(1, max_concurrent_trials), and is not asked again. Neither is one whose count running
// jobs do not change (Capacity::net_of_jobs false: local's cores, ssh's host slots, slurm).
//
// On an engine whose count is live (spark's kept application, ray), the driver asks again
// whenever a trial's run ends while trials wait to start (want()), and every
// kWaitingInterval while trials wait with none ending, so the search grows into room that
// appears during it (a Spark worker that registers late, Ray nodes that join) as Ray Tune
// starts a pending trial once its resources are there, not only as a trial ends:
//   1. The query runs on a thread of its own, so a slow engine never holds up the driver loop
//      (Spark's count waits 3 s for its executors to settle; a service that does not answer is
//      given up on within the engine's own timeout). poll() picks the answer up without
//      waiting; no answer (nullopt, or an exception: said with verbose) keeps the count.
//   2. One query at a time. After one that took kSlowQuery or longer, the next starts
//      kSlowQueryInterval after it started, at the earliest; a wanted query waits, it is not
//      dropped (unless no trial waits any more).
//   3. The answer's free slots exclude the slots of the search's own trials that held them
//      when it was asked; a running trial that had not reported in its run by then may not have
//      held them yet (its job still waiting for executors or a placement group), so its
//      processes come off the free count:
//          limit = running + max(0, free - processes * not_yet_counted) / processes
//      at least the count fit() started with (an answer taken just as a run ended may still
//      count that run's slots as taken; the trials never run fewer at once than before), at
//      most max_concurrent_trials (> 0). `running` leaves out runs that ended, even before the
//      driver took their end in: the engine may count their slots as free already. (Between a
//      run's slots coming free and its thread ending there are milliseconds in which an answer
//      can count them twice; the extra trial then waits in the cluster's queue for the next
//      free slots, and the next answer sets the count right. Dropping such answers instead
//      would keep a search of short trials from ever growing.)
// Not thread-safe: everything but the engine's query runs on the driver thread.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <string>

#include "dtrain/distributor_options.h"
#include "engines/engine.h"

namespace dtrain::tune::detail {

class Concurrency {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kSlowQuery{1000};
  static constexpr std::chrono::milliseconds kSlowQueryInterval{5000};
  // While trials wait and none ends: ask again this long after the last question started.
  static constexpr std::chrono::milliseconds kWaitingInterval{10000};

  struct Options {
    DistributorOptions trial;  // a trial's job, as its Distributor gets it
    int processes = 1;         // a trial's processes (trial_resources.processes)
    int max_concurrent = 0;    // TuneOptions::max_concurrent_trials; 0: no limit
    int cpus = 0;              // TuneOptions::num_cpus: local slots instead of the cores; 0: none
    bool verbose = false;      // a line on stderr for the first count and every change
    std::string engine;        // the engine's name, for those lines ("" in local mode)
  };

  // Asks the engine now, on this thread (as the trials' Distributor would: the kept Spark
  // application or Ray driver starts here). Throws what the engine's capacity() throws.
  explicit Concurrency(Options o);
  // Waits for a query in flight (bounded by the engine's own timeout).
  ~Concurrency();
  Concurrency(const Concurrency&) = delete;
  Concurrency& operator=(const Concurrency&) = delete;

  // Trials to run at once now.
  int limit() const { return limit_; }
  // A trial's run ended and trials wait to start: ask the engine again (at once, or once the
  // interval after a slow query has passed). Nothing on an engine that is not asked again.
  void want();
  // Starts a wanted query when it may; applies an answer that came, without waiting.
  // running: the search's runs whose processes are up (not those that ended, even before the
  // driver took their end in); waiting: whether trials wait to start
  // (if not, a wanted query is dropped); counted(t): how many of the running held their slots
  // at t (had reported in their run before t). Wants a query itself every kWaitingInterval
  // while trials wait. Returns whether limit() changed.
  bool poll(int running, bool waiting, const std::function<int(Clock::time_point)>& counted);

 private:
  Options o_;
  int first_ = 1;  // the count fit() started with: the floor
  int limit_ = 1;
  bool live_ = false;    // asked again as trials end (Capacity::net_of_jobs)
  bool wanted_ = false;  // a question is due (a trial ended while others waited, or trials
                         // waited kWaitingInterval); none asked since
  std::future<std::optional<engines::Capacity>> query_;  // valid while one runs
  Clock::time_point asked_at_{};  // when the last question started (fit()'s first one too)
  Clock::time_point next_allowed_{};
};

}  // namespace dtrain::tune::detail
