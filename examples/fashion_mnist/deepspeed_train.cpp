// Fashion-MNIST with dtrain::zero: batch sizes, optimizer, scheduler, precision and ZeRO stage
// all come from the DeepSpeed config. Rank 0 prints progress, the test accuracy per epoch, the
// bytes of model state this rank holds, and a JSON line at the end.
//
//   dtrain run --nproc-per-node 2 build/examples/fashion_mnist --deepspeed
//   examples/fashion_mnist/ds_zero2.json
#include "deepspeed_train.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "data.h"
#include "dtrain/dtrain.h"

namespace fashion_mnist {

int train_deepspeed(const DeepSpeedRun& run) {
  auto pg = dtrain::init_process_group({.backend = run.backend});
  const int rank = pg->rank(), world = pg->world_size();
  auto train_set = load_split(run.data_dir, true);
  auto test_set = load_split(run.data_dir, false);
  torch::manual_seed(run.seed);
  auto model = make_model(run.model);
  auto engine = dtrain::zero::initialize(model, run.config);
  const auto& cfg = engine.config();
  const auto dtype = cfg.fp16.enabled ? torch::kHalf
                     : cfg.bf16       ? torch::kBFloat16
                                      : torch::kFloat32;
  if (cfg.fp16.enabled)
    throw dtrain::UsageError(
        "this example runs on CPU, where libtorch has no float16 matmul; use bf16");
  const int64_t micro = cfg.train_micro_batch_size_per_gpu;
  dtrain::DistributedSampler sampler(train_set.labels.size(0), {.shuffle = true, .seed = run.seed});
  const int64_t micro_per_epoch = sampler.num_samples() / micro;  // whole micro-batches only
  auto evaluate = [&]() {
    torch::NoGradGuard ng;
    model->eval();
    auto idx = torch::arange(rank, test_set.labels.size(0), world, torch::kLong);
    // Every rank runs the same number of forwards (stage 3 gathers parameters in each).
    const int64_t chunk = 1000, n = (test_set.labels.size(0) + world * chunk - 1) / (world * chunk);
    int64_t correct = 0, total = 0;
    for (int64_t c = 0; c < n; ++c) {
      int64_t start = std::min<int64_t>(c * chunk, idx.size(0));
      auto b = idx.narrow(0, start, std::min<int64_t>(chunk, idx.size(0) - start));
      auto pred = engine(test_set.images.index_select(0, b).to(dtype)).argmax(1);
      correct += pred.eq(test_set.labels.index_select(0, b)).sum().item<int64_t>();
      total += b.size(0);
    }
    model->train();
    auto counts = torch::tensor({correct, total}, torch::kLong);
    dtrain::all_reduce(counts);
    return double(counts[0].item<int64_t>()) / double(counts[1].item<int64_t>());
  };
  double accuracy = -1, seconds = 0;
  int64_t samples = 0;
  bool stop = false;
  for (int epoch = 0; epoch < run.epochs && !stop; ++epoch) {
    sampler.set_epoch(epoch);
    auto indices = torch::tensor(sampler.indices(), torch::kLong);
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < micro_per_epoch; ++b) {
      auto idx = indices.narrow(0, b * micro, micro);
      auto loss = torch::nn::functional::cross_entropy(
          engine(train_set.images.index_select(0, idx).to(dtype)).to(torch::kFloat32),
          train_set.labels.index_select(0, idx));
      engine.backward(loss);
      const bool boundary = engine.is_gradient_accumulation_boundary();  // this step() updates
      engine.step();
      samples += micro;
      if (rank == 0 && run.log_every > 0 && boundary &&
          engine.global_steps() % run.log_every == 0) {
        std::printf("epoch %d step %lld loss %.4f lr %.3g\n", epoch + 1,
                    static_cast<long long>(engine.global_steps()), loss.item<double>(),
                    engine.get_lr());
        std::fflush(stdout);
      }
      if (run.max_steps > 0 && engine.global_steps() >= run.max_steps) {
        stop = true;
        break;
      }
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!run.no_eval) {
      accuracy = evaluate();
      if (rank == 0) std::printf("epoch %d test accuracy %.4f\n", epoch + 1, accuracy);
    }
  }
  auto mem = engine.memory();
  if (rank == 0) {
    auto mib = [](int64_t b) { return b / 1048576.0; };
    nlohmann::json out{
        {"world_size", world},
        {"zero_stage", cfg.zero.stage},
        {"precision", cfg.fp16.enabled ? "fp16"
                      : cfg.bf16       ? "bf16"
                                       : "fp32"},
        {"model", run.model},
        {"parameters", engine.core().num_parameters()},
        {"steps", engine.global_steps()},
        {"skipped_steps", engine.skipped_steps()},
        {"test_accuracy", accuracy},
        {"samples_per_s", seconds > 0 ? samples * world / seconds : 0.0},
        {"rank0_mib",
         {{"params", mib(mem.params())},
          {"grads", mib(mem.grads())},
          {"optimizer", mib(mem.optimizer())},
          {"offloaded_to_cpu", mib(mem.params_cpu + mem.grads_cpu + mem.optimizer_cpu)}}}};
    std::printf("%s\n", out.dump().c_str());
  }
  dtrain::destroy_process_group();
  return 0;
}

}  // namespace fashion_mnist
