// dtrain::tune's overhead per trial: a search of trivial trials (one report each, no work),
// so its wall time is all scheduling: starting each trial's Distributor job (launcher +
// worker processes), the report round trip, and the driver's bookkeeping.
//
//   tune_overhead_bench [TRIALS=12] [CONCURRENT=2] [PROCESSES=1]
// Prints one JSON line: trials, seconds, seconds_per_trial, and the same for bare
// Distributor runs of a trivial function (what a trial costs without dtrain::tune).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "dtrain/tune.h"

namespace tune = dtrain::tune;

namespace {

void trivial(tune::Config config) { tune::report({{"score", config.at("i").get<double>()}}); }
int nothing(int x) { return x; }

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);
  const int trials = argc > 1 ? std::atoi(argv[1]) : 12;
  const int concurrent = argc > 2 ? std::atoi(argv[2]) : 2;
  const int processes = argc > 3 ? std::atoi(argv[3]) : 1;
  const auto storage =
      std::filesystem::temp_directory_path() / ("dtrain-tune-bench-" + std::to_string(::getpid()));
  std::vector<tune::Config> values;
  for (int i = 0; i < trials; ++i) values.emplace_back(i);

  auto t0 = std::chrono::steady_clock::now();
  tune::Tuner tuner(trivial, tune::Config{{"i", tune::grid_search(values)}},
                    {.metric = "score",
                     .mode = "max",
                     .max_concurrent_trials = concurrent,
                     .trial_resources = {.processes = processes},
                     .storage_path = storage.string(),
                     .verbose = false});
  auto grid = tuner.fit();
  const double tune_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::filesystem::remove_all(storage);

  // The same number of bare Distributor jobs, one at a time.
  t0 = std::chrono::steady_clock::now();
  const int bare_runs = std::max(1, trials / 2);
  for (int i = 0; i < bare_runs; ++i) {
    dtrain::Distributor d({.num_processes = processes});
    (void)d.run(nothing, i);
  }
  const double bare_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s\n",
              nlohmann::json{{"trials", trials},
                             {"concurrent", concurrent},
                             {"processes", processes},
                             {"terminated", static_cast<int>(grid.size()) - grid.num_errors()},
                             {"seconds", tune_s},
                             {"seconds_per_trial", tune_s / trials},
                             {"bare_distributor_runs", bare_runs},
                             {"bare_distributor_seconds_per_run", bare_s / bare_runs}}
                  .dump()
                  .c_str());
  return 0;
}
