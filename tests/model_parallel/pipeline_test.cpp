// Pipeline schedules and their training: the order of operations per rank (against orders
// written out by hand, and against each schedule's rules over a recorded trace), the peak of
// live activations, and parameters after 10 SGD steps equal to the unpipelined model's.
// Ranks are threads with their own Gloo groups; activations and gradients move by send/recv.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "dtrain/error.h"
#include "dtrain/mesh.h"
#include "dtrain/pipeline.h"
#include "support/thread_group.h"

namespace dtrain {
namespace {

std::string joined(const std::vector<PipelineOp>& ops) {
  std::string s;
  for (const auto& op : ops) s += (s.empty() ? "" : " ") + to_string(op);
  return s;
}

void OrdersWrittenOutByHand() {
  // GPipe: all forwards, then all backwards.
  EXPECT_EQ(joined(schedule_ops(Schedule::kGPipe, 4, 2, 4)), "F0 F1 F2 F3 B0 B1 B2 B3");
  // 1F1B on 4 ranks, 8 micro-batches: rank 0 warms up with 3 forwards, rank 3 with none.
  EXPECT_EQ(joined(schedule_ops(Schedule::kOneFOneB, 4, 0, 8)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(joined(schedule_ops(Schedule::kOneFOneB, 4, 3, 8)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  EXPECT_EQ(joined(schedule_ops(Schedule::kOneFOneB, 4, 1, 1)), "F0 B0");
  // Interleaved, 2 ranks x 2 chunks, 4 micro-batches, rank 0: Megatron's warm-up is
  // (P-p-1)*2 + (V-1)*P = 4 forwards (micro-batches 0,1 through chunk 0, then chunk 1).
  EXPECT_EQ(joined(schedule_ops(Schedule::kInterleavedOneFOneB, 2, 0, 4, 2)),
            "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3");
}

void InvalidCombinationsAreUsageErrors() {
  EXPECT_THROW(schedule_ops(Schedule::kInterleavedOneFOneB, 4, 0, 6, 2), UsageError);  // M % P != 0
  EXPECT_THROW(schedule_ops(Schedule::kOneFOneB, 2, 0, 4, 2),
               UsageError);  // V > 1 needs interleaving
  EXPECT_THROW(schedule_ops(Schedule::kGPipe, 2, 2, 4), UsageError);
  EXPECT_THROW(parse_schedule("zb-v"), UsageError);
  EXPECT_EQ(parse_schedule("one_f_one_b"), Schedule::kOneFOneB);
}

void SplitByLayersAndByParameters();

TEST(PipelineSchedule, OrdersAndSplitting) {
  OrdersWrittenOutByHand();
  InvalidCombinationsAreUsageErrors();
  SplitByLayersAndByParameters();
}

void SplitByLayersAndByParameters() {
  torch::nn::Sequential m(torch::nn::Linear(64, 64), torch::nn::Linear(4, 4),
                          torch::nn::Linear(4, 4), torch::nn::Linear(4, 4),
                          torch::nn::Linear(4, 4));
  auto by_layers = split_sequential(m, 2);
  ASSERT_EQ(by_layers.size(), 2u);
  EXPECT_EQ(by_layers[0]->size(), 3u);
  EXPECT_EQ(by_layers[1]->size(), 2u);
  auto by_params = split_sequential(m, 2, SplitBy::kParameters);
  EXPECT_EQ(by_params[0]->size(), 1u);  // the 64x64 layer alone outweighs the rest
  EXPECT_EQ(by_params[1]->size(), 4u);
  // The stages share the model's layers.
  EXPECT_EQ(by_params[0]->ptr(0).get(), m->ptr(0).get());
  EXPECT_THROW(split_sequential(m, 6), UsageError);
}

// A model of 8 children (so 4 ranks x 2 chunks get one each).
torch::nn::Sequential make_model() {
  using namespace torch::nn;
  return Sequential(Linear(6, 16), Tanh(), Linear(16, 16), Tanh(), Linear(16, 16), Tanh(),
                    Linear(16, 8), Linear(8, 3));
}

torch::nn::Sequential deep_copy(const torch::nn::Sequential& m) {
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(m->clone()));
}

torch::Tensor mse(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::mse_loss(out, target);
}

struct Config {
  Schedule schedule;
  int micro_batches;
  int virtual_stages;
};

// Checks a 1F1B-family trace on rank p: every micro-batch's backward follows its forward, and
// after the warm-up forwards the rank never runs two forwards without a backward between them
// while backwards are pending.
void expect_one_f_one_b_shape(const std::vector<PipelineOp>& ops, int P, int p, int M) {
  const int warmup = std::min(P - 1 - p, M);
  int i = 0;
  for (; i < warmup; ++i)
    EXPECT_EQ(ops[i].kind, PipelineOp::kForward) << "warm-up op " << i << " on rank " << p;
  // Steady state: F, B, F, B, ... for M - warmup pairs; then the cool-down backwards.
  for (int k = 0; k < M - warmup; ++k) {
    EXPECT_EQ(ops[i++].kind, PipelineOp::kForward) << "steady pair " << k << " on rank " << p;
    EXPECT_EQ(ops[i++].kind, PipelineOp::kBackward) << "steady pair " << k << " on rank " << p;
  }
  for (; i < 2 * M; ++i)
    EXPECT_EQ(ops[i].kind, PipelineOp::kBackward) << "cool-down op " << i << " on rank " << p;
}

void check_trace(const Config& c, const Pipeline& pipe, int P, int p) {
  const int M = c.micro_batches, V = c.virtual_stages;
  const auto& ops = pipe.last_trace();
  ASSERT_EQ(static_cast<int>(ops.size()), 2 * M * V);
  std::map<std::pair<int, int>, int> forward_at;
  for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
    const auto key = std::make_pair(ops[i].chunk, ops[i].micro_batch);
    if (ops[i].kind == PipelineOp::kForward) {
      forward_at[key] = i;
    } else {
      ASSERT_TRUE(forward_at.count(key))
          << to_string(ops[i]) << " before its forward on rank " << p;
    }
  }
  if (c.schedule == Schedule::kGPipe) {
    for (int i = 0; i < M; ++i) EXPECT_EQ(ops[i].kind, PipelineOp::kForward);
    EXPECT_EQ(pipe.peak_live_activations(), M) << "GPipe keeps every micro-batch's activations";
  } else if (c.schedule == Schedule::kOneFOneB) {
    expect_one_f_one_b_shape(ops, P, p, M);
    EXPECT_LE(pipe.peak_live_activations(), P);
    EXPECT_EQ(pipe.peak_live_activations(), std::min(P - p, M));
  } else {
    // Megatron's interleaved bound: warm-up forwards plus one.
    const int warmup = (M == P) ? M * V : std::min(M * V, (P - p - 1) * 2 + (V - 1) * P);
    EXPECT_LE(pipe.peak_live_activations(), std::min(M * V, warmup + 1));
  }
}

// Trains the pipelined model and the plain one for 10 steps on the same batches, for each
// config, on P ranks; compares every parameter and the loss. Steps 4 and 7 have half a batch,
// so the messages between stages change shape twice (the pipeline receives ahead into buffers
// of the previous step's shapes and must notice).
void run_parity(int P, const std::vector<Config>& configs) {
  torch::set_num_threads(1);
  constexpr int kSteps = 10, kBatch = 16;
  torch::manual_seed(7);
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s < kSteps; ++s) {
    const int64_t b = (s == 4 || s == 7) ? kBatch / 2 : kBatch;
    xs.push_back(torch::randn({b, 6}));
    ys.push_back(torch::randn({b, 3}));
  }
  torch::nn::Sequential initial = make_model();
  // The reference: the whole model, full batches, same SGD.
  torch::nn::Sequential ref = deep_copy(initial);
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<double> ref_loss;
  for (int s = 0; s < kSteps; ++s) {
    ref_opt.zero_grad();
    torch::Tensor loss = mse(ref->forward(xs[s]), ys[s]);
    loss.backward();
    ref_opt.step();
    ref_loss.push_back(loss.item<double>());
  }
  // Every rank's copy of the initial model, made here: torch's RNG is per process.
  std::vector<std::vector<torch::nn::Sequential>> copies(configs.size());
  for (size_t k = 0; k < configs.size(); ++k) {
    for (int r = 0; r < P; ++r) copies[k].push_back(deep_copy(initial));
  }
  test::run_ranks(P, [&](std::shared_ptr<ProcessGroup> g) {
    const int p = g->rank();
    for (size_t k = 0; k < configs.size(); ++k) {
      const Config& c = configs[k];
      SCOPED_TRACE("P=" + std::to_string(P) + " rank " + std::to_string(p) + " " +
                   schedule_name(c.schedule) + " M=" + std::to_string(c.micro_batches) +
                   " V=" + std::to_string(c.virtual_stages));
      const int S = P * c.virtual_stages;
      Pipeline pipe(split_sequential(copies[k][p], S), g,
                    {c.schedule, c.micro_batches, c.virtual_stages});
      torch::optim::SGD opt(pipe.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      for (int s = 0; s < kSteps; ++s) {
        opt.zero_grad();
        torch::Tensor loss = pipe.train_step(xs[s], ys[s], mse);
        opt.step();
        if (pipe.is_last_stage()) {
          ASSERT_TRUE(loss.defined());
          EXPECT_NEAR(loss.item<double>(), ref_loss[s], 1e-5 * std::max(1.0, ref_loss[s]))
              << "step " << s;
        } else {
          EXPECT_FALSE(loss.defined());
        }
      }
      check_trace(c, pipe, P, p);
      // This rank's chunks against the same layers of the reference.
      auto ref_stages = split_sequential(ref, S);
      for (int chunk = 0; chunk < c.virtual_stages; ++chunk) {
        auto got = pipe.local_stages()[chunk]->parameters();
        auto want = ref_stages[chunk * P + p]->parameters();
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-5, 1e-7))
              << "chunk " << chunk << " parameter " << i << ": max |diff| "
              << (got[i] - want[i]).abs().max().item<double>();
        }
      }
    }
    g->barrier();
  });
}

std::vector<Config> all_configs() {
  std::vector<Config> out;
  for (int m : {1, 4, 8}) {
    out.push_back({Schedule::kGPipe, m, 1});
    out.push_back({Schedule::kOneFOneB, m, 1});
  }
  out.push_back({Schedule::kInterleavedOneFOneB, 4, 2});
  out.push_back({Schedule::kInterleavedOneFOneB, 8, 2});
  return out;
}

void BadBatchesAndStageCountsAreUsageErrors();

TEST(PipelineTraining, TwoStagesMatchTheUnpipelinedModel) {
  run_parity(2, all_configs());
  BadBatchesAndStageCountsAreUsageErrors();
}
TEST(PipelineTraining, FourStagesMatchTheUnpipelinedModel) { run_parity(4, all_configs()); }

// Data x pipeline parallel (dp = 2, pp = 2 on 4 ranks): each replica trains its half of every
// batch and PipelineOptions::data_parallel (DDP over the mesh's dp group) averages the chunks'
// gradients, so after 10 steps every rank's layers equal the unpipelined model's trained on
// the full batches. Without the averaging the replicas would each follow their half.
TEST(PipelineTraining, DataParallelReplicasWithDdpMatchTheUnpipelinedModel) {
  torch::set_num_threads(1);
  constexpr int D = 2, P = 2, kSteps = 10, kBatch = 16;
  const std::vector<Config> configs = {{Schedule::kOneFOneB, 4, 1},
                                       {Schedule::kGPipe, 2, 1},
                                       {Schedule::kInterleavedOneFOneB, 2, 2}};
  torch::manual_seed(11);
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s < kSteps; ++s) {
    xs.push_back(torch::randn({kBatch, 6}));
    ys.push_back(torch::randn({kBatch, 3}));
  }
  torch::nn::Sequential initial = make_model();
  torch::nn::Sequential ref = deep_copy(initial);
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < kSteps; ++s) {
    ref_opt.zero_grad();
    mse(ref->forward(xs[s]), ys[s]).backward();
    ref_opt.step();
  }
  std::vector<std::vector<torch::nn::Sequential>> copies(configs.size());
  for (size_t k = 0; k < configs.size(); ++k) {
    for (int r = 0; r < D * P; ++r) copies[k].push_back(deep_copy(initial));
  }
  test::run_ranks(D * P, [&](std::shared_ptr<ProcessGroup> g) {
    DeviceMesh mesh({{"dp", D}, {"pp", P}}, g);
    const int d = mesh.coordinate("dp"), p = mesh.coordinate("pp");
    for (size_t k = 0; k < configs.size(); ++k) {
      const Config& c = configs[k];
      SCOPED_TRACE("dp rank " + std::to_string(d) + " stage " + std::to_string(p) + " " +
                   schedule_name(c.schedule) + " M=" + std::to_string(c.micro_batches) +
                   " V=" + std::to_string(c.virtual_stages));
      const int S = P * c.virtual_stages;
      PipelineOptions o{c.schedule, c.micro_batches, c.virtual_stages};
      o.data_parallel = DDPOptions{};  // the mesh's dp group
      Pipeline pipe(split_sequential(copies[k][g->rank()], S), mesh, o);
      EXPECT_TRUE(pipe.data_parallel());
      torch::optim::SGD opt(pipe.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      const int64_t half = kBatch / D;
      for (int s = 0; s < kSteps; ++s) {
        opt.zero_grad();
        pipe.train_step(xs[s].narrow(0, d * half, half), ys[s].narrow(0, d * half, half), mse);
        opt.step();
      }
      auto ref_stages = split_sequential(ref, S);
      for (int chunk = 0; chunk < c.virtual_stages; ++chunk) {
        auto got = pipe.local_stages()[chunk]->parameters();
        auto want = ref_stages[chunk * P + p]->parameters();
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-5, 1e-6))
              << "chunk " << chunk << " parameter " << i << ": max |diff| "
              << (got[i] - want[i]).abs().max().item<double>();
        }
      }
    }
    // The group constructor has no mesh to take the dp group from.
    PipelineOptions no_group;
    no_group.data_parallel = DDPOptions{};
    EXPECT_THROW(Pipeline(split_sequential(copies[0][g->rank()], P), mesh.group("pp"), no_group),
                 UsageError);
    g->barrier();
  });
}

void BadBatchesAndStageCountsAreUsageErrors() {
  test::run_ranks(2, [](std::shared_ptr<ProcessGroup> g) {
    torch::nn::Sequential m = make_model();
    EXPECT_THROW(Pipeline(split_sequential(m, 3), g), UsageError);  // 3 stages for 2 ranks
    Pipeline pipe(split_sequential(m, 2), g, {Schedule::kGPipe, 4, 1});
    // Batch 6 does not split into 4 micro-batches: every rank rejects it before sending.
    EXPECT_THROW(pipe.train_step(torch::randn({6, 6}), torch::randn({6, 3}), mse), UsageError);
    g->barrier();
  });
}

}  // namespace
}  // namespace dtrain
