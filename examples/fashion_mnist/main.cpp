// Data-parallel training on Fashion-MNIST: the seed's MLP (784-512-256-10) or a small CNN
// (2 conv layers with SyncBatchNorm and pooling), Adam (lr 1e-3, cosine-decayed to 0 over the
// run unless --schedule constant), DistributedDataParallel,
// DistributedSampler, checkpoints every epoch (and every N steps if asked), exact resume.
//
//   dtrain run --nproc-per-node 2 build/examples/fashion_mnist --epochs 3
//
// Rank 0 prints progress, the test accuracy after each epoch, and as its last line one JSON
// object: world_size, epochs, steps, samples_per_s (global, training loop only),
// test_accuracy, model, batch_size, lr, seconds, data_seconds (of seconds, rank 0's wait for
// its batches), epoch_seconds (each epoch's), param_digest (FNV-1a of the final parameters'
// bytes: equal digests mean bitwise-equal models).
//
// With MLFLOW_TRACKING_URI set, rank 0 logs an MLflow run (dtrain::mlflow): the parameters
// (world_size, effective_batch_size, ...), per-step loss and samples/s, per-epoch test
// accuracy, and the final model (log_model, and its state dict as mlflow.pytorch logs one). With
// DTRAIN_TIMELINE=FILE every rank records a timeline.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "../cli_checks.h"
#include "data.h"
#include "deepspeed_train.h"
#include "dtrain/dtrain.h"
#include "train_data.h"

namespace {

struct Config {
  int epochs = 3;
  int batch_size = 64;
  double lr = 1e-3;
  std::string model = "mlp";
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string data;       // a table (parquet:DIR, delta:DIR) to train on instead of the IDX files
  std::string test_data;  // a table to evaluate on instead of the IDX test files
  std::string checkpoint_dir;
  bool resume = false;
  int checkpoint_every = 0;  // steps; 0 = at the end of each epoch only
  int64_t max_steps = 0;     // stop after this many optimizer steps in total (0 = no limit)
  int log_every = 100;
  uint64_t seed = 0;
  bool no_eval = false;
  std::string schedule = "cosine";  // learning rate over the run: cosine decay to 0, or constant
  std::string optimizer = "adam";   // adam (torch::optim::Adam) or fused-adam (dtrain::FusedAdam)
  std::string backend = "auto";     // init_process_group's backend
  std::string device = "cpu";       // cpu, cuda (this rank's GPU: LOCAL_RANK's), or auto
  int64_t crash_at_step = 0;        // failure drills: exit(3) after this step on crash_rank
  int crash_rank = 1;
  bool elastic = false;  // ElasticState: resume by itself after a restart, at any world size
};

}  // namespace

torch::nn::Sequential fashion_mnist::make_model(const std::string& kind) {
  using namespace torch::nn;
  if (kind == "wide") {  // ~20M parameters: where ZeRO's memory drop shows
    return Sequential(Flatten(), Linear(784, 4096), ReLU(), Linear(4096, 4096), ReLU(),
                      Linear(4096, 10));
  }
  if (kind == "mlp") {
    return Sequential(Flatten(), Linear(784, 512), ReLU(), Linear(512, 256), ReLU(),
                      Linear(256, 10));
  }
  return Sequential(Conv2d(Conv2dOptions(1, 32, 3).padding(1)), dtrain::SyncBatchNorm(32), ReLU(),
                    MaxPool2d(2), Conv2d(Conv2dOptions(32, 64, 3).padding(1)),
                    dtrain::SyncBatchNorm(64), ReLU(), MaxPool2d(2), Flatten(),
                    Linear(64 * 7 * 7, 128), ReLU(), Linear(128, 10));
}

namespace {

using fashion_mnist::make_model;

// --device: "cuda" is this rank's GPU (dtrain::local_device(): LOCAL_RANK modulo the GPUs),
// "auto" that where one is visible, else the CPU.
torch::Device pick_device(const std::string& name) {
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (name == "cuda" && !dtrain::cuda_available()) {
    throw dtrain::UsageError(
        "--device cuda: no GPU is visible to this process, or this build of dtrain has no CUDA "
        "(its configure step says which); use --device cpu");
  }
  return dtrain::local_device();
}

std::string param_digest(torch::nn::Module& m) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& p : m.parameters()) {
    auto c = p.detach().to(torch::kCPU).contiguous();
    auto bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Test accuracy over the whole test set, each rank evaluating every world_size-th sample.
double evaluate(torch::nn::Sequential& model, const fashion_mnist::Split& test, int rank,
                int world) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto idx = torch::arange(rank, test.labels.size(0), world,
                           torch::TensorOptions(torch::kLong).device(test.labels.device()));
  int64_t correct = 0;
  for (int64_t start = 0; start < idx.size(0); start += 1000) {
    auto b = idx.narrow(0, start, std::min<int64_t>(1000, idx.size(0) - start));
    auto pred = model->forward(test.images.index_select(0, b)).argmax(1);
    correct += pred.eq(test.labels.index_select(0, b)).sum().item<int64_t>();
  }
  model->train();
  auto counts = torch::tensor({correct, idx.size(0)}, torch::kLong);
  dtrain::all_reduce(counts);  // a CPU tensor: every group has a CPU backend
  return static_cast<double>(counts[0].item<int64_t>()) /
         static_cast<double>(counts[1].item<int64_t>());
}

// --optimizer: libtorch's Adam, or dtrain::FusedAdam - the same Adam and state (checkpoints of
// one resume the other), its step one fused pass over each parameter (PyTorch's fused=True).
std::unique_ptr<torch::optim::Adam> make_optimizer(const Config& cfg,
                                                   std::vector<torch::Tensor> params) {
  const auto options = torch::optim::AdamOptions(cfg.lr);
  if (cfg.optimizer == "fused-adam")
    return std::make_unique<dtrain::FusedAdam>(std::move(params), options);
  return std::make_unique<torch::optim::Adam>(std::move(params), options);
}

int train(const Config& cfg, dtrain::mlflow::Run& run) {
  auto pg = dtrain::init_process_group({.backend = cfg.backend});
  const int rank = pg->rank(), world = pg->world_size();
  run = dtrain::mlflow::Run::start({.run_name = "fashion-mnist-" + cfg.model});  // rank 0 only
  run.log_params({{"world_size", std::to_string(world)},
                  {"batch_size", std::to_string(cfg.batch_size)},
                  {"effective_batch_size", std::to_string(cfg.batch_size * world)},
                  {"lr", dtrain::mlflow::param_value(cfg.lr)},  // "0.001", as Python logs it
                  {"epochs", std::to_string(cfg.epochs)},
                  {"model", cfg.model},
                  {"schedule", cfg.schedule},
                  {"optimizer", cfg.optimizer},
                  {"seed", std::to_string(cfg.seed)},
                  {"backend", pg->backend_name()}});
  const torch::Device device = pick_device(cfg.device);
  // On a GPU the IDX set is moved there whole (~220 MB) and batches are gathered there; a
  // table's batches are copied there one by one.
  fashion_mnist::TrainData train_data(cfg.data, cfg.data_dir, cfg.batch_size, cfg.seed, device);
  auto test_set = cfg.test_data.empty() ? fashion_mnist::load_split(cfg.data_dir, false)
                                        : fashion_mnist::load_table_split(cfg.test_data);
  if (!device.is_cpu()) test_set = {test_set.images.to(device), test_set.labels.to(device)};

  torch::manual_seed(cfg.seed);
  auto model = make_model(cfg.model);
  model->to(device);
  // Gradients live in DDP's buckets: no copy back after the all-reduce (PyTorch's option).
  dtrain::DistributedDataParallel ddp(model, {.gradient_as_bucket_view = true});
  auto optimizer_ptr = make_optimizer(cfg, model->parameters());
  torch::optim::Adam& optimizer = *optimizer_ptr;

  dtrain::TrainingState state;
  if (cfg.resume && !cfg.checkpoint_dir.empty()) {
    if (auto latest = dtrain::latest_checkpoint(cfg.checkpoint_dir)) {
      state = dtrain::load_checkpoint(*latest, *model, &optimizer);
      if (rank == 0)
        std::printf("resumed from %s at epoch %lld step %lld\n", latest->c_str(),
                    static_cast<long long>(state.epoch), static_cast<long long>(state.step));
    } else if (rank == 0) {
      std::printf("no checkpoint in %s: starting from scratch\n", cfg.checkpoint_dir.c_str());
    }
  }
  auto save = [&](const dtrain::TrainingState& s) {
    if (cfg.checkpoint_dir.empty()) return;
    std::filesystem::create_directories(cfg.checkpoint_dir);
    dtrain::save_checkpoint(cfg.checkpoint_dir + "/ckpt_" + std::to_string(s.step) + ".pt", *model,
                            &optimizer, s);
  };

  const int64_t steps_per_epoch = train_data.steps_per_epoch();
  dtrain::Progress progress({.epochs = cfg.epochs,
                             .steps_per_epoch = steps_per_epoch,
                             .every_steps = cfg.log_every > 0 ? cfg.log_every : 1 << 30,
                             .out = stdout});
  double train_seconds = 0;
  int64_t samples_seen = 0;  // by this rank, in the timed loop
  double data_seconds = 0;   // of train_seconds, waiting for batches (train_data.batch)
  std::vector<double> epoch_seconds;
  double accuracy = -1;
  bool stop = false;
  for (int64_t epoch = state.epoch; epoch < cfg.epochs && !stop; ++epoch) {
    train_data.set_epoch(epoch);
    int64_t first_batch = epoch == state.epoch ? state.batch_in_epoch : 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t b = first_batch; b < steps_per_epoch; ++b) {
      auto step_start = std::chrono::steady_clock::now();
      torch::Tensor x, y;
      {
        dtrain::timeline::Span span("data");
        std::tie(x, y) = train_data.batch(b);
      }
      data_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
      if (cfg.schedule == "cosine") {
        // Depends on the step alone, so a resumed run follows the same schedule.
        double progress =
            static_cast<double>(state.step) / static_cast<double>(cfg.epochs * steps_per_epoch);
        double lr = cfg.lr * 0.5 * (1 + std::cos(M_PI * std::min(progress, 1.0)));
        for (auto& group : optimizer.param_groups())
          static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
      }
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        dtrain::timeline::Span span("forward", "compute");
        loss = torch::nn::functional::cross_entropy(ddp(x), y);
      }
      {
        dtrain::timeline::Span span("backward", "compute");
        loss.backward();
      }
      {
        dtrain::timeline::Span span("optimizer step", "compute");
        optimizer.step();
      }
      ++state.step;
      samples_seen += x.size(0);
      if (cfg.crash_at_step > 0 && state.step == cfg.crash_at_step && rank == cfg.crash_rank) {
        std::fprintf(
            stderr,
            "fashion_mnist: crashing on purpose on rank %d at step %lld (--crash-at-step)\n", rank,
            static_cast<long long>(state.step));
        std::fflush(stderr);
        std::_Exit(3);
      }
      if (rank == 0) {
        double loss_value = loss.item<double>();
        double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
        progress.step(epoch, b + 1, x.size(0) * world, loss_value);
        run.log_metric("loss", loss_value, state.step);
        run.log_metric("samples_per_s",
                       static_cast<double>(x.size(0) * world) / std::max(secs, 1e-9), state.step);
      }
      bool at_limit = cfg.max_steps > 0 && state.step >= cfg.max_steps;
      bool last_in_epoch = b + 1 == steps_per_epoch;
      if ((cfg.checkpoint_every > 0 && state.step % cfg.checkpoint_every == 0 && !last_in_epoch) ||
          (at_limit && !last_in_epoch)) {
        dtrain::TrainingState s = state;
        s.epoch = epoch;
        s.batch_in_epoch = b + 1;
        s.sampler_epoch = epoch;
        train_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        save(s);
        t0 = std::chrono::steady_clock::now();
      }
      if (at_limit) {
        stop = !last_in_epoch;
        if (stop) break;
      }
    }
    if (device.is_cuda()) torch::cuda::synchronize();  // the clock counts the GPU's work too
    const double epoch_secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    train_seconds += epoch_secs;
    epoch_seconds.push_back(epoch_secs);
    if (stop) break;
    state.epoch = epoch + 1;
    state.batch_in_epoch = 0;
    state.sampler_epoch = epoch + 1;
    if (!cfg.no_eval) {
      accuracy = evaluate(model, test_set, rank, world);
      if (rank == 0) {
        char line[64];
        std::snprintf(line, sizeof line, "epoch %lld test accuracy %.4f",
                      static_cast<long long>(epoch + 1), accuracy);
        progress.message(line);
        run.log_metric("test_accuracy", accuracy, epoch + 1);
      }
    }
    save(state);
    if (cfg.max_steps > 0 && state.step >= cfg.max_steps) break;
  }
  if (accuracy < 0 && !cfg.no_eval) accuracy = evaluate(model, test_set, rank, world);
  progress.finish();
  if (rank == 0) {
    nlohmann::json out{
        {"world_size", world},
        {"epochs", cfg.epochs},
        {"steps", state.step},
        {"samples_per_s", train_seconds > 0 ? samples_seen * world / train_seconds : 0.0},
        {"test_accuracy", accuracy},
        {"model", cfg.model},
        {"batch_size", cfg.batch_size},
        {"lr", cfg.lr},
        {"schedule", cfg.schedule},
        {"optimizer", cfg.optimizer},
        {"seconds", train_seconds},
        {"data_seconds", data_seconds},
        {"epoch_seconds", epoch_seconds},
        {"param_digest", param_digest(*model)},
        {"backend", pg->backend_name()},
        {"device", device.str()}};
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
    if (run.active()) {
      run.log_metrics({{"final_test_accuracy", accuracy}, {"train_seconds", train_seconds}},
                      state.step);
      dtrain::mlflow::log_model(run, *model);  // the unwrapped module, not the DDP wrapper
      // The same weights as mlflow.pytorch.log_state_dict logs them: Python's
      // mlflow.pytorch.load_state_dict(f"runs:/{run_id}/state_dict") loads them into the same
      // architecture written with torch.nn (docs/tracking.md).
      dtrain::mlflow::log_state_dict(run, *model, "state_dict");
      run.end(dtrain::mlflow::RunStatus::Finished);
    }
  }
  dtrain::destroy_process_group();
  return 0;
}

// --elastic: the same training through dtrain::ElasticState (dtrain/elastic_state.h). A job
// restarted by `dtrain run --max-restarts` / `--nnodes MIN:MAX` resumes from the newest commit
// by itself - parameters, Adam state, learning rate, RNG and the position in the epoch - and
// reads each remaining sample of the epoch exactly once even at a new world size. The cosine
// schedule follows the fraction of samples seen, so it does not depend on the world size.
int train_elastic(const Config& cfg) {
  auto pg = dtrain::init_process_group({.backend = cfg.backend});
  const int rank = pg->rank(), world = pg->world_size();
  auto train_set = fashion_mnist::load_split(cfg.data_dir, true);
  auto test_set = fashion_mnist::load_split(cfg.data_dir, false);
  torch::manual_seed(cfg.seed);
  auto model = make_model(cfg.model);
  dtrain::DistributedDataParallel ddp(model, {.gradient_as_bucket_view = true});
  auto optimizer_ptr = make_optimizer(cfg, model->parameters());
  torch::optim::Adam& optimizer = *optimizer_ptr;
  dtrain::ElasticState es(*model, &optimizer, train_set.labels.size(0),
                          {.checkpoint_dir = cfg.checkpoint_dir,
                           .batch_size = cfg.batch_size,
                           .seed = cfg.seed,
                           .commit_every = cfg.checkpoint_every});
  es.restore();
  auto t0 = std::chrono::steady_clock::now();
  const int64_t samples_at_start = es.samples_seen();
  double accuracy = -1;
  for (; es.epoch() < cfg.epochs; es.end_epoch()) {
    while (auto batch = es.next_batch()) {
      if (cfg.schedule == "cosine") {
        double lr = cfg.lr * 0.5 * (1 + std::cos(M_PI * es.progress(cfg.epochs)));
        for (auto& group : optimizer.param_groups())
          static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
      }
      auto idx = torch::tensor(*batch, torch::kLong);
      optimizer.zero_grad();
      auto out = ddp(train_set.images.index_select(0, idx));
      // An epoch's last global batch may leave a rank without samples; it still joins the step.
      auto loss = idx.numel() > 0 ? torch::nn::functional::cross_entropy(
                                        out, train_set.labels.index_select(0, idx))
                                  : out.sum() * 0;
      loss.backward();
      optimizer.step();
      if (cfg.crash_at_step > 0 && es.step() + 1 == cfg.crash_at_step && rank == cfg.crash_rank &&
          dtrain::WorkerEnv::from_environ()->restart_count == 0) {
        std::fprintf(
            stderr,
            "fashion_mnist: crashing on purpose on rank %d at step %lld (--crash-at-step)\n", rank,
            static_cast<long long>(es.step() + 1));
        std::fflush(stderr);
        std::_Exit(3);
      }
      es.step_done();
      if (rank == 0 && cfg.log_every > 0 && es.step() % cfg.log_every == 0) {
        std::printf("epoch %lld step %lld world %d loss %.4f\n",
                    static_cast<long long>(es.epoch() + 1), static_cast<long long>(es.step()),
                    world, loss.item<double>());
        std::fflush(stdout);
      }
      if (cfg.max_steps > 0 && es.step() >= cfg.max_steps) break;
    }
    if (cfg.max_steps > 0 && es.step() >= cfg.max_steps) break;
    if (!cfg.no_eval) {
      accuracy = evaluate(model, test_set, rank, world);
      if (rank == 0)
        std::printf("epoch %lld test accuracy %.4f\n", static_cast<long long>(es.epoch() + 1),
                    accuracy);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (accuracy < 0 && !cfg.no_eval) accuracy = evaluate(model, test_set, rank, world);
  es.finish();
  if (rank == 0) {
    nlohmann::json out{
        {"world_size", world},
        {"epochs", cfg.epochs},
        {"steps", es.step()},
        {"samples_seen", es.samples_seen()},
        {"samples_per_s", seconds > 0 ? (es.samples_seen() - samples_at_start) / seconds : 0.0},
        {"test_accuracy", accuracy},
        {"model", cfg.model},
        {"resumed_from", es.resumed_from()},
        {"param_digest", param_digest(*model)},
        {"backend", pg->backend_name()}};
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  }
  dtrain::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fashion-MNIST data-parallel training with dtrain (run it under `dtrain run`)"};
  Config cfg;
  app.add_option("--epochs", cfg.epochs, "Epochs")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--batch-size,--batch_size", cfg.batch_size, "Batch size per rank")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--lr", cfg.lr, "Adam learning rate")
      ->capture_default_str()
      ->check(examples::positive());
  app.add_option(
         "--model", cfg.model,
         "mlp (784-512-256-10), cnn (2 conv + SyncBatchNorm + pooling) or wide (784-4096-4096-10)")
      ->capture_default_str()
      ->check(CLI::IsMember({"mlp", "cnn", "wide"}));
  // DeepSpeed's flags: `--deepspeed CONFIG`, or `--deepspeed --deepspeed_config CONFIG` (what
  // the DeepSpeedDistributor passes). Batch size, optimizer and precision then come from CONFIG.
  std::string ds_config, ds_config2;
  app.add_option("--deepspeed", ds_config,
                 "Train with the ZeRO engine and this DeepSpeed JSON config")
      ->expected(0, 1);
  app.add_option("--deepspeed_config", ds_config2,
                 "DeepSpeed JSON config (with a bare --deepspeed)");
  app.add_option("--data-dir,--data_dir", cfg.data_dir, "Directory of the *-ubyte.gz files")
      ->capture_default_str();
  app.add_option("--data", cfg.data,
                 "Train on a table instead of the IDX files: parquet:DIR or delta:DIR (columns "
                 "image: 784 pixels 0-255, label), read per rank by dtrain::data");
  app.add_option("--test-data", cfg.test_data,
                 "Evaluate on a table (parquet:DIR or delta:DIR) instead of the IDX test files");
  app.add_option("--checkpoint-dir,--checkpoint_dir", cfg.checkpoint_dir,
                 "Save ckpt_<step>.pt here (rank 0)");
  app.add_flag("--resume", cfg.resume, "Resume from the newest checkpoint in --checkpoint-dir");
  app.add_option("--checkpoint-every", cfg.checkpoint_every, "Also checkpoint every N steps")
      ->capture_default_str()
      ->check(examples::non_negative_whole());
  app.add_option("--max-steps", cfg.max_steps,
                 "Stop after N optimizer steps in total (0: no limit)")
      ->capture_default_str()
      ->check(examples::non_negative_whole());
  app.add_option("--log-every", cfg.log_every, "Progress line every N steps (rank 0)")
      ->capture_default_str()
      ->check(examples::non_negative_whole());
  app.add_option("--seed", cfg.seed, "Seed of the model init and the sampler")
      ->capture_default_str();
  app.add_flag("--no-eval", cfg.no_eval, "Skip test-set evaluation");
  app.add_option("--device", cfg.device,
                 "Where to train: 'cpu', 'cuda' (this rank's GPU, LOCAL_RANK modulo the visible "
                 "GPUs; several ranks may share one) or 'auto' (cuda where a GPU is visible)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--schedule", cfg.schedule,
                 "Learning rate: 'cosine' (from --lr down to 0 over the epochs) or 'constant'")
      ->capture_default_str()
      ->check(CLI::IsMember({"cosine", "constant"}));
  app.add_option("--optimizer", cfg.optimizer,
                 "Adam as 'adam' (libtorch's torch::optim::Adam) or 'fused-adam' "
                 "(dtrain::FusedAdam: the same updates and state, one fused pass per parameter)")
      ->capture_default_str()
      ->check(CLI::IsMember({"adam", "fused-adam"}));
  app.add_option(
         "--backend", cfg.backend,
         "Process group backend: auto (shared memory when all ranks are local), shm or gloo")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "shm", "gloo"}));
  app.add_option("--crash-at-step", cfg.crash_at_step,
                 "Failure drill: exit with code 3 after step N on --crash-rank")
      ->check(examples::non_negative_whole());
  app.add_option("--crash-rank", cfg.crash_rank, "Rank that --crash-at-step crashes")
      ->capture_default_str()
      ->check(examples::non_negative_whole());
  app.add_flag("--elastic", cfg.elastic,
               "Train through dtrain::ElasticState: commits to --checkpoint-dir (every "
               "--checkpoint-every steps and at "
               "epoch ends) and, when restarted, resumes by itself at any world size");
  if (auto code = examples::parse(app, argc, argv)) return *code;
  dtrain::mlflow::Run run;
  try {
    if (app.count("--deepspeed") || !ds_config2.empty()) {
      fashion_mnist::DeepSpeedRun ds_run{.config = ds_config.empty() ? ds_config2 : ds_config,
                                         .epochs = cfg.epochs,
                                         .model = cfg.model,
                                         .data_dir = cfg.data_dir,
                                         .seed = cfg.seed,
                                         .max_steps = cfg.max_steps,
                                         .no_eval = cfg.no_eval,
                                         .log_every = cfg.log_every,
                                         .backend = cfg.backend};
      if (ds_run.config.empty())
        throw dtrain::UsageError(
            "--deepspeed needs a config: --deepspeed CONFIG or --deepspeed_config CONFIG");
      return fashion_mnist::train_deepspeed(ds_run);
    }
    if (!cfg.data.empty() && (cfg.elastic || app.count("--deepspeed") || !ds_config2.empty()))
      throw dtrain::UsageError(
          "--data reads a table in the DDP training loop only (not with "
          "--elastic or --deepspeed)");
    if (cfg.elastic) {
      if (cfg.checkpoint_dir.empty())
        throw dtrain::UsageError("--elastic needs --checkpoint-dir (where it commits)");
      return train_elastic(cfg);
    }
    return train(cfg, run);
  } catch (const std::exception& e) {
    const std::string what = dtrain::error_message(e);
    std::fprintf(stderr, "fashion_mnist: error: %s\n", what.c_str());
    run.set_tag("error", what);
    run.end(dtrain::mlflow::RunStatus::Failed);
    return 1;
  }
}
