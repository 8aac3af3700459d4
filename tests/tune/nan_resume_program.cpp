// A search driver for the NaN-across-resume test: tune_nan_resume_program STORAGE_PATH MODE,
// MODE one of "plain" (runs to its end), "hold" (the third trial waits at its second iteration
// for up to 60 s, so the test can kill the driver there), "resume" (continues a killed search).
//
// The search tests/tune/ray_nan_resume_peer.py gives Ray's Tuner: x in grid [1, 2, 3], one trial
// at a time, ASHA(max_t 4, grace_period 1, reduction_factor 2) on "score" (max); a trial reports
// its curve, a checkpoint at every iteration:
//   x = 1: 10, NaN, 1, 1      x = 2: 10, 1, 1, Infinity      x = 3: NaN, 5, 5, 5
// Prints one line of JSON: {"trials": [[index, status, iterations, [scores]]] sorted by index (as
// the peer sorts Ray's), "order": the indices in the result grid's order, "best_last": x,
// "best_all": x}, a non-finite score as the string "nan" / "inf" / "-inf".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <thread>
#include <vector>

#include "dtrain/tune.h"

namespace fs = std::filesystem;
using namespace dtrain::tune;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

void trainable(Config config) {
  const int x = config.at("x").get<int>();
  const double curves[3][4] = {{10, kNaN, 1, 1}, {10, 1, 1, kInf}, {kNaN, 5, 5, 5}};
  int done = 0;
  if (auto ckpt = get_checkpoint()) std::ifstream(fs::path(*ckpt) / "iteration") >> done;
  for (int it = done + 1; it <= 4; ++it) {
    const char* hold = std::getenv("NAN_RESUME_HOLD");
    if (x == 3 && it == 2 && hold != nullptr && std::strcmp(hold, "1") == 0) {
      // The test SIGKILLs the driver now; bounded, so a test that does not still ends.
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    const fs::path tmp = fs::path(trial_dir()) / "tmp_ckpt";
    fs::create_directories(tmp);
    std::ofstream(tmp / "iteration") << it;
    report({{"score", curves[x - 1][it - 1]}}, tmp.string());
  }
}

Config number(const Config& v) {
  if (!v.is_number_float() || std::isfinite(v.get<double>())) return v;
  const double d = v.get<double>();
  return std::isnan(d) ? "nan" : (d > 0 ? "inf" : "-inf");
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);
  const std::string mode = argc > 2 ? argv[2] : "";
  if (argc != 3 || (mode != "plain" && mode != "hold" && mode != "resume")) {
    std::cerr << "usage: tune_nan_resume_program STORAGE_PATH plain|hold|resume\n";
    return 2;
  }
  TuneOptions o{.metric = "score",
                .mode = "max",
                .scheduler = std::make_shared<AshaScheduler>(
                    AshaOptions{.max_t = 4, .grace_period = 1, .reduction_factor = 2}),
                .num_cpus = 1,
                .storage_path = argv[1],
                .resume = mode == "resume",
                .verbose = false};
  if (mode == "hold") o.env["NAN_RESUME_HOLD"] = "1";
  Tuner tuner(trainable, Config{{"x", grid_search({1, 2, 3})}}, o);
  const ResultGrid grid = tuner.fit();
  std::vector<Config> trials;
  Config order = Config::array();
  for (const auto& t : grid.trials()) {
    Config scores = Config::array();
    for (const auto& h : t.history) scores.push_back(number(h.at("score")));
    const int index = std::stoi(t.id.substr(t.id.rfind('_') + 1));
    trials.push_back({index, to_string(t.status), t.history.size(), scores});
    order.push_back(index);
  }
  std::sort(trials.begin(), trials.end(),
            [](const Config& a, const Config& b) { return a.at(0) < b.at(0); });
  std::cout << Config{{"trials", trials},
                      {"order", order},
                      {"best_last", grid.best_result("score", "max", "last").config.at("x")},
                      {"best_all", grid.best_result("score", "max", "all").config.at("x")}}
                   .dump()
            << std::endl;
  return 0;
}
