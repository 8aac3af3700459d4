// ZeRO with the user's own optimizer (InitOptions::optimizer, DeepSpeed's client optimizer),
// ranks as threads: it steps the partitions as it would step the whole model on one process,
// at every stage; its state is checkpointed per rank and resumes bitwise; misuse is named.
// And Adagrad by name, which steps as torch::optim::Adagrad does.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>

#include "dtrain/zero.h"
#include "support/thread_group.h"

namespace {

namespace fs = std::filesystem;
using dtrain::ProcessGroup;
using dtrain::test::run_ranks;
using nlohmann::json;
using namespace torch::nn;
using Params = std::vector<torch::Tensor>;

std::mutex seed_mu;

Sequential make_model() {
  std::lock_guard<std::mutex> lock(seed_mu);
  torch::manual_seed(11);
  Sequential m(Linear(10, 17), Tanh(), Linear(17, 3));  // 241 parameters: not divisible by 2 or 4
  m->to(torch::kFloat64);
  return m;
}

std::shared_ptr<torch::optim::Optimizer> rmsprop(Sequential& m) {
  return std::make_shared<torch::optim::RMSprop>(
      m->parameters(), torch::optim::RMSpropOptions(1e-2).momentum(0.9).weight_decay(1e-3));
}

// torch::optim::Adagrad makes its state in its constructor; the engine makes it again for the
// partition (DeepSpeed runs a torch.optim.Adagrad client under ZeRO too).
std::shared_ptr<torch::optim::Optimizer> adagrad(Sequential& m) {
  return std::make_shared<torch::optim::Adagrad>(m->parameters(),
                                                 torch::optim::AdagradOptions(5e-2)
                                                     .lr_decay(1e-2)
                                                     .weight_decay(1e-3)
                                                     .initial_accumulator_value(0.1));
}

using MakeOptimizer = std::shared_ptr<torch::optim::Optimizer> (*)(Sequential&);

json config(int stage, int micro) {
  return {{"train_micro_batch_size_per_gpu", micro},
          {"gradient_clipping", 0.0},  // as the reference optimizer (DeepSpeed clips at 1.0)
          {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 100}}}};
}

// Step s, rank r of W: rows [s*8 + r*8/W, ...) of a fixed data set; 8 rows per step in all.
torch::Tensor xs() {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(3);
  return torch::randn({80, 10}, g, torch::kFloat64);
}
torch::Tensor ys() {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(4);
  return torch::randint(0, 3, {80}, g, torch::kLong);
}

template <class E>
void train(E& e, int rank, int world, int first, int steps) {
  static const auto x = xs(), y = ys();
  const int micro = 8 / world;
  for (int s = first; s < first + steps; ++s) {
    auto rows = int64_t(s) * 8 + int64_t(rank) * micro;
    e.backward(functional::cross_entropy(e(x.narrow(0, rows, micro)), y.narrow(0, rows, micro)));
    e.step();
  }
}

template <class E>
Params gathered(E& e) {
  if (e.config().zero.stage == 3) e.core().before_forward();
  Params out;
  for (auto& p : e.module()->parameters()) out.push_back(p.detach().clone());
  return out;
}

double max_rel(const Params& a, const Params& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, ((a[i] - b[i]).abs().max() / b[i].abs().max().clamp_min(1e-30)).item<double>());
  return m;
}

// One process, the whole batch, the optimizer over the module's own parameters.
Params reference(int steps, MakeOptimizer make_optimizer = rmsprop) {
  auto m = make_model();
  auto opt = make_optimizer(m);
  const auto x = xs(), y = ys();
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    functional::cross_entropy(m->forward(x.narrow(0, s * 8, 8)), y.narrow(0, s * 8, 8)).backward();
    opt->step();
  }
  Params out;
  for (auto& p : m->parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_steps_as_one_process(MakeOptimizer make_optimizer, double lr) {
  const auto want = reference(6, make_optimizer);
  for (int world : {2, 4}) {
    for (int stage : {0, 1, 2, 3}) {
      std::mutex mu;
      Params got;
      run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
        auto model = make_model();
        auto e =
            dtrain::zero::initialize(model, config(stage, 8 / world), {pg, make_optimizer(model)});
        train(e, pg->rank(), world, 0, 6);
        auto p = gathered(e);
        EXPECT_DOUBLE_EQ(e.get_lr(), lr);
        std::lock_guard<std::mutex> lock(mu);
        if (pg->rank() == 0) got = p;
      });
      EXPECT_LE(max_rel(got, want), 1e-9) << "world " << world << " stage " << stage;
    }
  }
}

TEST(ZeroClientOptimizer, StepsThePartitionsAsTheWholeModelOnOneProcess) {
  expect_steps_as_one_process(rmsprop, 1e-2);
}

TEST(ZeroClientOptimizer, AdagradWhoseConstructorMadeItsStateStepsAsOnOneProcess) {
  expect_steps_as_one_process(adagrad, 5e-2);
}

TEST(ZeroClientOptimizer, CheckpointResumesBitwiseAtTheSameWorldSize) {
  const auto dir = fs::temp_directory_path() / ("zero_client_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::mutex mu;
  Params straight, resumed;
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_model();
    auto e = dtrain::zero::initialize(model, config(2, 4), {pg, rmsprop(model)});
    train(e, pg->rank(), 2, 0, 3);
    e.save_checkpoint(dir.string());
    train(e, pg->rank(), 2, 3, 3);
    auto a = gathered(e);
    auto model2 = make_model();
    auto e2 = dtrain::zero::initialize(model2, config(2, 4), {pg, rmsprop(model2)});
    EXPECT_EQ(e2.load_checkpoint(dir.string()), "global_step3");
    train(e2, pg->rank(), 2, 3, 3);
    auto b = gathered(e2);
    std::lock_guard<std::mutex> lock(mu);
    if (pg->rank() == 0) straight = a, resumed = b;
  });
  ASSERT_EQ(straight.size(), resumed.size());
  for (size_t i = 0; i < straight.size(); ++i)
    EXPECT_TRUE(torch::equal(straight[i], resumed[i])) << i;
  // Another world size: the state is per partition and opaque, so it is refused by name.
  run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_model();
    auto e = dtrain::zero::initialize(model, config(2, 8), {pg, rmsprop(model)});
    try {
      e.load_checkpoint(dir.string());
      ADD_FAILURE() << "expected an error";
    } catch (const dtrain::Error& err) {
      EXPECT_NE(std::string(err.what()).find("was saved by 2 ranks with a client optimizer"),
                std::string::npos)
          << err.what();
    }
    dtrain::zero::LoadCheckpointOptions no_optimizer;
    no_optimizer.load_optimizer_states = false;
    EXPECT_EQ(e.load_checkpoint(dir.string(), "", no_optimizer), "global_step3");
  });
  fs::remove_all(dir);
}

// "Adagrad" by name (the config's optimizer, as DeepSpeed builds it): torch.optim.Adagrad's
// update, and with offload_optimizer DeepSpeed's CPU Adagrad (no lr_decay, no initial
// accumulator: the same formula otherwise), at every stage on 2 and 4 ranks as the
// torch::optim::Adagrad over the whole model on one process.
json adagrad_config(int stage, int micro, bool offload) {
  json c = config(stage, micro);
  json params = {{"lr", 5e-2}, {"weight_decay", 1e-3}};
  if (offload) {
    c["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  } else {
    params["lr_decay"] = 1e-2;
    params["initial_accumulator_value"] = 0.1;
  }
  c["optimizer"] = {{"type", "Adagrad"}, {"params", params}};
  return c;
}

std::shared_ptr<torch::optim::Optimizer> cpu_adagrad(Sequential& m) {
  return std::make_shared<torch::optim::Adagrad>(
      m->parameters(), torch::optim::AdagradOptions(5e-2).weight_decay(1e-3));
}

TEST(ZeroAdagradByName, StepsAsTorchsAdagradOnOneProcessAtEveryStage) {
  for (bool offload : {false, true}) {
    const auto want = reference(6, offload ? cpu_adagrad : adagrad);
    for (int world : {2, 4}) {
      for (int stage : {0, 1, 2, 3}) {
        if (offload && stage == 0) continue;  // refused: DeepSpeed's CPU optimizer needs ZeRO
        std::mutex mu;
        Params got;
        run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
          auto model = make_model();
          auto e = dtrain::zero::initialize(model, adagrad_config(stage, 8 / world, offload), {pg});
          train(e, pg->rank(), world, 0, 6);
          auto p = gathered(e);
          std::lock_guard<std::mutex> lock(mu);
          if (pg->rank() == 0) got = p;
        });
        EXPECT_LE(max_rel(got, want), 1e-9)
            << "world " << world << " stage " << stage << (offload ? " offload" : "");
      }
    }
  }
}

// Its state is torch's "sum" without offload_optimizer and the CPU Adagrad's "exp_avg_sq" with
// it (DeepSpeed's names): either loads into the other (the same running sum), and into another
// optimizer's state it is refused by name.
TEST(ZeroAdagradByName, CheckpointResumesWithAndWithoutOffload) {
  const auto dir = fs::temp_directory_path() / ("zero_adagrad_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // lr_decay and the initial accumulator are torch's only: without them both updates agree.
  auto plain = [](bool offload) {
    json c = adagrad_config(2, 4, offload);
    c["optimizer"]["params"] = {{"lr", 5e-2}, {"weight_decay", 1e-3}};
    return c;
  };
  std::mutex mu;
  Params straight, resumed;
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_model();
    auto e = dtrain::zero::initialize(model, plain(false), {pg});
    train(e, pg->rank(), 2, 0, 3);
    e.save_checkpoint(dir.string());
    train(e, pg->rank(), 2, 3, 3);
    auto a = gathered(e);
    auto model2 = make_model();
    auto e2 = dtrain::zero::initialize(model2, plain(true), {pg});
    EXPECT_EQ(e2.load_checkpoint(dir.string()), "global_step3");
    train(e2, pg->rank(), 2, 3, 3);
    auto b = gathered(e2);
    // An SGD with momentum keeps one state tensor too, but not a sum of squares.
    auto model3 = make_model();
    json sgd = config(2, 4);
    sgd["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}}}};
    auto e3 = dtrain::zero::initialize(model3, sgd, {pg});
    try {
      e3.load_checkpoint(dir.string());
      ADD_FAILURE() << "expected an error";
    } catch (const dtrain::Error& err) {
      EXPECT_NE(std::string(err.what())
                    .find("the checkpoint's optimizer keeps 'sum', this one "
                          "'momentum_buffer'"),
                std::string::npos)
          << err.what();
    }
    std::lock_guard<std::mutex> lock(mu);
    if (pg->rank() == 0) straight = a, resumed = b;
  });
  EXPECT_LE(max_rel(resumed, straight), 1e-12) << "resumed with offload_optimizer";
  fs::remove_all(dir);
}

TEST(ZeroClientOptimizer, MisuseIsNamed) {
  run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_model();
    auto with_optimizer = config(1, 8);
    with_optimizer["optimizer"] = {{"type", "Adam"}, {"params", {{"lr", 1e-3}}}};
    auto expect_error = [&](json cfg, std::shared_ptr<torch::optim::Optimizer> opt,
                            const std::string& what) {
      try {
        dtrain::zero::initialize(model, cfg, {pg, std::move(opt)});
        ADD_FAILURE() << "expected an error containing: " << what;
      } catch (const dtrain::UsageError& e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      }
    };
    expect_error(with_optimizer, rmsprop(model), "an optimizer was given twice");
    expect_error(config(1, 8), nullptr,
                 "or pass your own torch::optim optimizer as InitOptions::optimizer");
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{model[0]->parameters()});
    groups.emplace_back(std::vector<torch::Tensor>{model[2]->parameters()});
    expect_error(config(1, 8),
                 std::make_shared<torch::optim::SGD>(groups, torch::optim::SGDOptions(0.1)),
                 "has 2 parameter groups");
    // An Adagrad that already stepped is not fresh: its state is refused as any other's.
    auto stepped = adagrad(model);
    for (auto& p : model->parameters()) p.mutable_grad() = torch::ones_like(p);
    stepped->step();
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    expect_error(config(1, 8), stepped, "already holds state for 4 parameters");
  });
}

}  // namespace
