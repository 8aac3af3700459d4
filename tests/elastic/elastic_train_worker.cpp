// A data-parallel training worker for the resume tests (tests/elastic/resume_test.cpp): DDP
// over a small MLP with dropout (so the RNG state matters), Adam (optimizer state) and a
// cosine learning rate driven by ElasticState::progress(), on a synthetic dataset; the whole
// loop is ElasticState's. Per rank it writes
// LOG_DIR/attempt<TORCHELASTIC_RESTART_COUNT>_rank<RANK>.log:
//   pid P            this process
//   started_at T     unix time main() began; init_done T: the process group is up
//   resume S W       the step it starts from (0 on a fresh start) and the world size
//   step S E i j ... the samples this rank trained on in step S of epoch E (written before
//                    the step's collectives, so a step that never completed is logged too)
//   loss S L         (rank 0) the global mean loss of step S, 9 significant digits
//   first_step S T   (rank 0) the attempt's first step done, at unix time T (for the bench)
// --kill-at-step S --kill-rank R: on the first attempt, rank R SIGKILLs itself right after
// step S's optimizer step (mid-epoch, before any commit of step S).
// --zero STAGE: the ZeRO engine (dtrain/zero.h, Adam) in place of DDP + torch::optim::Adam,
// committed by ElasticState with its partitioned state; no dropout and a constant LR, and
// --batch is then the GLOBAL batch (each rank takes batch / world): the same global batches
// at any world size, so a run resumed at another world size can match an uninterrupted one.
// --params-out F: rank 0 writes the final parameters ("name v1 v2 ...", 9 significant digits).
// --double: data and model in float64 (the soak compares a long chaotic run with an
// uninterrupted one: float32 sums in another order at another world size drift further).
// --resume-always: ResumePolicy::kAlways (a job started again by hand, at any world size);
// --memory-dir D: where in-memory commits go (so such a job finds them).
#include <signal.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>

#include "dtrain/dtrain.h"
#include "dtrain/elastic_state.h"
#include "dtrain/zero.h"

namespace {
double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
void write_params(const std::string& path, const c10::IValue& model_state) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw dtrain::Error("cannot write " + path);
  for (const auto& e : model_state.toGenericDict().at("module").toGenericDict()) {
    auto t = e.value().toTensor().to(torch::kDouble).contiguous().reshape({-1});
    std::fprintf(f, "%s", e.key().toStringRef().c_str());
    for (int64_t i = 0; i < t.numel(); ++i) std::fprintf(f, " %.9g", t[i].item<double>());
    std::fprintf(f, "\n");
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  const double started_at = unix_now();  // main() entered (libtorch is loaded by then)
  CLI::App app{"elastic resume test worker"};
  int64_t size = 240, batch = 8, epochs = 2, commit_every = 3, kill_at_step = 0;
  int kill_rank = 1, zero_stage = -1;
  bool resume_always = false, use_double = false;
  std::string params_out, memory_dir;
  double step_sleep = 0;
  bool in_memory = false;
  std::string log_dir, ckpt_dir;
  app.add_option("--size", size);
  app.add_option("--batch", batch);
  app.add_option("--epochs", epochs);
  app.add_option("--commit-every", commit_every);
  app.add_option("--kill-at-step", kill_at_step);
  app.add_option("--kill-rank", kill_rank);
  app.add_option("--step-sleep", step_sleep);
  app.add_flag("--in-memory", in_memory);
  app.add_option("--zero", zero_stage);
  app.add_option("--params-out", params_out);
  app.add_flag("--resume-always", resume_always);
  app.add_flag("--double", use_double);
  app.add_option("--memory-dir", memory_dir);
  app.add_option("--log-dir", log_dir)->required();
  app.add_option("--checkpoint-dir", ckpt_dir);
  CLI11_PARSE(app, argc, argv);
  try {
    auto pg = dtrain::init_process_group();
    const int rank = pg->rank(), world = pg->world_size();
    const int restart = dtrain::WorkerEnv::from_environ()->restart_count;
    std::string log_path =
        log_dir + "/attempt" + std::to_string(restart) + "_rank" + std::to_string(rank) + ".log";
    FILE* log = std::fopen(log_path.c_str(), "w");
    if (!log) throw dtrain::Error("cannot write " + log_path);
    std::fprintf(log, "pid %d\nstarted_at %.6f\ninit_done %.6f\n", static_cast<int>(::getpid()),
                 started_at, unix_now());
    std::fflush(log);

    torch::manual_seed(7);
    if (use_double && zero_stage < 0) throw dtrain::Error("--double needs --zero STAGE");
    const auto dtype = use_double ? torch::kFloat64 : torch::kFloat32;
    auto x_all = torch::randn({size, 16}).to(dtype);
    auto teacher = torch::randn({16, 4}).to(dtype);
    auto y_all = x_all.matmul(teacher).argmax(1);
    const bool zero = zero_stage >= 0;
    dtrain::ElasticStateOptions eo{.checkpoint_dir = ckpt_dir,
                                   .batch_size = batch,
                                   .seed = 3,
                                   .commit_every = commit_every,
                                   .in_memory = in_memory};
    if (resume_always) eo.resume = dtrain::ResumePolicy::kAlways;
    if (!memory_dir.empty()) eo.memory_dir = memory_dir;
    if (zero) {
      if (batch % world != 0)
        throw dtrain::Error("--zero: --batch (global) must divide by the world size");
      eo.batch_size = batch / world;
      torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                                  torch::nn::Linear(32, 4));
      model->to(dtype);
      auto engine = dtrain::zero::initialize(
          model, nlohmann::json{{"train_micro_batch_size_per_gpu", batch / world},
                                {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-2}}}}},
                                {"zero_optimization", {{"stage", zero_stage}}}});
      dtrain::ElasticState es(engine, size, eo);
      es.restore();
      std::fprintf(log, "resume %lld %d\n", static_cast<long long>(es.step()), world);
      std::fflush(log);
      bool first_step_logged = false;
      for (; es.epoch() < epochs; es.end_epoch()) {
        while (auto batch_idx = es.next_batch()) {
          const int64_t step = es.step() + 1;
          std::string line = "step " + std::to_string(step) + " " + std::to_string(es.epoch());
          for (int64_t i : *batch_idx) line += " " + std::to_string(i);
          std::fprintf(log, "%s\n", line.c_str());
          std::fflush(log);
          auto idx = torch::tensor(*batch_idx, torch::kLong);
          // The local mean; the engine averages the gradients over the ranks: the global mean.
          auto loss = torch::nn::functional::cross_entropy(engine(x_all.index_select(0, idx)),
                                                           y_all.index_select(0, idx));
          engine.backward(loss);
          engine.step();
          if (kill_at_step > 0 && restart == 0 && rank == kill_rank && step == kill_at_step) {
            std::fprintf(log, "killing myself at %.6f\n", unix_now());
            std::fflush(log);
            ::kill(::getpid(), SIGKILL);
          }
          auto global_loss = loss.detach().reshape({1}).to(torch::kDouble);
          dtrain::all_reduce(global_loss);
          if (rank == 0) {
            const double mean = global_loss.item<double>() / world;
            std::fprintf(log, "loss %lld %.9g\n", static_cast<long long>(step), mean);
            std::fflush(log);
            std::printf("step %lld loss %.6f world %d\n", static_cast<long long>(step), mean,
                        world);
            std::fflush(stdout);
          }
          es.step_done();
          if (rank == 0 && !first_step_logged) {
            std::fprintf(log, "first_step %lld %.6f\n", static_cast<long long>(step), unix_now());
            std::fflush(log);
            first_step_logged = true;
          }
          if (step_sleep > 0)
            std::this_thread::sleep_for(std::chrono::duration<double>(step_sleep));
        }
      }
      es.finish();
      auto state = engine.core().model_state(rank == 0);  // collective at stage 3
      if (rank == 0 && !params_out.empty()) write_params(params_out, state);
      if (rank == 0)
        std::printf("done at step %lld, %lld samples\n", static_cast<long long>(es.step()),
                    static_cast<long long>(es.samples_seen()));
      std::fclose(log);
      dtrain::destroy_process_group();
      return 0;
    }
    torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                                torch::nn::Dropout(0.2), torch::nn::Linear(32, 4));
    dtrain::DistributedDataParallel ddp(model);
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.01));
    dtrain::ElasticState es(*model, &optimizer, size, eo);
    es.restore();
    bool first_step_logged = false;
    std::fprintf(log, "resume %lld %d\n", static_cast<long long>(es.step()), world);
    std::fflush(log);
    for (; es.epoch() < epochs; es.end_epoch()) {
      while (auto batch_idx = es.next_batch()) {
        const int64_t step = es.step() + 1;
        std::string line = "step " + std::to_string(step) + " " + std::to_string(es.epoch());
        for (int64_t i : *batch_idx) line += " " + std::to_string(i);
        std::fprintf(log, "%s\n", line.c_str());
        std::fflush(log);
        const double lr = 0.01 * 0.5 * (1 + std::cos(M_PI * es.progress(epochs)));
        for (auto& g : optimizer.param_groups())
          static_cast<torch::optim::AdamOptions&>(g.options()).lr(lr);
        auto idx = torch::tensor(*batch_idx, torch::kLong);
        optimizer.zero_grad();
        auto out = ddp(x_all.index_select(0, idx));
        // Summed here, divided by the global batch below: the mean over the global batch,
        // whatever the split (an empty batch still joins the gradient all-reduce).
        auto loss_sum = torch::nn::functional::cross_entropy(
            out, y_all.index_select(0, idx),
            torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
        auto count = torch::tensor({static_cast<double>(batch_idx->size())}, torch::kDouble);
        dtrain::all_reduce(count);
        auto loss = loss_sum * (static_cast<double>(world) / count.item<double>());
        loss.backward();
        optimizer.step();
        if (kill_at_step > 0 && restart == 0 && rank == kill_rank && step == kill_at_step) {
          std::fprintf(log, "killing myself at %.6f\n", unix_now());
          std::fflush(log);
          ::kill(::getpid(), SIGKILL);
        }
        auto global_loss = loss_sum.detach().reshape({1}).to(torch::kDouble);
        dtrain::all_reduce(global_loss);
        if (rank == 0) {
          const double mean = global_loss.item<double>() / count.item<double>();
          std::fprintf(log, "loss %lld %.9g\n", static_cast<long long>(step), mean);
          std::fflush(log);
          std::printf("step %lld loss %.6f world %d\n", static_cast<long long>(step), mean, world);
          std::fflush(stdout);
        }
        es.step_done();
        if (rank == 0 && !first_step_logged) {
          std::fprintf(log, "first_step %lld %.6f\n", static_cast<long long>(step), unix_now());
          std::fflush(log);
          first_step_logged = true;
        }
        if (step_sleep > 0) std::this_thread::sleep_for(std::chrono::duration<double>(step_sleep));
      }
    }
    es.finish();
    if (rank == 0)
      std::printf("done at step %lld, %lld samples\n", static_cast<long long>(es.step()),
                  static_cast<long long>(es.samples_seen()));
    std::fclose(log);
    dtrain::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic_train_worker: error: %s\n", e.what());
    return 1;
  }
}
