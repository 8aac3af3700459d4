// Trains the same model on the same samples under plain DDP and under ZeRO variants (stages
// 0-3, CPU offload), and saves rank 0's per-step losses and final parameters of each, so a
// test compares them.
//   zero_worker --out FILE [--steps 100] [--batch 4] [--float32] [--variants a,b,...]
// The model (20 -> 33 -> 3, 795 parameters) is not divisible by 2 or 4. Rank r of W reads rows
// [s*W*B + r*B, +B) at step s.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <sstream>

#include "dtrain/dtrain.h"

namespace {

using namespace torch::nn;

Sequential make_model(torch::Dtype dtype) {
  torch::manual_seed(1234);
  Sequential m(Linear(20, 33), Tanh(), Linear(33, 3));
  m->to(dtype);
  return m;
}

nlohmann::json variant_config(const std::string& v, int batch) {
  nlohmann::json c = {{"train_micro_batch_size_per_gpu", batch},
                      {"gradient_clipping", 0.0},  // as DDP (DeepSpeed clips at 1.0)
                      {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-2}}}}},
                      {"zero_optimization", {{"stage", 0}, {"reduce_bucket_size", 200}}}};
  auto& z = c["zero_optimization"];
  if (v == "stage0") z["stage"] = 0;
  if (v == "stage1") z["stage"] = 1;
  if (v == "stage2") z["stage"] = 2;
  if (v == "stage3") z["stage"] = 3;
  if (v == "stage1_overlap")
    z["stage"] = 1, z["overlap_comm"] = true;  // reduced to the owners during backward
  if (v == "stage2_overlap")
    z["stage"] = 2, z["overlap_comm"] = true;  // bucket reductions in flight during backward
  // Every Linear fetched on its own around its forward and backward (no unit persists), the
  // next prefetched: stage 3's per-submodule fetch (the plain stage3 keeps these small units
  // gathered for the step, under the default persistence threshold).
  if (v == "stage3_overlap")
    z["stage"] = 3, z["overlap_comm"] = true, z["stage3_param_persistence_threshold"] = 0,
    z["stage3_prefetch_bucket_size"] = 1000;
  if (v == "stage1_offload") z["stage"] = 1, z["offload_optimizer"] = {{"device", "cpu"}};
  if (v == "stage2_offload") z["stage"] = 2, z["offload_optimizer"] = {{"device", "cpu"}};
  if (v == "stage3_offload")
    z["stage"] = 3, z["offload_optimizer"] = {{"device", "cpu"}},
    z["offload_param"] = {{"device", "cpu"}}, z["stage3_param_persistence_threshold"] = 0,
    z["stage3_prefetch_bucket_size"] = 0;  // fetched on demand
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ZeRO parity worker"};
  std::string out, variants =
                       "stage0,stage1,stage2,stage3,stage1_overlap,stage2_overlap,stage3_overlap,"
                       "stage1_offload,stage2_offload,stage3_offload";
  int steps = 100, batch = 4;
  bool float32 = false;
  app.add_option("--out", out)->required();
  app.add_option("--steps", steps);
  app.add_option("--batch", batch);
  app.add_option("--variants", variants);
  app.add_flag("--float32", float32);
  CLI11_PARSE(app, argc, argv);

  auto pg = dtrain::init_process_group();
  const int W = pg->world_size(), r = pg->rank();
  const auto dtype = float32 ? torch::kFloat32 : torch::kFloat64;
  torch::manual_seed(99);
  auto x_all = torch::randn({int64_t(steps) * W * batch, 20}).to(dtype);
  auto y_all = torch::randint(0, 3, {int64_t(steps) * W * batch}, torch::kLong);
  auto rows = [&](int s) { return int64_t(s) * W * batch + int64_t(r) * batch; };
  torch::OrderedDict<std::string, torch::Tensor> result;
  auto record = [&](const std::string& name, Sequential& model, const std::vector<double>& losses) {
    result.insert(name + ".losses", torch::tensor(losses, torch::kFloat64));
    int i = 0;
    for (auto& p : model->parameters())
      result.insert(name + ".param" + std::to_string(i++), p.detach().clone());
  };
  {
    auto model = make_model(dtype);
    dtrain::DistributedDataParallel ddp(model);
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto loss = functional::cross_entropy(ddp(x_all.narrow(0, rows(s), batch)),
                                            y_all.narrow(0, rows(s), batch));
      loss.backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    record("ddp", model, losses);
  }
  std::stringstream list(variants);
  for (std::string v; std::getline(list, v, ',');) {
    auto model = make_model(dtype);
    auto engine = dtrain::zero::initialize(model, variant_config(v, batch));
    std::vector<double> losses;
    int64_t bytes = 0;
    for (int s = 0; s < steps; ++s) {
      auto loss = functional::cross_entropy(engine(x_all.narrow(0, rows(s), batch)),
                                            y_all.narrow(0, rows(s), batch));
      engine.backward(loss);
      engine.step();
      losses.push_back(loss.item<double>());
      bytes = engine.bytes_sent_last_step();
    }
    // Stage 3 holds only a partition between steps: gather for the comparison.
    if (engine.config().zero.stage == 3) engine.core().before_forward();
    record(v, model, losses);
    if (r == 0)
      std::printf("%s: %lld bytes sent per step\n", v.c_str(), static_cast<long long>(bytes));
  }
  if (r == 0) {
    dtrain::zero::save_state_dict(result, out);
    std::printf("saved %zu tensors to %s\n", result.size(), out.c_str());
  }
  return 0;
}
