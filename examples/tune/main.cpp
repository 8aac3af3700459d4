// Hyperparameter search on Fashion-MNIST with dtrain::tune: learning rate x batch size x
// hidden width, every trial a 2-process DDP job. Runs the full grid (FIFO) and the same
// grid under ASHA, and compares the best accuracy each reached and the epochs each spent.
//
//   tune_example [--mode both|grid|asha] [--epochs 9] [--nproc 2] [--train-subset N]
//                [--val-subset N] [--storage /tmp/dtrain-tune-example] [--concurrent 1]
//                [--lrs 3e-3,1e-3,3e-4] [--batch-sizes 64,128,256] [--hiddens 32,64,256]
//                [--grace-period 1] [--reduction-factor 4] [--brackets 1]
//
// Data: the first --train-subset training images (the full 60k makes the 2-core CI machine
// take an hour for the grid) and the first --val-subset test images as the validation set.
// Every config is seeded the same way, so a trial that ASHA lets run trains exactly as its
// grid twin. Last line: one JSON object with the figures.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "../cli_checks.h"
#include "../fashion_mnist/data.h"
#include "dtrain/dtrain.h"
#include "dtrain/tune.h"

namespace tune = dtrain::tune;

namespace {

// Runs on every process of a trial.
void train(tune::Config config) {
  auto pg = dtrain::init_process_group();
  const double lr = config.at("lr").get<double>();
  const int batch_size = config.at("batch_size").get<int>();
  const int hidden = config.at("hidden").get<int>();
  const int epochs = config.at("epochs").get<int>();
  const std::string data_dir = config.at("data_dir").get<std::string>();
  // Only the subsets are decompressed (the first N images of each file).
  auto train_split =
      fashion_mnist::load_split(data_dir, /*train=*/true, config.at("train_subset").get<int64_t>());
  auto val =
      fashion_mnist::load_split(data_dir, /*train=*/false, config.at("val_subset").get<int64_t>());
  const int64_t n_train = train_split.labels.size(0);
  auto x = train_split.images, y = train_split.labels;
  auto vx = val.images, vy = val.labels;

  torch::manual_seed(0);
  using namespace torch::nn;
  Sequential model(Flatten(), Linear(784, hidden), ReLU(), Linear(hidden, hidden), ReLU(),
                   Linear(hidden, 10));
  dtrain::DistributedDataParallel ddp(model);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(lr));
  dtrain::DistributedSampler sampler(n_train, {.shuffle = true, .seed = 0});
  // Batch size is the global one: each of the world_size ranks takes its share.
  const int64_t per_rank = std::max<int64_t>(1, batch_size / pg->world_size());
  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);
    auto indices = torch::tensor(sampler.indices(), torch::kLong);
    model->train();
    for (int64_t b = 0; b < indices.size(0); b += per_rank) {
      auto idx = indices.narrow(0, b, std::min<int64_t>(per_rank, indices.size(0) - b));
      optimizer.zero_grad();
      auto loss = functional::cross_entropy(ddp(x.index_select(0, idx)), y.index_select(0, idx));
      loss.backward();
      optimizer.step();
    }
    model->eval();
    double acc;
    {
      torch::NoGradGuard no_grad;
      acc = model->forward(vx).argmax(1).eq(vy).to(torch::kDouble).mean().item<double>();
    }
    // wall_clock: seconds since the Unix epoch, for the time to the best accuracy.
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    tune::report({{"accuracy", acc},
                  {"wall_clock", now}});  // every rank: all learn ASHA's decision together
  }
}

struct Outcome {
  double best_accuracy = 0;
  tune::Config best_config;
  int epochs = 0;
  double seconds = 0;
  double seconds_to_best = 0;   // from the search's start until the best accuracy was reported
  double start_wall_clock = 0;  // the search's start, seconds since the Unix epoch
};

Outcome search(const std::string& label, std::shared_ptr<tune::TrialScheduler> scheduler,
               const tune::Config& space, int nproc, int concurrent, const std::string& storage) {
  const auto t0 = std::chrono::steady_clock::now();
  const double t0_wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::filesystem::remove_all(std::filesystem::path(storage) / label);
  tune::Tuner tuner(train, space,
                    {.metric = "accuracy",
                     .mode = "max",
                     .scheduler = std::move(scheduler),
                     .max_concurrent_trials = concurrent,
                     .trial_resources = {.processes = nproc},
                     .storage_path = storage,
                     .name = label});
  auto grid = tuner.fit();
  Outcome o;
  o.start_wall_clock = t0_wall;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%s search: %zu trials\n", label.c_str(), grid.size());
  std::printf("  %-12s %-10s %8s %6s %7s %8s %10s\n", "trial", "status", "lr", "batch", "hidden",
              "epochs", "accuracy");
  for (const auto& t : grid.trials()) {
    const double acc = t.best_result.value("accuracy", 0.0);
    std::printf("  %-12s %-10s %8.4g %6d %7d %8zu %10.4f\n", t.id.c_str(),
                tune::to_string(t.status), t.config.at("lr").get<double>(),
                t.config.at("batch_size").get<int>(), t.config.at("hidden").get<int>(),
                t.history.size(), acc);
    o.epochs += static_cast<int>(t.history.size());
    if (acc > o.best_accuracy) {
      o.best_accuracy = acc;
      o.best_config = t.config;
    }
  }
  // The first report that reached the search's best accuracy.
  o.seconds_to_best = o.seconds;
  for (const auto& t : grid.trials()) {
    for (const auto& h : t.history) {
      if (h.value("accuracy", 0.0) >= o.best_accuracy && h.contains("wall_clock")) {
        o.seconds_to_best = std::min(o.seconds_to_best, h.at("wall_clock").get<double>() - t0_wall);
      }
    }
  }
  std::printf("  best accuracy %.4f, %d epochs, %.1f s (best reached after %.1f s)\n",
              o.best_accuracy, o.epochs, o.seconds, o.seconds_to_best);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);  // a trial's worker runs train() here and exits

  CLI::App app{"Fashion-MNIST hyperparameter search with dtrain::tune: the grid vs ASHA"};
  std::string mode = "both", storage = "/tmp/dtrain-tune-example",
              data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 9, nproc = 2, concurrent = 1;
  int64_t train_subset = 6000, val_subset = 5000;
  std::vector<double> lrs{3e-3, 1e-3, 3e-4};
  std::vector<int> batch_sizes{64, 128, 256}, hiddens{32, 64, 256};
  double grace_period = 1, reduction_factor = 4;  // Ray's ASHAScheduler defaults
  int brackets = 1;
  app.add_option("--mode", mode, "both | grid | asha")
      ->capture_default_str()
      ->check(CLI::IsMember({"both", "grid", "asha"}));
  app.add_option("--epochs", epochs, "Epochs per trial (ASHA's max_t)")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--nproc", nproc, "Processes per trial")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--concurrent", concurrent, "Trials at once")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--train-subset", train_subset, "Training images used")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--val-subset", val_subset, "Test images used for validation")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--storage", storage, "storage_path of the searches")->capture_default_str();
  app.add_option("--data-dir", data_dir, "Directory with the gzipped IDX files")
      ->capture_default_str();
  app.add_option("--lrs", lrs, "Learning rates of the grid")
      ->delimiter(',')
      ->capture_default_str()
      ->check(examples::positive());
  app.add_option("--batch-sizes", batch_sizes, "Global batch sizes of the grid")
      ->delimiter(',')
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--hiddens", hiddens, "Hidden widths of the grid")
      ->delimiter(',')
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--grace-period", grace_period, "ASHA's grace_period")->capture_default_str();
  app.add_option("--reduction-factor", reduction_factor, "ASHA's reduction_factor")
      ->capture_default_str();
  app.add_option("--brackets", brackets, "ASHA's brackets")->capture_default_str();
  if (auto code = examples::parse(app, argc, argv)) return *code;

  try {
    fashion_mnist::load_split(data_dir, /*train=*/false, 1);  // fail early on missing data
    auto grid_of = [](const auto& values) {
      std::vector<tune::Config> v(values.begin(), values.end());
      return tune::grid_search(v);
    };
    const tune::Config space{{"lr", grid_of(lrs)},         {"batch_size", grid_of(batch_sizes)},
                             {"hidden", grid_of(hiddens)}, {"epochs", epochs},
                             {"data_dir", data_dir},       {"train_subset", train_subset},
                             {"val_subset", val_subset}};
    nlohmann::json out{{"epochs_per_trial", epochs},
                       {"processes_per_trial", nproc},
                       {"train_subset", train_subset},
                       {"val_subset", val_subset},
                       {"asha",
                        {{"max_t", epochs},
                         {"grace_period", grace_period},
                         {"reduction_factor", reduction_factor},
                         {"brackets", brackets}}}};
    Outcome grid, asha;
    if (mode == "both" || mode == "grid") {
      grid = search("grid", std::make_shared<tune::FifoScheduler>(), space, nproc, concurrent,
                    storage);
      out["grid"] = {{"best_accuracy", grid.best_accuracy},
                     {"epochs", grid.epochs},
                     {"seconds", grid.seconds},
                     {"seconds_to_best", grid.seconds_to_best},
                     {"best_config", grid.best_config},
                     {"start_wall_clock", grid.start_wall_clock}};
    }
    if (mode == "both" || mode == "asha") {
      auto scheduler = std::make_shared<tune::AshaScheduler>(
          tune::AshaOptions{.max_t = static_cast<double>(epochs),
                            .grace_period = grace_period,
                            .reduction_factor = reduction_factor,
                            .brackets = brackets});
      asha = search("asha", scheduler, space, nproc, concurrent, storage);
      out["asha"].update({{"best_accuracy", asha.best_accuracy},
                          {"epochs", asha.epochs},
                          {"seconds", asha.seconds},
                          {"seconds_to_best", asha.seconds_to_best},
                          {"best_config", asha.best_config},
                          {"start_wall_clock", asha.start_wall_clock}});
    }
    if (mode == "both") {
      const double gap = grid.best_accuracy - asha.best_accuracy;
      const double frac = static_cast<double>(asha.epochs) / grid.epochs;
      std::printf(
          "\nASHA vs grid: accuracy gap %.4f (target <= 0.005), epochs %d / %d = %.2f (target <= "
          "0.33)\n",
          gap, asha.epochs, grid.epochs, frac);
      out["accuracy_gap"] = gap;
      out["epoch_fraction"] = frac;
      out["meets_target"] = gap <= 0.005 && frac <= 1.0 / 3.0;
    }
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tune_example: %s\n", dtrain::error_message(e).c_str());
    return 1;
  }
  return 0;
}
