// A search driver for the resume test: tune_driver_program STORAGE_PATH [--resume].
// Six 1-process trials of four iterations (0.2 s each), two at a time, a checkpoint per
// iteration. Each run of a trial appends "run <first iteration>" to runs.log in its
// directory, so the test can tell which trials ran twice and where they restarted.
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "dtrain/tune.h"

namespace fs = std::filesystem;
using namespace dtrain::tune;

namespace {

void trainable(Config config) {
  int start = 0;
  if (auto ckpt = get_checkpoint()) std::ifstream(fs::path(*ckpt) / "state") >> start;
  std::ofstream(fs::path(trial_dir()) / "runs.log", std::ios::app) << "run " << start + 1 << "\n";
  for (int it = start + 1; it <= 4; ++it) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const fs::path tmp = fs::path(trial_dir()) / "tmp_ckpt";
    fs::create_directories(tmp);
    std::ofstream(tmp / "state") << it;
    report({{"score", config.at("x").get<double>() * it}}, tmp.string());
  }
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);
  if (argc < 2) {
    std::cerr << "usage: tune_driver_program STORAGE_PATH [--resume]\n";
    return 2;
  }
  const bool resume = argc > 2 && std::strcmp(argv[2], "--resume") == 0;
  Tuner tuner(trainable, Config{{"x", grid_search({1, 2, 3, 4, 5, 6})}},
              {.metric = "score",
               .mode = "max",
               .max_concurrent_trials = 2,
               .storage_path = argv[1],
               .resume = resume});
  ResultGrid grid = tuner.fit();
  std::cout << "done: " << grid.size() << " trials, best x=" << grid.best_result().config.at("x")
            << std::endl;
  return 0;
}
