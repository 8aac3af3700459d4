// A search driver for the restore test: tune_restore_program STORAGE_PATH LOG MODE, MODE "hold"
// (the search tests/tune/ray_restore_peer.py gives Ray, held for the test to SIGKILL it) or
// "resume" (continues it on 1 CPU, then runs the naming search).
//
// The killed search: x in grid [0, 1, 2, 3], FIFO, num_cpus 2 while held (trials 0 and 1 at once),
// 1 when resumed; a trial reports score = 10 x + it for it = 1..4, a checkpoint with it = 1 only.
// Held: trial 1 reports its first result only after trial 0 has reported twice, and both wait
// (60 s at most) after their second result. The stopper: CombinedStopper(Counting,
// MaximumIterationStopper(4), TimeoutStopper(300 s)); Counting counts its calls and appends
// "stopper X IT N" to LOG; every trial's start appends "start X FROM" (FROM: its checkpoint's
// iteration, 0 without one).
// The naming search (resume): x in grid [1, 2], PBT with hyperparam_mutations {"lr": [0.1, 0.2]}
// (not in the space), creators that say whether they saw "lr".
// Prints (resume) one line of JSON: {"grid": [[X, STATUS, ITERATIONS, DONE]] in the grid's order,
// "names": [[INDEX, NAME, DIRNAME, LR]]}.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "dtrain/tune.h"

namespace fs = std::filesystem;
using namespace dtrain::tune;

namespace {

constexpr auto kHold = std::chrono::seconds(60);  // bounded: a driver not killed still ends

void append(const std::string& line) {
  std::ofstream(std::getenv("RESTORE_LOG"), std::ios::app) << line << "\n";
}

int index_of(const std::string& trial_id) {
  return std::stoi(trial_id.substr(trial_id.rfind('_') + 1));
}

void trainable(Config config) {
  const int x = config.at("x").get<int>();
  const char* phase = std::getenv("RESTORE_PHASE");
  const bool hold = phase != nullptr && std::strcmp(phase, "hold") == 0;
  const std::string marker = std::string(std::getenv("RESTORE_LOG")) + ".zero-reported-twice";
  int start = 0;
  if (auto ckpt = get_checkpoint()) std::ifstream(fs::path(*ckpt) / "it") >> start;
  append("start " + std::to_string(x) + " " + std::to_string(start));
  for (int it = start + 1; it <= 4; ++it) {
    if (hold && x == 1 && it == 1) {
      const auto deadline = std::chrono::steady_clock::now() + kHold;
      while (!fs::exists(marker) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (it == 1) {
      const fs::path tmp = fs::path(trial_dir()) / "tmp_ckpt";
      fs::create_directories(tmp);
      std::ofstream(tmp / "it") << it;
      report({{"score", 10 * x + it}}, tmp.string());
    } else {
      report({{"score", 10 * x + it}});
    }
    if (hold && it == 2) {
      if (x == 0) std::ofstream(marker).close();
      std::this_thread::sleep_for(kHold);
    }
  }
}

void lr_trainable(Config config) { report({{"score", config.at("x")}, {"lr", config.at("lr")}}); }

class Counting : public Stopper {
 public:
  bool operator()(const std::string& trial_id, const Result& result) override {
    ++n_;
    append("stopper " + std::to_string(index_of(trial_id)) + " " +
           result.at("training_iteration").dump() + " " + std::to_string(n_));
    return false;
  }
  bool stop_all() override { return false; }

 private:
  int n_ = 0;
};

std::string saw_lr(const Trial& t) {
  return std::to_string(index_of(t.id)) + "_lr=" + (t.config.contains("lr") ? "yes" : "no");
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);
  const std::string mode = argc > 3 ? argv[3] : "";
  if (argc != 4 || (mode != "hold" && mode != "resume")) {
    std::cerr << "usage: tune_restore_program STORAGE_PATH LOG hold|resume\n";
    return 2;
  }
  ::setenv("RESTORE_LOG", argv[2], 1);
  TuneOptions o{.metric = "score",
                .mode = "max",
                .stopper = std::make_shared<CombinedStopper>(
                    std::make_shared<Counting>(), std::make_shared<MaximumIterationStopper>(4),
                    std::make_shared<TimeoutStopper>(std::chrono::seconds(300))),
                .num_cpus = mode == "hold" ? 2 : 1,
                .storage_path = argv[1],
                .name = "killed",
                .resume = mode == "resume",
                .verbose = false};
  o.env["RESTORE_PHASE"] = mode;
  o.env["RESTORE_LOG"] = argv[2];
  const ResultGrid grid = Tuner(trainable, Config{{"x", grid_search({0, 1, 2, 3})}}, o).fit();
  Config out = {{"grid", Config::array()}, {"names", Config::array()}};
  for (const auto& t : grid.trials()) {
    out["grid"].push_back({t.config.at("x"), to_string(t.status),
                           t.last_result.value("training_iteration", Config(nullptr)),
                           t.last_result.value("done", Config(nullptr))});
  }
  const ResultGrid named =
      Tuner(lr_trainable, Config{{"x", grid_search({1, 2})}},
            {.metric = "score",
             .mode = "max",
             .scheduler = std::make_shared<PbtScheduler>(
                 PbtOptions{.perturbation_interval = 1,
                            .hyperparam_mutations = Config{{"lr", Config::array({0.1, 0.2})}}}),
             .num_cpus = 1,
             .storage_path = argv[1],
             .name = "named",
             .trial_dirname_creator = [](const Trial& t) { return "d" + saw_lr(t); },
             .trial_name_creator = [](const Trial& t) { return "n" + saw_lr(t); },
             .verbose = false})
          .fit();
  for (const auto& t : named.trials()) {
    out["names"].push_back(
        {index_of(t.id), t.name, fs::path(t.dir).filename().string(), t.last_result.at("lr")});
  }
  std::cout << out.dump() << std::endl;
  return 0;
}
