// The ZeRO engine's rules, with ranks as threads (tests/support/thread_group.h): the loss scaler,
// CPU Adam, fp16 overflow handling, clipping, accumulation, memory, bytes sent, checkpoints
// (layout, bitwise resume, another world size, to-fp32), Lamb and SGD.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/version.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <tuple>

#include "dtrain/checkpoint.h"
#include "dtrain/ddp.h"
#include "dtrain/zero.h"
#include "launcher/subprocess.h"
#include "support/paths.h"
#include "support/thread_group.h"

namespace {

namespace fs = std::filesystem;
using dtrain::ProcessGroup;
using dtrain::test::run_ranks;
using nlohmann::json;
using namespace torch::nn;
using Params = std::vector<torch::Tensor>;

// The same initial parameters in every run (ranks are threads: one seeds at a time).
Sequential make_model(torch::Dtype dt = torch::kFloat64) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  torch::manual_seed(1234);
  Sequential m(Linear(20, 33), Tanh(), Linear(33, 3));
  m->to(dt);
  return m;
}

struct Data {
  torch::Tensor x, y;
};
Data make_data(int64_t rows, torch::Dtype dt = torch::kFloat64) {
  torch::manual_seed(7);
  auto x = torch::randn({rows, 20}).to(dt);
  return {x, torch::randint(0, 3, {rows}, torch::kLong)};
}

json config(int stage, int micro, int gas = 1, json extra = json::object()) {
  json c = {{"train_micro_batch_size_per_gpu", micro},
            {"gradient_clipping", 0.0},  // DeepSpeed clips at 1.0 by default
            {"gradient_accumulation_steps", gas},
            {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-2}}}}},
            {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 300}}}};
  c.merge_patch(extra);
  return c;
}

// Steps [first, first + steps): rank r's micro-batch j of step s reads rows
// s*G + r*gas*micro + j*micro, G = world*gas*micro: the same rows for any split of G.
template <class E>
std::vector<double> train(E& e, const Data& d, int rank, int world, int micro, int gas, int first,
                          int steps) {
  std::vector<double> losses;
  const int64_t G = int64_t(world) * gas * micro;
  for (int s = first; s < first + steps; ++s) {
    for (int j = 0; j < gas; ++j) {
      int64_t row = s * G + int64_t(rank) * gas * micro + int64_t(j) * micro;
      auto loss =
          functional::cross_entropy(e(d.x.narrow(0, row, micro)), d.y.narrow(0, row, micro));
      e.backward(loss);
      e.step();
      losses.push_back(loss.template item<double>());
    }
  }
  return losses;
}

template <class E>
Params params_of(E& e) {
  if (e.config().zero.stage == 3) e.core().before_forward();  // gathers (a collective)
  Params out;
  for (auto& p : e.module()->parameters()) out.push_back(p.detach().clone());
  return out;
}

double max_rel(const Params& a, const Params& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    auto bd = b[i].to(torch::kFloat64);
    double diff = (a[i].to(torch::kFloat64) - bd).abs().max().item<double>();
    worst = std::max(worst, diff / std::max(bd.abs().max().item<double>(), 1e-12));
  }
  return worst;
}

// Trains a fresh model on `world` thread-ranks and returns rank 0's final parameters.
Params run_zero(int world, const json& cfg, const Data& d, int micro, int gas, int steps) {
  Params result;
  std::mutex mu;
  run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
    auto e = dtrain::zero::initialize(make_model(d.x.scalar_type()), cfg, {pg});
    train(e, d, pg->rank(), world, micro, gas, 0, steps);
    auto p = params_of(e);
    std::lock_guard<std::mutex> lock(mu);
    if (pg->rank() == 0) result = p;
  });
  return result;
}

// The schedulers are compared with DeepSpeed's own classes in deepspeed_reference_test.cpp.

TEST(ZeroLossScaler, FollowsDeepSpeedsDynamicRules) {
  dtrain::zero::Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = 4;
  c.hysteresis = 2;
  c.loss_scale_window = 3;
  c.min_loss_scale = 4;
  dtrain::zero::LossScaler s(c);
  EXPECT_EQ(s.scale(), 16);
  s.update(true);  // hysteresis absorbs the first overflow
  EXPECT_EQ(s.scale(), 16);
  s.update(true);
  EXPECT_EQ(s.scale(), 8);
  s.update(false);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 8);  // DeepSpeed doubles after window + 1 clean steps, not window
  s.update(false);
  EXPECT_EQ(s.scale(), 16);
  s.update(true);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 4);  // not below min_loss_scale
  // At min_loss_scale with the hysteresis used up, an overflow ends the run (DeepSpeed raises).
  try {
    s.update(true);
    ADD_FAILURE() << "no error";
  } catch (const dtrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("min_loss_scale (4)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.scale(), 4);
  s.update(false);  // the state is unchanged by the refusal: training could go on
  EXPECT_EQ(s.scale(), 4);
  // Every other trajectory: deepspeed_reference_test runs DeepSpeed's own DynamicLossScaler.
  c.loss_scale = 128;  // static
  dtrain::zero::LossScaler fixed(c);
  fixed.update(true);
  EXPECT_EQ(fixed.scale(), 128);
}

TEST(ZeroCpuAdam, MatchesTorchOptimAdamAndAdamW) {
  for (bool adamw : {false, true}) {
    torch::manual_seed(3);
    const int64_t n = 1 << 20;
    auto w = torch::randn({n});
    auto ref = w.clone().requires_grad_(true);
    auto m = torch::zeros({n}), v = torch::zeros({n});
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (adamw)
      opt = std::make_unique<torch::optim::AdamW>(
          std::vector<torch::Tensor>{ref}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
    else
      opt = std::make_unique<torch::optim::Adam>(
          std::vector<torch::Tensor>{ref}, torch::optim::AdamOptions(1e-3).weight_decay(0.01));
    for (int step = 1; step <= 3; ++step) {
      auto g = torch::randn({n});
      ref.mutable_grad() = g.clone();
      opt->step();
      dtrain::zero::cpu_adam_step(w.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                                  v.data_ptr<float>(), n, step, 1e-3, 0.9, 0.999, 1e-8, 0.01,
                                  adamw);
    }
    double rel =
        (w - ref.detach()).abs().max().item<double>() / ref.detach().abs().max().item<double>();
    EXPECT_LE(rel, 1e-6) << (adamw ? "AdamW" : "Adam");
  }
}

// A Linear whose 16-bit weights are used in float32 (CPU matmuls have no float16 kernel in
// libtorch 1.13); the gradient flows back into the 16-bit parameters.
struct HalfLinearImpl : Module {
  Linear inner{nullptr};
  HalfLinearImpl(int in, int out) { inner = register_module("inner", Linear(in, out)); }
  torch::Tensor forward(const torch::Tensor& x) {
    return functional::linear(x.to(torch::kFloat32), inner->weight.to(torch::kFloat32),
                              inner->bias.to(torch::kFloat32));
  }
};
TORCH_MODULE(HalfLinear);

// fp16 over 4 ranks at stages 1-3: each rank's gradient (30000) fits fp16 but their sum
// (120000) would not. DeepSpeed's ZeRO optimizers divide by the world size in the communication
// dtype before reducing, so the mean is reduced and the step is taken, not skipped as an
// overflow.
TEST(ZeroFp16, GradientsWhoseSumWouldOverflowAreAveragedBeforeTheReduction) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    json cfg = {{"train_micro_batch_size_per_gpu", 1},
                {"gradient_clipping", 0.0},
                {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 1e-5}}}}},
                {"fp16", {{"enabled", true}, {"loss_scale", 1}}},
                {"zero_optimization", {{"stage", stage}}}};
    run_ranks(4, [&](std::shared_ptr<ProcessGroup> pg) {
      HalfLinear m(1, 1);
      {
        torch::NoGradGuard ng;
        m->inner->weight.fill_(1);
        m->inner->bias.fill_(0);
      }
      auto e = dtrain::zero::initialize(m, cfg, {pg});
      auto loss = e(torch::full({1, 1}, 30000.0)).sum();  // d loss / d weight = 30000
      e.backward(loss);
      e.step();
      EXPECT_EQ(e.skipped_steps(), 0) << "the mean fits fp16; only the sum would overflow";
      auto w = params_of(e)[0];
      EXPECT_NEAR(w.to(torch::kFloat64).item<double>(), 1 - 1e-5 * 30000, 1e-3);
    });
  }
}

// get_global_grad_norm() under fp16, where DeepSpeed 0.19.8's optimizers each divide the loss
// scale out their own way (its CPU engine refuses fp16, so this is its code read, not run): one
// rank, the same model and steps at every stage, a scale of 2^8 that doubles at the second clean
// step. After the first: stages 1-3 and stage 0 with FusedAdam (FP16_Optimizer) give the norm
// n, stage 0 with SGD (FP16_UnfusedOptimizer: the scaled norm) 256 n. After the second, where
// the scale doubles, stage 3 (divided by the scale after its update) gives half of stage 2's
// (the scale before it). None before the first step, inf after an overflow, and
// was_step_applied() false then.
TEST(ZeroFp16, GlobalGradNormDividesTheScaleOutAsDeepSpeedsOptimizers) {
  auto d = make_data(8, torch::kFloat32);
  // The norms after each of `steps` steps and the scales around each.
  struct Run {
    std::vector<std::optional<double>> norms;
    std::vector<double> scales;
    bool applied = true, none_before = false;
  };
  auto run = [&](int stage, const char* optimizer, int steps, bool overflow) {
    json cfg = {{"train_micro_batch_size_per_gpu", 4},
                {"gradient_clipping", 0.0},
                {"optimizer", {{"type", optimizer}, {"params", {{"lr", 1e-2}}}}},
                {"fp16", {{"enabled", true}, {"initial_scale_power", 8}, {"loss_scale_window", 1}}},
                {"zero_optimization", {{"stage", stage}}}};
    Run out;
    run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
      torch::manual_seed(3);
      auto e = dtrain::zero::initialize(HalfLinear(20, 3), cfg, {pg});
      out.none_before = !e.get_global_grad_norm().has_value();
      for (int k = 0; k < steps; ++k) {
        if (overflow) e.core().inject_overflow();
        out.scales.push_back(e.loss_scale());
        e.backward(functional::cross_entropy(e(d.x.narrow(0, 4 * k, 4)), d.y.narrow(0, 4 * k, 4)));
        e.step();
        out.norms.push_back(e.get_global_grad_norm());
        out.applied = e.was_step_applied();
      }
      out.scales.push_back(e.loss_scale());
    });
    EXPECT_TRUE(out.none_before);
    EXPECT_EQ(out.applied, !overflow);
    return out;
  };
  const auto stage2 = run(2, "Adam", 2, false);
  const double n = stage2.norms[0].value();
  EXPECT_GT(n, 0);
  EXPECT_DOUBLE_EQ(run(1, "Adam", 1, false).norms[0].value(), n);
  EXPECT_NEAR(run(0, "Adam", 1, false).norms[0].value(), n, 1e-6 * n);
  EXPECT_NEAR(run(0, "SGD", 1, false).norms[0].value(), n * 256, 1e-6 * n * 256);
  const auto stage3 = run(3, "Adam", 2, false);
  EXPECT_NEAR(stage3.norms[0].value(), n, 1e-6 * n);
  ASSERT_EQ(stage2.scales, (std::vector<double>{256, 256, 512}));  // doubled at the second
  ASSERT_EQ(stage3.scales, stage2.scales);
  const double n2 = stage2.norms[1].value();
  EXPECT_NEAR(stage3.norms[1].value(), n2 / 2, 1e-6 * n2);
  for (int stage : {0, 2, 3}) EXPECT_TRUE(std::isinf(run(stage, "Adam", 1, true).norms[0].value()));
}

TEST(ZeroFp16, OverflowSkipsTheStepAndTheSchedulerAndLowersTheScale) {
  auto d = make_data(64, torch::kFloat32);
  json cfg = {{"train_micro_batch_size_per_gpu", 4},
              {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-2}}}}},
              {"scheduler",
               {{"type", "WarmupLR"},
                {"params",
                 {{"warmup_num_steps", 100}, {"warmup_type", "linear"}, {"warmup_max_lr", 0.01}}}}},
              {"fp16",
               {{"enabled", true},
                {"initial_scale_power", 8},
                {"hysteresis", 1},
                {"loss_scale_window", 1000}}},
              {"zero_optimization", {{"stage", 2}}}};
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto e = dtrain::zero::initialize(HalfLinear(20, 3), cfg, {pg});
    EXPECT_EQ(e.module()->inner->weight.scalar_type(), torch::kHalf);
    const int r = pg->rank();
    auto one_step = [&](int s, double factor) {
      auto x = d.x.narrow(0, s * 8 + r * 4, 4);
      auto loss = functional::cross_entropy(e(x), d.y.narrow(0, s * 8 + r * 4, 4)) * factor;
      e.backward(loss);
      e.step();
    };
    one_step(0, 1);
    one_step(1, 1);
    EXPECT_EQ(e.loss_scale(), 256);
    const double lr_before = e.get_lr();
    auto before = e.module()->inner->weight.detach().clone();
    e.core().inject_overflow();  // an injected overflow on every rank
    one_step(2, 1);
    EXPECT_TRUE(torch::equal(before, e.module()->inner->weight.detach()));
    EXPECT_EQ(e.skipped_steps(), 1);
    EXPECT_EQ(e.global_steps(), 3);
    EXPECT_EQ(e.loss_scale(), 128);
    EXPECT_EQ(e.get_lr(), lr_before);  // the scheduler did not step
    // A real overflow, on rank 1 only: every rank skips.
    before = e.module()->inner->weight.detach().clone();
    one_step(3, r == 1 ? 1e6 : 1);
    EXPECT_TRUE(torch::equal(before, e.module()->inner->weight.detach()));
    EXPECT_EQ(e.skipped_steps(), 2);
    EXPECT_EQ(e.loss_scale(), 64);
    one_step(4, 1);
    EXPECT_FALSE(torch::equal(before, e.module()->inner->weight.detach()));
    EXPECT_GT(e.get_lr(), lr_before);
  });
}

TEST(ZeroBf16, TrainsAToyTask) {
  // Two well separated classes: bf16 parameters with an fp32 master reach ~100% accuracy.
  torch::manual_seed(11);
  auto y = torch::randint(0, 2, {512}, torch::kLong);
  auto x = torch::randn({512, 20}) * 0.5 + (y.to(torch::kFloat32) * 2 - 1).unsqueeze(1);
  json cfg = {{"train_micro_batch_size_per_gpu", 16},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}}}}},
              {"bf16", {{"enabled", true}}},
              {"zero_optimization", {{"stage", 2}}}};
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = Sequential(Linear(20, 16), ReLU(), Linear(16, 2));
    auto e = dtrain::zero::initialize(model, cfg, {pg});
    for (int s = 0; s < 16; ++s) {
      int64_t row = s * 32 + pg->rank() * 16;
      auto out = e(x.narrow(0, row, 16).to(torch::kBFloat16));
      e.backward(functional::cross_entropy(out.to(torch::kFloat32), y.narrow(0, row, 16)));
      e.step();
    }
    torch::NoGradGuard ng;
    auto pred = e(x.to(torch::kBFloat16)).to(torch::kFloat32).argmax(1);
    double acc = pred.eq(y).to(torch::kFloat64).mean().item<double>();
    EXPECT_GE(acc, 0.97);
    EXPECT_EQ(model->parameters()[0].scalar_type(), torch::kBFloat16);
  });
}

TEST(ZeroEngine, AccumulationOfKMicroBatchesEqualsOneBatchKTimesLarger) {
  auto d = make_data(2 * 8 * 6);
  for (int stage : {0, 1, 2, 3}) {
    auto acc = run_zero(2, config(stage, 2, 4), d, 2, 4, 6);
    auto big = run_zero(2, config(stage, 8, 1), d, 8, 1, 6);
    EXPECT_LE(max_rel(acc, big), 1e-9) << "stage " << stage;
  }
  // With overlap_comm: stage 1 reduces only in the boundary micro-step's backward.
  json overlap = {{"zero_optimization", {{"overlap_comm", true}}}};
  for (int stage : {1, 2}) {
    auto acc = run_zero(2, config(stage, 2, 4, overlap), d, 2, 4, 6);
    auto big = run_zero(2, config(stage, 8, 1), d, 8, 1, 6);
    EXPECT_LE(max_rel(acc, big), 1e-9) << "stage " << stage << " with overlap_comm";
  }
}

// The module's zero_grad() between micro-batches drops what was accumulated, as in PyTorch and
// DeepSpeed's stages 0-1 (their gradients live in .grad until the boundary): equal to a run whose
// first micro-batch added nothing (its loss times 0).
TEST(ZeroEngine, ZeroGradOnTheModuleDropsTheAccumulatedGradients) {
  auto d = make_data(2 * 2 * 4);
  for (int stage : {0, 1}) {
    for (bool set_to_none : {true, false}) {
      Params dropped, zeroed;
      std::mutex mu;
      run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
        auto a = dtrain::zero::initialize(make_model(), config(stage, 2, 2), {pg});
        auto b = dtrain::zero::initialize(make_model(), config(stage, 2, 2), {pg});
        for (int s = 0; s < 2; ++s) {
          for (int j = 0; j < 2; ++j) {
            const int64_t row = s * 8 + pg->rank() * 4 + j * 2;
            auto x = d.x.narrow(0, row, 2);
            auto y = d.y.narrow(0, row, 2);
            a.backward(functional::cross_entropy(a(x), y));
            if (j == 0) a.module()->zero_grad(set_to_none);
            a.step();
            auto loss = functional::cross_entropy(b(x), y);
            b.backward(j == 0 ? loss * 0 : loss);
            b.step();
          }
        }
        auto pa = params_of(a), pb = params_of(b);
        std::lock_guard<std::mutex> lock(mu);
        if (pg->rank() == 0) dropped = pa, zeroed = pb;
      });
      EXPECT_LE(max_rel(dropped, zeroed), 1e-12)
          << "stage " << stage << ", zero_grad(set_to_none=" << set_to_none << ")";
    }
  }
}

// A loss backward cannot run through is refused by name before anything moves, as DeepSpeed
// asserts a scalar loss; the engine trains on after it.
TEST(ZeroEngine, BackwardRefusesALossThatIsNotAScalarWithGradients) {
  auto d = make_data(8);
  run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    auto e = dtrain::zero::initialize(make_model(), config(2, 4), {pg});
    auto out = e(d.x.narrow(0, 0, 4));
    auto message = [&](const torch::Tensor& loss) {
      try {
        e.backward(loss);
      } catch (const dtrain::UsageError& err) {
        return std::string(err.what());
      }
      return std::string("accepted");
    };
    EXPECT_NE(message(out).find("must be a tensor of one element (it has shape [4, 3])"),
              std::string::npos);
    EXPECT_NE(message(out.sum().detach()).find("does not require gradients"), std::string::npos);
    auto loss = functional::cross_entropy(out, d.y.narrow(0, 0, 4));
    EXPECT_NEAR(e.backward(loss).item<double>(), loss.item<double>(), 1e-12);  // gas 1
    e.step();
    EXPECT_EQ(e.global_steps(), 1);
  });
}

TEST(ZeroEngine, ClippingUsesTheGlobalNormOfThePartitionedGradients) {
  auto d = make_data(2 * 4 * 8);
  for (int stage : {1, 2, 3}) {
    json cfg = config(
        stage, 4, 1,
        {{"gradient_clipping", 0.05}, {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.5}}}}}});
    Params zero, ddp;
    std::mutex mu;
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_model(), cfg, {pg});
      // The reference: DDP, clip_grad_norm_ over the full averaged gradients, SGD.
      auto model = make_model();
      dtrain::DistributedDataParallel dp(model, {.group = pg});
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.5));
      {
        torch::NoGradGuard ng;  // start from the engine's (rank 0's) parameters
        auto src = params_of(e);
        for (size_t i = 0; i < src.size(); ++i) model->parameters()[i].copy_(src[i]);
      }
      for (int s = 0; s < 8; ++s) {
        int64_t row = s * 8 + pg->rank() * 4;
        auto loss = functional::cross_entropy(e(d.x.narrow(0, row, 4)), d.y.narrow(0, row, 4));
        e.backward(loss);
        e.step();
        EXPECT_GT(e.get_global_grad_norm().value_or(0), 0.05);  // clipping is active
        opt.zero_grad();
        functional::cross_entropy(dp(d.x.narrow(0, row, 4)), d.y.narrow(0, row, 4)).backward();
        utils::clip_grad_norm_(model->parameters(), 0.05);
        opt.step();
      }
      auto z = params_of(e);
      std::lock_guard<std::mutex> lock(mu);
      if (pg->rank() == 0) {
        zero = z;
        for (auto& p : model->parameters()) ddp.push_back(p.detach().clone());
      }
    });
    EXPECT_LE(max_rel(zero, ddp), 1e-9) << "stage " << stage;
  }
}

// A key DeepSpeed ignores (DeepSpeedExamples' "cuda_visible_devices") is accepted with a note
// the engine keeps; InitOptions::strict_config refuses it, naming it, before anything is built.
TEST(ZeroEngine, StrictConfigRefusesKeysDeepSpeedIgnores) {
  const json cfg = {
      {"train_batch_size", 4}, {"optimizer", {{"type", "Adam"}}}, {"cuda_visible_devices", "0"}};
  run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    auto e = dtrain::zero::initialize(make_model(), cfg, {pg});
    std::string notes;
    for (const auto& n : e.config().notes) notes += n + "\n";
    EXPECT_NE(notes.find("cuda_visible_devices: unknown key, not read by DeepSpeed 0.19.8"),
              std::string::npos)
        << notes;
    try {
      dtrain::zero::initialize(make_model(), cfg, {.group = pg, .strict_config = true});
      ADD_FAILURE() << "strict_config accepted an unknown key";
    } catch (const dtrain::zero::ConfigError& error) {
      EXPECT_EQ(std::string(error.what()).rfind("cuda_visible_devices: unknown key", 0), 0u)
          << error.what();
    }
  });
}

TEST(ZeroEngine, LambAndSgdOnPartitionsEqualOneRank) {
  auto d = make_data(2 * 4 * 6);
  for (const char* opt : {"Lamb", "SGD"}) {
    json o = {{"optimizer", {{"type", opt}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}}}};
    if (std::string(opt) == "SGD") o["optimizer"]["params"]["momentum"] = 0.9;
    for (int stage : {1, 3}) {
      auto two = run_zero(2, config(stage, 4, 1, o), d, 4, 1, 6);
      auto one = run_zero(1, config(0, 8, 1, o), d, 8, 1, 6);
      EXPECT_LE(max_rel(two, one), 1e-9) << opt << " stage " << stage;
    }
  }
}

TEST(ZeroEngine, MemoryIsPartitionedByStage) {
  const int N = 4;
  auto d = make_data(N * 4 * 2, torch::kFloat32);
  std::map<std::string, dtrain::zero::MemoryUsage> mem;
  std::map<std::string, int64_t> bytes;
  std::mutex mu;
  for (std::string v : {"0", "1", "2", "3", "3off"}) {
    json extra = {{"zero_optimization", {{"reduce_bucket_size", 200}}}};
    if (v == "3off")
      extra["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}},
      extra["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
    run_ranks(N, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_model(torch::kFloat32),
                                        config(v[0] - '0', 4, 1, extra), {pg});
      train(e, d, pg->rank(), N, 4, 1, 0, 2);
      std::lock_guard<std::mutex> lock(mu);
      if (pg->rank() == 1) mem[v] = e.memory(), bytes[v] = e.bytes_sent_last_step();
    });
  }
  // 795 elements padded to a multiple of 2 x N (DeepSpeed's stage 1/2 alignment).
  const int64_t n = 795, padded = 800, part = padded / N;
  EXPECT_EQ(mem["0"].params(), padded * 4);
  EXPECT_EQ(mem["0"].grads(), padded * 4);
  EXPECT_EQ(mem["0"].optimizer(), 2 * padded * 4);
  EXPECT_EQ(mem["1"].optimizer() * N, mem["0"].optimizer());  // 1/N (padding included)
  EXPECT_EQ(mem["1"].grads(), padded * 4);
  EXPECT_EQ(mem["2"].optimizer(), 2 * part * 4);
  // 1/N + one bucket: buckets hold < 2 x 200 elements (a parameter of 200 or more is reduced
  // in place, in its own bucket); here [bias2, weight2, bias1] = 135 elements are staged.
  EXPECT_EQ(mem["2"].grads(), part * 4 + 135 * 4);
  EXPECT_EQ(mem["3"].params(), part * 4);  // between steps: only the partition
  EXPECT_EQ(mem["3"].optimizer(), 2 * part * 4);
  EXPECT_EQ(mem["3off"].optimizer_device, 0);
  EXPECT_EQ(mem["3off"].optimizer_cpu, 3 * part * 4);  // fp32 master + exp_avg + exp_avg_sq
  EXPECT_EQ(mem["3off"].params_device, 0);
  EXPECT_EQ(mem["3off"].params_cpu, part * 4);
  // Bytes sent per step (ring volumes): stage 0 all-reduces; stages 1-2 reduce-scatter (or
  // reduce to owners) + all-gather: what DDP's all-reduce sends. Stage 3 gathers the whole
  // module once per step (forward and backward share it), so it sends the same.
  const int64_t ddp = 2 * (N - 1) * padded * 4 / N;
  EXPECT_EQ(bytes["0"], ddp);
  // Stages 1-3 in fp32 also combine one float64, the squared global norm (DeepSpeed's
  // get_global_grad_norm(); an inf or NaN in it skips the step, as DeepSpeed's ZeRO optimizers
  // skip it).
  EXPECT_EQ(bytes["1"], ddp + 8 * 2 * (N - 1) / N);
  // The reduce (and stage 3's gathers) skip the padding's padded - n elements.
  EXPECT_NEAR(double(bytes["2"]), double(ddp), 8.0 * double(padded - n));
  EXPECT_NEAR(double(bytes["3"]), double(ddp), 8.0 * double(padded - n));
}

// Checkpoints: layout, bitwise resume, another world size, consolidation.
fs::path temp_dir(const std::string& name) {
  auto p = fs::temp_directory_path() / ("zero_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

TEST(ZeroCheckpoint, DeepSpeedLayoutAndBitwiseResume) {
  auto d = make_data(2 * 4 * 10, torch::kFloat32);
  for (std::string v : {"1", "2", "3", "2off"}) {
    json extra = json::object();
    if (v == "2off") extra = {{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}}}}}};
    json cfg = config(v[0] - '0', 4, 1, extra);
    auto dir = temp_dir("resume" + v);
    auto straight = run_zero(2, cfg, d, 4, 1, 10);
    Params resumed;
    std::mutex mu;
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_model(torch::kFloat32), cfg, {pg});
      train(e, d, pg->rank(), 2, 4, 1, 0, 5);
      e.save_checkpoint(dir.string());
    });
    // DeepSpeed's files: stage 3 writes a model file per rank, the other stages one.
    if (v == "3") {
      EXPECT_FALSE(fs::exists(dir / "global_step5" / "mp_rank_00_model_states.pt"));
      EXPECT_TRUE(fs::exists(dir / "global_step5" / "zero_pp_rank_0_mp_rank_00_model_states.pt"));
      EXPECT_TRUE(fs::exists(dir / "global_step5" / "zero_pp_rank_1_mp_rank_00_model_states.pt"));
    } else {
      EXPECT_TRUE(fs::exists(dir / "global_step5" / "mp_rank_00_model_states.pt"));
    }
    EXPECT_TRUE(fs::exists(dir / "global_step5" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"));
    EXPECT_TRUE(fs::exists(dir / "global_step5" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"));
    std::ifstream latest(dir / "latest");
    std::string tag;
    latest >> tag;
    EXPECT_EQ(tag, "global_step5");
    for (auto& entry : fs::directory_iterator(dir))  // nothing half-written left behind
      EXPECT_TRUE(entry.path().filename() == "latest" || entry.path().filename() == "global_step5")
          << entry.path();
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_model(torch::kFloat32), cfg, {pg});
      EXPECT_EQ(e.load_checkpoint(dir.string()), "global_step5");
      EXPECT_EQ(e.global_steps(), 5);
      train(e, d, pg->rank(), 2, 4, 1, 5, 5);
      auto p = params_of(e);
      std::lock_guard<std::mutex> lock(mu);
      if (pg->rank() == 0) resumed = p;
    });
    ASSERT_EQ(resumed.size(), straight.size());
    bool same = true;
    for (size_t i = 0; i < resumed.size(); ++i)
      same = same && torch::equal(resumed[i], straight[i]);
    if (!same) {
      // Issue 29's open flake (stage 1, the first engine of the process, rarely, in full runs
      // only): say whether the straight run itself reproduces, to tell resume from the rest.
      auto again = run_zero(2, cfg, d, 4, 1, 10);
      for (size_t i = 0; i < resumed.size(); ++i) {
        ADD_FAILURE() << "stage " << v << " tensor " << i << ": resumed - straight max |diff| "
                      << (resumed[i] - straight[i]).abs().max().item<double>()
                      << "; a second straight run equals the first: "
                      << torch::equal(again[i], straight[i])
                      << ", equals the resumed one: " << torch::equal(again[i], resumed[i]);
      }
    }
    fs::remove_all(dir);
  }
}

// torch.optim.lr_scheduler's schedulers and torch.optim.RMSprop by name: a run saved after 5
// steps and resumed (the scheduler from torch's state_dict(): last_epoch, the current rate,
// CosineAnnealingWarmRestarts' T_cur and T_i) ends bitwise where the uninterrupted run ends.
TEST(ZeroCheckpoint, TorchSchedulersAndRMSpropResumeBitwise) {
  auto d = make_data(2 * 4 * 10, torch::kFloat32);
  const json rms = {{"type", "RMSprop"},
                    {"params", {{"lr", 0.01}, {"momentum", 0.5}, {"centered", true}}}};
  const json sgd = {{"type", "SGD"}, {"params", {{"lr", 0.05}}}};
  const std::vector<std::tuple<std::string, int, json, json>> cases = {
      {"RMSprop + CosineAnnealingWarmRestarts, stage 0",
       0,
       rms,
       {{"type", "CosineAnnealingWarmRestarts"}, {"params", {{"T_0", 2}, {"T_mult", 2}}}}},
      {"SGD + OneCycleLR three_phase, stage 2",
       2,
       sgd,
       {{"type", "OneCycleLR"},
        {"params", {{"max_lr", 0.1}, {"total_steps", 12}, {"three_phase", true}}}}},
      {"RMSprop + MultiStepLR, stage 1",
       1,
       rms,
       {{"type", "MultiStepLR"}, {"params", {{"milestones", {3, 6, 6}}, {"gamma", 0.5}}}}},
      {"Adam + LinearLR, stage 3",
       3,
       {{"type", "Adam"}, {"params", {{"lr", 0.01}}}},
       {{"type", "LinearLR"}, {"params", {{"total_iters", 8}}}}}};
  for (const auto& [name, stage, optimizer, scheduler] : cases) {
    SCOPED_TRACE(name);
    json cfg = config(stage, 4, 1,
                      {{"optimizer", optimizer},
                       {"scheduler", scheduler},
                       {"zero_allow_untested_optimizer", true}});
    auto dir = temp_dir("torch-sched");
    auto straight = run_zero(2, cfg, d, 4, 1, 10);
    double straight_lr = 0, resumed_lr = 0;
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_model(torch::kFloat32), cfg, {pg});
      train(e, d, pg->rank(), 2, 4, 1, 0, 10);
      if (pg->rank() == 0) straight_lr = e.get_lr();
    });
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_model(torch::kFloat32), cfg, {pg});
      train(e, d, pg->rank(), 2, 4, 1, 0, 5);
      e.save_checkpoint(dir.string());
    });
    Params resumed;
    std::mutex mu;
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_model(torch::kFloat32), cfg, {pg});
      EXPECT_EQ(e.load_checkpoint(dir.string()), "global_step5");
      train(e, d, pg->rank(), 2, 4, 1, 5, 5);
      auto p = params_of(e);
      std::lock_guard<std::mutex> lock(mu);
      if (pg->rank() == 0) {
        resumed = p;
        resumed_lr = e.get_lr();
      }
    });
    EXPECT_EQ(resumed_lr, straight_lr);
    ASSERT_EQ(resumed.size(), straight.size());
    for (size_t i = 0; i < resumed.size(); ++i)
      EXPECT_TRUE(torch::equal(resumed[i], straight[i]))
          << "tensor " << i << ": max |diff| "
          << (resumed[i] - straight[i]).abs().max().item<double>();
    fs::remove_all(dir);
  }
}

// torch's OneCycleLR raises once stepped past total_steps (after update total_steps + 1), and
// so does dtrain's engine, with torch's reason.
TEST(ZeroEngine, OneCycleLRPastTotalStepsIsAClearError) {
  auto d = make_data(4 * 10, torch::kFloat32);
  json cfg = config(
      0, 4, 1,
      {{"scheduler", {{"type", "OneCycleLR"}, {"params", {{"max_lr", 0.1}, {"total_steps", 3}}}}}});
  run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    auto e = dtrain::zero::initialize(make_model(torch::kFloat32), cfg, {pg});
    train(e, d, 0, 1, 4, 1, 0, 3);  // last_epoch 3 = total_steps: still fine
    try {
      train(e, d, 0, 1, 4, 1, 3, 1);
      ADD_FAILURE() << "no error past total_steps";
    } catch (const dtrain::Error& err) {
      EXPECT_NE(std::string(err.what()).find("past its total_steps 3"), std::string::npos)
          << err.what();
    }
  });
}

// Every rank's optim_state() put together by rank: the master (or the parameters it updates)
// and each optimizer state tensor over the whole flat order, unpadded.
std::vector<torch::Tensor> whole_optimizer(const std::vector<c10::IValue>& per_rank) {
  std::vector<std::vector<torch::Tensor>> pieces;
  for (const auto& v : per_rank) {
    auto o = v.toGenericDict().at("optimizer_state_dict").toGenericDict();
    const int64_t n = o.at("end").toInt() - o.at("begin").toInt();
    auto master = o.contains("fp32_flat")
                      ? o.at("fp32_flat").toTensor()
                      : o.at("single_partition_of_fp32_groups").toListRef()[0].toTensor();
    std::vector<torch::Tensor> row = {master.reshape({-1}).narrow(0, 0, n)};
    for (const auto& e : o.at("state").toGenericDict())
      row.push_back(e.value().toTensor().reshape({-1}).narrow(0, 0, n));
    if (pieces.size() < row.size()) pieces.resize(row.size());
    for (size_t k = 0; k < row.size(); ++k) pieces[k].push_back(row[k]);
  }
  std::vector<torch::Tensor> out;
  for (auto& p : pieces) out.push_back(torch::cat(p));
  return out;
}

TEST(ZeroCheckpoint, SavedOnTwoRanksLoadsOnFourAndOneBitwiseWithOptimizerState) {
  // 2 ranks x batch 4, 4 ranks x batch 2 and 1 rank x batch 8 read the same 8 rows per step.
  auto d = make_data(8 * 10);
  for (int stage : {0, 1, 2, 3}) {
    auto dir = temp_dir("reshard" + std::to_string(stage));
    auto straight = run_zero(2, config(stage, 4), d, 4, 1, 10);
    Params saved_params;
    std::vector<c10::IValue> saved_optim(2);
    std::mutex mu;
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_model(), config(stage, 4), {pg});
      train(e, d, pg->rank(), 2, 4, 1, 0, 5);
      e.save_checkpoint(dir.string());
      auto o = e.core().optim_state();
      auto p = params_of(e);
      std::lock_guard<std::mutex> lock(mu);
      saved_optim[static_cast<size_t>(pg->rank())] = o;
      if (pg->rank() == 0) saved_params = p;
    });
    const auto saved = whole_optimizer(saved_optim);
    // At 4 and at 1 rank, at the same stage; and across the stage-3 layout (a stage-3
    // checkpoint into stage 1, a stage-1 one into stage 3).
    std::vector<std::pair<int, int>> loads = {{4, stage}, {1, stage}};
    if (stage == 3 || stage == 1) loads.push_back({4, 4 - stage});
    for (auto [world, into] : loads) {
      Params loaded, resumed;
      std::vector<c10::IValue> optim(static_cast<size_t>(world));
      run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
        auto e = dtrain::zero::initialize(make_model(), config(into, 8 / world), {pg});
        e.load_checkpoint(dir.string());
        auto o = e.core().optim_state();
        auto p = params_of(e);
        train(e, d, pg->rank(), world, 8 / world, 1, 5, 5);
        auto r = params_of(e);
        std::lock_guard<std::mutex> lock(mu);
        optim[static_cast<size_t>(pg->rank())] = o;
        if (pg->rank() == 0) loaded = p, resumed = r;
      });
      // Each rank read only its part of the files: together, what was saved, bit for bit.
      ASSERT_EQ(loaded.size(), saved_params.size());
      for (size_t i = 0; i < loaded.size(); ++i)
        EXPECT_TRUE(torch::equal(loaded[i], saved_params[i]))
            << "stage " << stage << " into " << into << " at " << world << " ranks: parameter "
            << i;
      const auto got = whole_optimizer(optim);
      ASSERT_EQ(got.size(), saved.size())
          << "stage " << stage << " into " << into << " at " << world << " ranks";
      for (size_t k = 0; k < got.size(); ++k)
        EXPECT_TRUE(torch::equal(got[k], saved[k]))
            << "stage " << stage << " into " << into << " at " << world
            << " ranks: optimizer tensor " << k;
      // Adam's state came along: without it the 5 later steps would differ at ~1e-2.
      EXPECT_LE(max_rel(resumed, straight), 1e-9)
          << "stage " << stage << " into " << into << " at " << world;
    }
    fs::remove_all(dir);
  }
}

// make_model()'s network, names and values with its parameters registered in another order
// (2.weight, 2.bias, 0.weight, 0.bias).
struct ReorderedImpl : torch::nn::Module {
  ReorderedImpl() {
    second = register_module("2", Linear(33, 3));
    first = register_module("0", Linear(20, 33));
    to(torch::kFloat64);
    torch::NoGradGuard ng;
    auto values = make_model()->named_parameters();
    for (auto& item : named_parameters()) item.value().copy_(values[item.key()]);
  }
  torch::Tensor forward(const torch::Tensor& x) { return second(torch::tanh(first(x))); }
  Linear first{nullptr}, second{nullptr};
};
TORCH_MODULE(Reordered);

// A checkpoint of a module that registered its parameters in one order loads into one that
// registers them in another (the same names): each parameter and its optimizer state go where
// the engine holds them, and training goes on as uninterrupted (at stage 0 too).
TEST(ZeroCheckpoint, LoadsIntoAModuleThatRegistersItsParametersInAnotherOrder) {
  auto d = make_data(8 * 10);
  for (int stage : {0, 1, 2, 3}) {
    auto dir = temp_dir("reordered" + std::to_string(stage));
    auto straight = run_zero(2, config(stage, 4), d, 4, 1, 10);
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_model(), config(stage, 4), {pg});
      train(e, d, pg->rank(), 2, 4, 1, 0, 5);
      e.save_checkpoint(dir.string());
    });
    std::map<std::string, torch::Tensor> resumed;
    std::mutex mu;
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(Reordered(), config(stage, 4), {pg});
      e.load_checkpoint(dir.string());
      train(e, d, pg->rank(), 2, 4, 1, 5, 5);
      if (stage == 3) e.core().before_forward();  // gathers
      std::lock_guard<std::mutex> lock(mu);
      if (pg->rank() == 0)
        for (auto& item : e.module()->named_parameters())
          resumed[item.key()] = item.value().detach().clone();
    });
    const auto names = make_model()->named_parameters().keys();
    Params in_order;
    for (const auto& n : names) in_order.push_back(resumed.at(n));
    EXPECT_LE(max_rel(in_order, straight), 1e-9) << "stage " << stage;
    fs::remove_all(dir);
  }
}

// DeepSpeed's save_checkpoint(client_state=..., save_latest=...) and
// load_checkpoint(load_module_only=...), and its (load_path, client_state) return.
TEST(ZeroCheckpoint, ClientStateSaveLatestAndModuleOnlyAsDeepSpeeds) {
  auto d = make_data(2 * 4 * 6);
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto dir = temp_dir("client" + std::to_string(stage));
    const json client = {{"step", 3},       {"epoch", 1},
                         {"best", 0.8125},  {"note", "warm"},
                         {"sizes", {1, 2}}, {"nested", {{"a", nullptr}, {"b", true}}}};
    Params at3, at5;
    std::mutex mu;
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_model(), config(stage, 4), {pg});
      train(e, d, pg->rank(), 2, 4, 1, 0, 3);
      e.save_checkpoint(dir.string(), "", {.client_state = client});
      auto p = params_of(e);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (pg->rank() == 0) at3 = p;
      }
      train(e, d, pg->rank(), 2, 4, 1, 3, 2);
      // Not the latest: DIR/latest still names global_step3.
      e.save_checkpoint(dir.string(), "", {.save_latest = false});
      p = params_of(e);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (pg->rank() == 0) at5 = p;
      }
      // A key the checkpoint keeps itself is refused before anything is written.
      try {
        e.save_checkpoint(dir.string(), "bad", {.client_state = {{"global_steps", 1}}});
        ADD_FAILURE() << "no error";
      } catch (const dtrain::UsageError& err) {
        EXPECT_NE(std::string(err.what()).find("'global_steps'"), std::string::npos) << err.what();
      }
    });
    EXPECT_TRUE(fs::exists(dir / "global_step5"));
    EXPECT_FALSE(fs::exists(dir / "bad"));
    std::string latest;
    std::ifstream(dir / "latest") >> latest;
    EXPECT_EQ(latest, "global_step3");
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_model(), config(stage, 4), {pg});
      EXPECT_TRUE(e.client_state().empty());
      EXPECT_EQ(e.load_checkpoint(dir.string()), "global_step3");
      EXPECT_EQ(e.client_state(), client);
      EXPECT_EQ(e.global_steps(), 3);
      // load_module_only: the parameters of step 5, the steps of this engine (still 3).
      EXPECT_EQ(e.load_checkpoint(dir.string(), "global_step5", {.load_module_only = true}),
                "global_step5");
      EXPECT_EQ(e.global_steps(), 3);
      EXPECT_EQ(e.client_state(), json::object());
      auto p = params_of(e);
      if (pg->rank() == 0) {
        ASSERT_EQ(p.size(), at5.size());
        for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(torch::equal(p[i], at5[i])) << i;
        EXPECT_FALSE(torch::equal(p[0], at3[0]));  // step 5's, not step 3's
      }
    });
    fs::remove_all(dir);
  }
}

// load_module_strict = false with load_module_only at 2 ranks, stages 2 and 3 (each rank's fp32
// master a part; at stage 3 the module file holds placeholders and each rank its partition): the
// saved parameters where the model has them, the new layer's own values, and the master
// refreshed from them (a step with lr 0 writes the master back unchanged). Strict, and not
// module-only, refuse naming the keys.
TEST(ZeroCheckpoint, LoadModuleStrictFalseLoadsTheParametersBothHave) {
  auto d = make_data(2 * 4 * 3);
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto dir = temp_dir("strict");
    Params saved;
    std::mutex mu;
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_model(), config(stage, 4), {pg});
      train(e, d, pg->rank(), 2, 4, 1, 0, 3);
      e.save_checkpoint(dir.string(), "a");
      auto p = params_of(e);
      std::lock_guard<std::mutex> lock(mu);
      if (pg->rank() == 0) saved = p;
    });
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      Sequential wider = make_model();
      {
        std::lock_guard<std::mutex> lock(mu);
        torch::manual_seed(99);
        wider->push_back(Linear(3, 3));
        wider->to(torch::kFloat64);
      }
      const Params before = [&] {
        Params p;
        for (auto& t : wider->parameters()) p.push_back(t.detach().clone());
        return p;
      }();
      auto e = dtrain::zero::initialize(
          wider,
          config(stage, 4, 1,
                 {{"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.0}}}}},
                  {"zero_allow_untested_optimizer", true}}),
          {pg});
      for (const auto& opts : {dtrain::zero::LoadCheckpointOptions{.load_module_only = true},
                               dtrain::zero::LoadCheckpointOptions{.load_module_strict = false}}) {
        try {
          e.load_checkpoint(dir.string(), "a", opts);
          ADD_FAILURE() << "no error on rank " << pg->rank();
        } catch (const dtrain::UsageError& err) {
          EXPECT_NE(std::string(err.what()).find("missing: 3.weight, 3.bias; unexpected: none"),
                    std::string::npos)
              << err.what();
        }
      }
      EXPECT_EQ(e.load_checkpoint(dir.string(), "a",
                                  {.load_module_only = true, .load_module_strict = false}),
                "a");
      EXPECT_EQ(e.global_steps(), 0);  // the module only
      // A step with lr 0: the parameters come from the (refreshed) master, so equal after it.
      train(e, d, pg->rank(), 2, 4, 1, 0, 1);
      auto p = params_of(e);
      ASSERT_EQ(p.size(), 6u);
      for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(torch::equal(p[i], saved[i])) << i;
      for (size_t i = 4; i < 6; ++i) EXPECT_TRUE(torch::equal(p[i], before[i])) << i;
    });
    fs::remove_all(dir);
  }
}

// A frozen parameter (requires_grad false: not the engine's) is saved and loaded back, as
// torch's load_state_dict (DeepSpeed's module load) does: from the module at stages 1-2, from
// every saved rank's frozen_param_fragments at stage 3 (3 elements saved as 2 + 1 and padding),
// loaded at 1 and at 3 ranks.
TEST(ZeroCheckpoint, FrozenParametersComeBackFromTheModule) {
  auto d = make_data(2 * 4 * 2);
  auto frozen_model = [](double value) {
    Sequential m = make_model();
    auto last = m->ptr(2)->as<Linear>();
    torch::NoGradGuard ng;
    last->bias.fill_(value);
    last->bias.set_requires_grad(false);
    return m;
  };
  for (int stage : {1, 2, 3}) {
    auto dir = temp_dir("frozen");
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(frozen_model(0.25), config(stage, 4), {pg});
      train(e, d, pg->rank(), 2, 4, 1, 0, 2);
      e.save_checkpoint(dir.string(), "a");
    });
    for (int world : {1, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + ", loaded at " + std::to_string(world) +
                   " ranks");
      run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
        Sequential m = frozen_model(-1.0);
        auto e = dtrain::zero::initialize(m, config(stage, 4), {pg});
        e.load_checkpoint(dir.string(), "a");
        const auto bias = m->ptr(2)->as<Linear>()->bias;
        EXPECT_TRUE(torch::equal(bias, torch::full({3}, 0.25, bias.options()))) << bias;
        EXPECT_EQ(e.global_steps(), 2);
      });
    }
    fs::remove_all(dir);
  }
}

// Every rank refuses together, so none waits in the save's barriers for one that refused:
// one rank's bad client_state, or ranks saving under different tags (DeepSpeed's
// checkpoint.tag_validation; here the files of one save must be one directory).
TEST(ZeroCheckpoint, ABadSaveOnOneRankIsRefusedOnEveryRank) {
  auto dir = temp_dir("badsave");
  std::atomic<int> refused{0};
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto e = dtrain::zero::initialize(make_model(), config(3, 4), {pg});
    auto expect_refusal = [&](const std::function<void()>& save, const std::string& needle) {
      try {
        save();
        ADD_FAILURE() << "no error on rank " << pg->rank();
      } catch (const dtrain::UsageError& err) {
        EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
        ++refused;
      }
    };
    const json bad = pg->rank() == 1 ? json{{"module", 1}} : json::object();
    expect_refusal([&] { e.save_checkpoint(dir.string(), "a", {.client_state = bad}); },
                   "rank 1: client_state key 'module'");
    expect_refusal([&] { e.save_checkpoint(dir.string(), pg->rank() == 0 ? "a" : "b"); },
                   "different tags");
    e.save_checkpoint(dir.string(), "a");  // and the group still works
  });
  EXPECT_EQ(refused.load(), 4);
  EXPECT_TRUE(fs::exists(dir / "a"));
  EXPECT_FALSE(fs::exists(dir / "b"));
  fs::remove_all(dir);
}

// DeepSpeed's save_16bit_model: the module's state dict in the model's dtype (bf16 under
// mixed precision; buffers kept fp32, as DeepSpeed 0.19.8 keeps them), one file by rank 0; at
// stage 3 only with stage3_gather_16bit_weights_on_model_save.
TEST(ZeroCheckpoint, Save16BitModelAsDeepSpeeds) {
  auto d = make_data(2 * 4 * 2, torch::kFloat32);
  for (int stage : {1, 3}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (bf16 ? ", bf16" : ", fp32"));
      auto dir = temp_dir("16bit" + std::to_string(stage) + (bf16 ? "b" : "f"));
      // fp32: a BatchNorm's buffers in the file too (libtorch's batch norm wants one dtype).
      auto model = [&] {
        return bf16 ? Sequential(Linear(20, 33), Tanh(), Linear(33, 3))
                    : Sequential(Linear(20, 33), BatchNorm1d(33), Tanh(), Linear(33, 3));
      };
      const auto dt = bf16 ? torch::kBFloat16 : torch::kFloat32;
      Params trained;
      std::mutex mu;
      run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
        json cfg = config(stage, 4, 1, bf16 ? json{{"bf16", {{"enabled", true}}}} : json::object());
        auto e = dtrain::zero::initialize(model(), cfg, {pg});
        for (int s = 0; s < 2; ++s) {
          int64_t row = s * 8 + pg->rank() * 4;
          e.backward(functional::cross_entropy(e(d.x.narrow(0, row, 4).to(dt)).to(torch::kFloat32),
                                               d.y.narrow(0, row, 4)));
          e.step();
        }
        // Stage 3 without the gather flag: nothing saved, as DeepSpeed (False).
        EXPECT_EQ(e.save_16bit_model(dir.string(), "plain.bin"), stage != 3);
        // The weights, through a checkpoint, into an engine with the flag.
        cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = true;
        auto e2 = dtrain::zero::initialize(model(), cfg, {pg});
        e.save_checkpoint(dir.string() + "/ckpt");
        e2.load_checkpoint(dir.string() + "/ckpt");
        EXPECT_TRUE(e2.save_16bit_model(dir.string()));
        auto p = params_of(e2);
        std::lock_guard<std::mutex> lock(mu);
        if (pg->rank() == 0) trained = p;
      });
      EXPECT_EQ(fs::exists(dir / "plain.bin"), stage != 3);
      auto sd = dtrain::zero::load_state_dict_file((dir / "pytorch_model.bin").string());
      std::vector<std::string> keys;
      for (const auto& item : sd) keys.push_back(item.key());
      // torch's state_dict order: each module's parameters, then its buffers.
      const std::vector<std::string> params =
          bf16 ? std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}
               : std::vector<std::string>{"0.weight", "0.bias",   "1.weight",
                                          "1.bias",   "3.weight", "3.bias"};
      const std::vector<std::string> with_buffers = {"0.weight",
                                                     "0.bias",
                                                     "1.weight",
                                                     "1.bias",
                                                     "1.running_mean",
                                                     "1.running_var",
                                                     "1.num_batches_tracked",
                                                     "3.weight",
                                                     "3.bias"};
      EXPECT_EQ(keys, bf16 ? params : with_buffers);
      ASSERT_EQ(trained.size(), params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(sd[params[i]].scalar_type(), dt) << params[i];
        EXPECT_TRUE(torch::equal(sd[params[i]], trained[i])) << params[i];
      }
      fs::remove_all(dir);
    }
  }
}

TEST(ZeroCheckpoint, ToFp32WritesAStateDictTheUnwrappedModelLoads) {
  auto d = make_data(2 * 4 * 3, torch::kFloat32);
  auto dir = temp_dir("tofp32");
  Params trained;
  std::mutex mu;
  json cfg = config(3, 4, 1, {{"bf16", {{"enabled", true}}}});
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = Sequential(Linear(20, 33), Tanh(), Linear(33, 3));
    auto e = dtrain::zero::initialize(model, cfg, {pg});
    for (int s = 0; s < 3; ++s) {
      int64_t row = s * 8 + pg->rank() * 4;
      e.backward(functional::cross_entropy(
          e(d.x.narrow(0, row, 4).to(torch::kBFloat16)).to(torch::kFloat32),
          d.y.narrow(0, row, 4)));
      e.step();
    }
    e.save_checkpoint(dir.string());
    auto p = params_of(e);
    std::lock_guard<std::mutex> lock(mu);
    if (pg->rank() == 0) trained = p;
  });
  auto out = dir / "consolidated.pt";
  auto r = dtrain::test::run_command({DTRAIN_BIN, "zero", "to-fp32", dir.string(), out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto sd = dtrain::zero::load_state_dict_file(out.string());
  auto plain = make_model(torch::kFloat32);
  dtrain::load_state_dict(*plain, sd);  // strict: every name and shape matches
  auto params = plain->parameters();
  ASSERT_EQ(params.size(), trained.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].scalar_type(), torch::kFloat32);
    // The fp32 master rounds to the bf16 parameters the model trained with.
    EXPECT_TRUE(torch::equal(params[i].to(torch::kBFloat16), trained[i])) << i;
  }
  r = dtrain::test::run_command(
      {DTRAIN_BIN, "zero", "to-fp32", (dir / "nothing").string(), out.string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("nothing does not exist; give the checkpoint directory"), std::string::npos)
      << r.err;
  // Into a tag of the checkpoint (over one of the files it reads): refused, nothing written.
  const auto inside = dir / "global_step3" / "zero_pp_rank_0_mp_rank_00_model_states.pt";
  const auto before = fs::file_size(inside);
  r = dtrain::test::run_command({DTRAIN_BIN, "zero", "to-fp32", dir.string(), inside.string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("would replace part of the checkpoint"), std::string::npos) << r.err;
  EXPECT_EQ(fs::file_size(inside), before);
  fs::remove_all(dir);
}

TEST(ZeroEngine, BadSetupsAreClearErrors) {
  run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    json no_opt = {{"train_batch_size", 4}};
    try {
      dtrain::zero::initialize(make_model(), no_opt, {pg});
      ADD_FAILURE() << "no error";
    } catch (const dtrain::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("no \"optimizer\" section"), std::string::npos)
          << e.what();
    }
    auto mixed = make_model();
    mixed[0]->to(torch::kFloat32);
    try {
      dtrain::zero::initialize(mixed, config(1, 4), {pg});
      ADD_FAILURE() << "no error";
    } catch (const dtrain::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("one dtype and device"), std::string::npos) << e.what();
    }
  });
}

// torch_autocast: the engine's forward runs under torch.autocast (the output in bf16, the
// thread's autocast state as it was after it), module.forward called directly does not, and the
// module classes are libtorch's torch.nn classes by their Python names.
// torch.autocast("cpu", bfloat16) around a scope, and CUDA's autocast flag too with `cuda` (the
// flag is thread state; it needs no GPU), as the Python around a DeepSpeed engine sets them.
class OuterAutocast {
 public:
  explicit OuterAutocast(bool cuda) : cuda_(cuda) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(c10::DeviceType::CPU, true);
    at::autocast::set_autocast_dtype(c10::DeviceType::CPU, torch::kBFloat16);
    at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, cuda_);
#else
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(torch::kBFloat16);
    at::autocast::set_enabled(cuda_);
#endif
  }
  ~OuterAutocast() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(c10::DeviceType::CPU, false);
    at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, false);
#else
    at::autocast::set_cpu_enabled(false);
    at::autocast::set_enabled(false);
#endif
    at::autocast::clear_cache();
  }
  OuterAutocast(const OuterAutocast&) = delete;
  OuterAutocast& operator=(const OuterAutocast&) = delete;

 private:
  bool cuda_;
};

TEST(ZeroEngine, TorchAutocastWrapsTheForwardOnly) {
  run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    auto m = make_model(torch::kFloat32);
    const json autocast = {{"torch_autocast",
                            {{"enabled", true},
                             {"dtype", "bf16"},
                             {"lower_precision_safe_modules",
                              {"torch.nn.modules.linear.Linear", "torch.nn.Conv2d"}}}}};
    auto e = dtrain::zero::initialize(m, config(2, 4, 1, autocast), {pg});
    const auto x = make_data(4, torch::kFloat32).x;
    EXPECT_EQ(e(x).scalar_type(), torch::kBFloat16);
    EXPECT_EQ(m->forward(x).scalar_type(), torch::kFloat32);
    auto off = make_model(torch::kFloat32);
    auto plain = dtrain::zero::initialize(off, config(2, 4), {pg});
    EXPECT_EQ(plain(x).scalar_type(), torch::kFloat32);
    json other = autocast;
    other["torch_autocast"]["lower_precision_safe_modules"] = {"transformers.pytorch_utils.Conv1D"};
    try {
      dtrain::zero::initialize(make_model(torch::kFloat32), config(2, 4, 1, other), {pg});
      ADD_FAILURE() << "no error";
    } catch (const dtrain::UsageError& err) {
      EXPECT_NE(std::string(err.what())
                    .find("\"transformers.pytorch_utils.Conv1D\" is not a torch.nn class "
                          "libtorch has"),
                std::string::npos)
          << err.what();
    }
  });
}

// DeepSpeed 0.19.8's autocast_if_enabled with torch.autocast already on outside the engine (it
// asks torch.is_autocast_enabled(), CUDA's state): the forward follows the config's section,
// and with the section off autocast is turned off on the engine's device for the forward. Seen
// with DeepSpeed's CPU engine under torch.autocast("cpu", bfloat16) and CUDA's flag set: fp32
// out with the section off, fp16 with {"enabled": true, "dtype": "fp16"}; bf16 without the flag.
TEST(ZeroEngine, TorchAutocastOnOutsideTheEngineAsDeepSpeed) {
  run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    const auto x = make_data(4, torch::kFloat32).x;
    auto m = make_model(torch::kFloat32);
    auto plain = dtrain::zero::initialize(m, config(2, 4), {pg});
    auto m16 = make_model(torch::kFloat32);
    auto fp16 = dtrain::zero::initialize(
        m16, config(2, 4, 1, {{"torch_autocast", {{"enabled", true}, {"dtype", "fp16"}}}}), {pg});
    // fp16 on the CPU: libtorch 1.13's CPU autocast takes bf16 only and turns itself off.
    const auto fp16_out = TORCH_VERSION_MAJOR >= 2 ? torch::kHalf : torch::kFloat32;
    for (bool cuda_on : {false, true}) {
      SCOPED_TRACE(cuda_on ? "cuda autocast on outside" : "cpu autocast only");
      OuterAutocast outer(cuda_on);
      EXPECT_EQ(plain(x).scalar_type(), cuda_on ? torch::kFloat32 : torch::kBFloat16);
      EXPECT_EQ(fp16(x).scalar_type(), fp16_out);
      EXPECT_EQ(m->forward(x).scalar_type(), torch::kBFloat16);  // the outer state is back
    }
  });
}

}  // namespace
