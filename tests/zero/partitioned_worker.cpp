// Partitioned construction (dtrain/zero_init.h) of a model larger than a rank holds, then a few
// stage-3 training steps; every rank prints its peak RSS over the whole run (VmHWM: libtorch,
// construction, training) next to the model's full fp32 size.
//   dtrain run --nproc-per-node 4 partitioned_worker [--layers 40] [--width 2048] [--steps 3]
// Plain SGD (no state) so that a rank's steady share is its 1/N of the parameters and of the
// gradients; stage 3 fetches one layer at a time (no prefetch, nothing kept for reuse).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>

#include "dtrain/dtrain.h"
#include "dtrain/zero_init.h"

namespace {

int64_t vm_hwm_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ZeRO partitioned construction worker"};
  int layers = 40, steps = 3;
  int64_t width = 2048;
  app.add_option("--layers", layers);
  app.add_option("--width", width);
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);
  auto pg = dtrain::init_process_group();
  const bool trace = std::getenv("PARTITIONED_WORKER_TRACE") && pg->rank() == 0;
  auto phase = [&](const char* what) {
    if (trace)
      std::fprintf(stderr, "%s: VmHWM %lld MiB\n", what, (long long)(vm_hwm_bytes() >> 20));
  };
  phase("start");
  auto model = dtrain::zero::build_partitioned(0, [&](dtrain::zero::Init& init) {
    torch::nn::Sequential m;
    for (int i = 0; i < layers; ++i) m->push_back(init(torch::nn::Linear(width, width)));
    return m;
  });
  phase("built");
  const int64_t params = layers * (width * width + width);
  nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", 4},
                        {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 1e-3}}}}},
                        {"zero_optimization",
                         {{"stage", 3},
                          {"stage3_max_reuse_distance", 0},
                          {"stage3_prefetch_bucket_size", 0},
                          {"stage3_param_persistence_threshold", 0}}}};
  auto e = dtrain::zero::initialize(model, cfg);
  phase("initialized");
  torch::manual_seed(1 + pg->rank());
  auto x = torch::randn({4, width});
  double first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    auto loss = e(x).pow(2).mean();
    (s == 0 ? first : last) = loss.item<double>();
    e.backward(loss);
    e.step();
    phase("step");
  }
  std::printf(
      "{\"rank\":%d,\"params\":%lld,\"full_fp32_bytes\":%lld,\"peak_rss_bytes\":%lld,"
      "\"first_loss\":%.9g,\"last_loss\":%.9g}\n",
      pg->rank(), (long long)params, (long long)(params * 4), (long long)vm_hwm_bytes(), first,
      last);
  std::fflush(stdout);
  return 0;
}
