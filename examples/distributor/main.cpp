// The Distributor example: the seed's training function, written as a plain C++ function and
// run on N processes with one call. The workers train with DDP and hand the trained model's
// state dict back; the driver loads it into a fresh model and tests it itself.
//
//   distributor_example [--nproc 2] [--epochs 3] [--lr 1e-3] [--batch-size 64] [--seed 0]
//                       [--data-dir /usr/share/datasets/fashion-mnist]
// Last line: one JSON object with the test accuracy the driver measured.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "../cli_checks.h"
#include "../fashion_mnist/data.h"
#include "dtrain/dtrain.h"

namespace {

torch::nn::Sequential make_model() {
  using namespace torch::nn;
  return Sequential(Flatten(), Linear(784, 512), ReLU(), Linear(512, 256), ReLU(), Linear(256, 10));
}

// Runs in every worker, with RANK, WORLD_SIZE, MASTER_ADDR... set by the launcher.
dtrain::StateDict train(double lr, int epochs, int batch_size, uint64_t seed,
                        std::string data_dir) {
  auto pg = dtrain::init_process_group();
  auto data = fashion_mnist::load_split(data_dir, /*train=*/true);
  torch::manual_seed(static_cast<int64_t>(seed));
  auto model = make_model();
  dtrain::DistributedDataParallel ddp(model);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(lr));
  dtrain::DistributedSampler sampler(data.labels.size(0), {.shuffle = true, .seed = seed});
  const int64_t steps_per_epoch = (sampler.num_samples() + batch_size - 1) / batch_size;
  int64_t step = 0;
  // With MLFLOW_TRACKING_URI set: rank 0's run, nested under the Distributor's driver run.
  auto run = dtrain::mlflow::Run::start({.run_name = "distributor-train"});
  run.log_params({{"world_size", std::to_string(pg->world_size())},
                  {"effective_batch_size", std::to_string(batch_size * pg->world_size())}});
  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);
    auto indices = torch::tensor(sampler.indices(), torch::kLong);
    torch::Tensor loss;
    for (int64_t b = 0; b < steps_per_epoch; ++b, ++step) {
      auto idx = indices.narrow(0, b * batch_size,
                                std::min<int64_t>(batch_size, indices.size(0) - b * batch_size));
      // Cosine decay of the learning rate over the whole run.
      double progress = static_cast<double>(step) / static_cast<double>(epochs * steps_per_epoch);
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::AdamOptions&>(group.options())
            .lr(lr * 0.5 * (1 + std::cos(M_PI * progress)));
      }
      optimizer.zero_grad();
      loss = torch::nn::functional::cross_entropy(ddp(data.images.index_select(0, idx)),
                                                  data.labels.index_select(0, idx));
      loss.backward();
      optimizer.step();
    }
    if (pg->rank() == 0) std::printf("epoch %d loss %.4f\n", epoch + 1, loss.item<double>());
    run.log_metric("loss", loss.item<double>(), epoch + 1);
  }
  return dtrain::state_dict(*model);
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);  // in a worker: runs train() and exits here

  CLI::App app{"Train the Fashion-MNIST MLP on N processes through dtrain::Distributor"};
  int nproc = 2, epochs = 3, batch_size = 64;
  double lr = 1e-3;
  uint64_t seed = 0;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  app.add_option("--nproc", nproc, "Worker processes")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--epochs", epochs, "Epochs")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--lr", lr, "Adam learning rate (cosine-decayed)")
      ->capture_default_str()
      ->check(examples::positive());
  app.add_option("--batch-size", batch_size, "Batch size per process")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--seed", seed, "Seed of the model and the sampler")->capture_default_str();
  app.add_option("--data-dir", data_dir, "Directory with the gzipped IDX files")
      ->capture_default_str();
  if (auto code = examples::parse(app, argc, argv)) return *code;

  try {
    auto test = fashion_mnist::load_split(data_dir, /*train=*/false);  // fail early on bad data
    auto t0 = std::chrono::steady_clock::now();
    dtrain::Distributor distributor({.num_processes = nproc});
    dtrain::StateDict trained = distributor.run(train, lr, epochs, batch_size, seed, data_dir);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    auto model = make_model();
    dtrain::load_state_dict(*model, trained);
    model->eval();
    torch::NoGradGuard no_grad;
    double accuracy = model->forward(test.images)
                          .argmax(1)
                          .eq(test.labels)
                          .to(torch::kDouble)
                          .mean()
                          .item<double>();
    std::printf("driver: test accuracy %.4f of the model trained on %d processes in %.1f s\n",
                accuracy, nproc, seconds);
    std::printf("%s\n", nlohmann::json{{"num_processes", nproc},
                                       {"epochs", epochs},
                                       {"test_accuracy", accuracy},
                                       {"seconds", seconds},
                                       {"tensors_returned", trained.size()}}
                            .dump()
                            .c_str());
  } catch (const dtrain::WorkerError& e) {
    std::fprintf(stderr, "distributor_example: training failed: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributor_example: %s\n", dtrain::error_message(e).c_str());
    return 1;
  }
  return 0;
}
