// A character-level GPT trained in 3D parallel: data x pipeline x tensor parallel.
//
//   dtrain run --nproc-per-node 8 build/examples/gpt --dp 2 --pp 2 --tp 2
//
// The corpus defaults to the GNU GPL v3 text Debian's base-files package ships
// (/usr/share/common-licenses/GPL-3, 35 KB). Any dp x pp x tp whose product is the world size
// works, and every shape follows the same loss curve (the global batch of each step is the
// same; see gpt.h). Rank 0 prints the loss every --log-every steps and, as its last line, one
// JSON object: world_size, dp, pp, tp, schedule, micro_batches, steps, first_loss,
// final_loss, losses, tokens_per_s (global), seconds, parameters_rank0, corpus, backend.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "../cli_checks.h"
#include "dtrain/collectives.h"
#include "dtrain/error.h"
#include "dtrain/error_message.h"
#include "dtrain/mesh.h"
#include "gpt.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Character-level GPT with data, pipeline and tensor parallelism (run it under `dtrain run`)"};
  gpt::Config cfg;
  int dp = 0, pp = 1, tp = 1, log_every = 5;
  std::string corpus_path = "/usr/share/common-licenses/GPL-3", schedule = "1f1b", backend = "auto";
  app.add_option("--dp", dp, "Data-parallel size (default: world / (pp * tp))")
      ->check(examples::non_negative_whole());
  app.add_option("--pp", pp, "Pipeline stages")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--tp", tp, "Tensor-parallel size")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--schedule", schedule, "gpipe, 1f1b or interleaved_1f1b")->capture_default_str();
  app.add_option("--micro-batches", cfg.micro_batches, "Micro-batches per step")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--virtual-stages", cfg.virtual_stages, "Stages per rank (interleaved_1f1b)")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--steps", cfg.steps, "Optimizer steps")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--batch", cfg.batch, "Global batch (sequences per step)")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--block", cfg.block, "Context length")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--d-model", cfg.d_model, "Model width")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--heads", cfg.n_heads, "Attention heads")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--layers", cfg.n_layers, "Transformer blocks")
      ->capture_default_str()
      ->check(examples::positive_whole());
  app.add_option("--lr", cfg.lr, "Adam learning rate")
      ->capture_default_str()
      ->check(examples::positive());
  app.add_option("--seed", cfg.seed, "Seed of the init and the batches")->capture_default_str();
  app.add_option("--corpus", corpus_path, "A text file")->capture_default_str();
  app.add_option("--log-every", log_every, "Loss line every N steps (rank 0; 0: none)")
      ->capture_default_str()
      ->check(examples::non_negative_whole());
  app.add_option("--backend", backend, "Process group backend: auto, shm or gloo")
      ->capture_default_str();
  if (auto code = examples::parse(app, argc, argv)) return *code;
  try {
    cfg.schedule = dtrain::parse_schedule(schedule);
    auto world = dtrain::init_process_group({.backend = backend});
    const int n = world->world_size();
    if (dp == 0) {
      if (n % (pp * tp) != 0) {
        throw dtrain::UsageError("pp * tp = " + std::to_string(pp * tp) +
                                 " does not divide the world size " + std::to_string(n));
      }
      dp = n / (pp * tp);
    }
    dtrain::DeviceMesh mesh({{"dp", dp}, {"pp", pp}, {"tp", tp}}, world);
    gpt::Corpus corpus = gpt::load_corpus(corpus_path, cfg.block);
    gpt::Result r = gpt::train(cfg, corpus, mesh);
    if (world->rank() == 0) {
      for (size_t s = 0; s < r.losses.size(); ++s) {
        if (log_every > 0 && ((s + 1) % log_every == 0 || s == 0))
          std::printf("step %zu loss %.4f\n", s + 1, r.losses[s]);
      }
      nlohmann::json out{
          {"world_size", n},
          {"dp", dp},
          {"pp", pp},
          {"tp", tp},
          {"schedule", dtrain::schedule_name(cfg.schedule)},
          {"micro_batches", cfg.micro_batches},
          {"steps", cfg.steps},
          {"first_loss", r.losses.front()},
          {"final_loss", r.losses.back()},
          {"losses", r.losses},
          {"tokens_per_s", r.seconds > 0 ? cfg.batch * cfg.block * cfg.steps / r.seconds : 0.0},
          {"seconds", r.seconds},
          {"parameters_rank0", r.parameters_here},
          {"corpus", corpus_path},
          {"backend", world->backend_name()}};
      std::printf("%s\n", out.dump().c_str());
      std::fflush(stdout);
    }
    dtrain::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt: error: %s\n", dtrain::error_message(e).c_str());
    return 1;
  }
}
