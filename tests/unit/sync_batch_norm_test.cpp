// dtrain::SyncBatchNorm and convert_sync_batchnorm.
//
// The distributed property: ranks run as threads of this process, each with its own
// c10d::ProcessGroupGloo over one shared HashStore, each given a slice of a global batch
// (slices of unequal size, one of them empty in one test). Whatever the split, the ranks'
// outputs and input gradients, concatenated, and their running statistics must equal a single
// torch::nn::BatchNorm1d/2d run on the whole batch; their weight/bias gradients, SUMMED over
// the ranks, must equal the BatchNorm's. (The sum is the gradient of the sum of the ranks'
// losses; DDP averages instead, i.e. divides that by the world size, as for any parameter.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/c10d_compat.h"
#include "comm/gloo/gloo.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"
#include "dtrain/sync_batch_norm.h"

namespace dtrain {
namespace {

// Runs fn(rank, group) on `world_size` threads and rethrows the first rank's failure.
void run_ranks(int world_size, const std::function<void(int, std::shared_ptr<ProcessGroup>)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        // Short timeout: a rank left waiting in a collective fails the test instead of
        // hanging ctest.
        auto gloo = comm::make_gloo(store, rank, world_size, std::chrono::seconds(10), "127.0.0.1");
        fn(rank, std::make_shared<ProcessGroup>(
                     store, comm::as_group(gloo, store, rank, world_size, true), "gloo"));
      } catch (...) {
        errors[static_cast<size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// max|actual - expected| <= rtol * max|expected|: relative to the tensor's scale, so entries
// that happen to be near zero do not demand more than the arithmetic can give.
void expect_close(const torch::Tensor& actual, const torch::Tensor& expected,
                  const std::string& what, double rtol = 1e-5) {
  ASSERT_TRUE(actual.defined()) << what << ": undefined";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  if (expected.numel() == 0) return;
  const auto a = actual.to(torch::kDouble);
  const auto e = expected.to(torch::kDouble);
  const double scale = std::max(e.abs().max().item<double>(), 1e-30);
  const double diff = (a - e).abs().max().item<double>();
  EXPECT_LE(diff, rtol * scale) << what << ": max abs diff " << diff << " vs scale " << scale;
}

torch::Tensor grad_or_zeros(const torch::Tensor& t) {
  if (!t.defined()) return {};
  return t.grad().defined() ? t.grad().clone() : torch::zeros_like(t);
}

struct StepResult {
  torch::Tensor output, grad_input, grad_weight, grad_bias;
};
struct RunResult {
  std::vector<StepResult> steps;
  torch::Tensor running_mean, running_var, num_batches_tracked;
};

// One training step per input: forward, backward of sum(output * weighting), record, clear.
// `Holder` is torch::nn::BatchNorm1d/2d or dtrain::SyncBatchNorm (same member names).
template <typename Holder>
RunResult train_steps(Holder& m, const std::vector<torch::Tensor>& inputs,
                      const std::vector<torch::Tensor>& weightings) {
  RunResult r;
  for (size_t s = 0; s < inputs.size(); ++s) {
    auto x = inputs[s].clone().requires_grad_(true);
    auto out = m->forward(x);
    (out * weightings[s]).sum().backward();
    r.steps.push_back(
        {out.detach().clone(), grad_or_zeros(x), grad_or_zeros(m->weight), grad_or_zeros(m->bias)});
    m->zero_grad();
  }
  auto copy = [](const torch::Tensor& t) { return t.defined() ? t.clone() : torch::Tensor(); };
  r.running_mean = copy(m->running_mean);
  r.running_var = copy(m->running_var);
  r.num_batches_tracked = copy(m->num_batches_tracked);
  return r;
}

template <typename Holder>
void set_affine(Holder& m, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!m->weight.defined()) return;
  torch::NoGradGuard no_grad;
  m->weight.copy_(weight);
  m->bias.copy_(bias);
}

struct Case {
  std::vector<int64_t> batch_sizes;    // Per rank; their sum is the global batch.
  std::vector<int64_t> feature_shape;  // {C}, {C, L} or {C, H, W}.
  std::optional<double> momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
  int steps = 2;
  torch::Dtype dtype = torch::kFloat;
  double rtol = 1e-5;
};

torch::nn::BatchNormOptions bn_options(const Case& c) {
  c10::optional<double> momentum = c.momentum ? c10::optional<double>(*c.momentum) : c10::nullopt;
  return torch::nn::BatchNormOptions(c.feature_shape[0])
      .momentum(momentum)
      .affine(c.affine)
      .track_running_stats(c.track_running_stats);
}

SyncBatchNormOptions sync_options(const Case& c, std::shared_ptr<ProcessGroup> group) {
  SyncBatchNormOptions o(c.feature_shape[0]);
  o.momentum = c.momentum;
  o.affine = c.affine;
  o.track_running_stats = c.track_running_stats;
  o.group = std::move(group);
  return o;
}

// Global data: inputs with a mean far from zero (where a naive float32 sum-of-squares
// variance would lose digits), random loss weightings and affine parameters.
struct Data {
  std::vector<torch::Tensor> inputs, weightings;
  torch::Tensor weight, bias;
};

Data make_data(const Case& c) {
  int64_t total = 0;
  for (auto n : c.batch_sizes) total += n;
  std::vector<int64_t> shape{total};
  shape.insert(shape.end(), c.feature_shape.begin(), c.feature_shape.end());
  auto opts = torch::TensorOptions().dtype(c.dtype);
  Data d;
  for (int s = 0; s < c.steps; ++s) {
    d.inputs.push_back(torch::randn(shape, opts) * 2 + 3 + s);
    d.weightings.push_back(torch::randn(shape, opts));
  }
  d.weight = torch::rand({c.feature_shape[0]}, opts) + 0.5;
  d.bias = torch::randn({c.feature_shape[0]}, opts);
  return d;
}

RunResult run_reference(const Case& c, const Data& d) {
  if (c.feature_shape.size() == 3) {
    torch::nn::BatchNorm2d bn(bn_options(c));
    bn->to(c.dtype);
    set_affine(bn, d.weight, d.bias);
    return train_steps(bn, d.inputs, d.weightings);
  }
  torch::nn::BatchNorm1d bn(bn_options(c));
  bn->to(c.dtype);
  set_affine(bn, d.weight, d.bias);
  return train_steps(bn, d.inputs, d.weightings);
}

// Each rank trains its own SyncBatchNorm on its slice of every step's batch.
std::vector<RunResult> run_sync(const Case& c, const Data& d) {
  const int world_size = static_cast<int>(c.batch_sizes.size());
  std::vector<RunResult> results(c.batch_sizes.size());
  run_ranks(world_size, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    int64_t offset = 0;
    for (int r = 0; r < rank; ++r) offset += c.batch_sizes[static_cast<size_t>(r)];
    const int64_t n = c.batch_sizes[static_cast<size_t>(rank)];
    std::vector<torch::Tensor> inputs, weightings;
    for (int s = 0; s < c.steps; ++s) {
      inputs.push_back(d.inputs[static_cast<size_t>(s)].narrow(0, offset, n));
      weightings.push_back(d.weightings[static_cast<size_t>(s)].narrow(0, offset, n));
    }
    SyncBatchNorm sbn(sync_options(c, group));
    sbn->to(c.dtype);
    set_affine(sbn, d.weight, d.bias);
    results[static_cast<size_t>(rank)] = train_steps(sbn, inputs, weightings);
  });
  return results;
}

void expect_sync_matches_reference(const Case& c) {
  const Data d = make_data(c);
  const RunResult ref = run_reference(c, d);
  const std::vector<RunResult> ranks = run_sync(c, d);
  for (int s = 0; s < c.steps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    std::vector<torch::Tensor> outputs, grad_inputs;
    torch::Tensor grad_weight, grad_bias;
    for (const auto& r : ranks) {
      const auto& st = r.steps[static_cast<size_t>(s)];
      outputs.push_back(st.output);
      grad_inputs.push_back(st.grad_input);
      if (c.affine) {
        grad_weight = grad_weight.defined() ? grad_weight + st.grad_weight : st.grad_weight;
        grad_bias = grad_bias.defined() ? grad_bias + st.grad_bias : st.grad_bias;
      }
    }
    const auto& expected = ref.steps[static_cast<size_t>(s)];
    expect_close(torch::cat(outputs), expected.output, "output", c.rtol);
    expect_close(torch::cat(grad_inputs), expected.grad_input, "input gradient", c.rtol);
    if (c.affine) {
      expect_close(grad_weight, expected.grad_weight, "weight gradient summed over ranks", c.rtol);
      expect_close(grad_bias, expected.grad_bias, "bias gradient summed over ranks", c.rtol);
    }
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    if (!c.track_running_stats) {
      EXPECT_FALSE(ranks[r].running_mean.defined());
      EXPECT_FALSE(ranks[r].running_var.defined());
      continue;
    }
    expect_close(ranks[r].running_mean, ref.running_mean, "running_mean", c.rtol);
    expect_close(ranks[r].running_var, ref.running_var, "running_var", c.rtol);
    EXPECT_EQ(ranks[r].num_batches_tracked.item<int64_t>(),
              ref.num_batches_tracked.item<int64_t>());
  }
}

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "world_size " << c.batch_sizes.size() << ", batches";
  for (auto n : c.batch_sizes) s << ' ' << n;
  s << ", features";
  for (auto f : c.feature_shape) s << ' ' << f;
  s << ", momentum " << (c.momentum ? std::to_string(*c.momentum) : "nullopt") << ", affine "
    << c.affine << ", track_running_stats " << c.track_running_stats << ", "
    << c10::toString(c.dtype);
  return s.str();
}

// One test for all shapes: each ctest entry is a process paying libtorch's start-up.
TEST(SyncBatchNormTest, MatchesBatchNorm1dAnd2dOnTheGlobalBatch) {
  torch::manual_seed(1);
  const std::vector<Case> cases{
      Case{{3, 5}, {4}},       Case{{2, 4, 1}, {4}},        // BatchNorm1d, (N, C)
      Case{{2, 3}, {3, 7}},    Case{{1, 3, 2}, {3, 7}},     // BatchNorm1d, (N, C, L)
      Case{{2, 3}, {3, 4, 5}}, Case{{1, 2, 3}, {3, 4, 5}},  // BatchNorm2d, (N, C, H, W)
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(describe(c));
    expect_sync_matches_reference(c);
  }
}

TEST(SyncBatchNormTest, MatchesWithNulloptMomentumNoAffineAnEmptyRankOrFloat64) {
  torch::manual_seed(4);
  std::vector<Case> cases;
  // momentum nullopt: the running stats are the cumulative average over the steps.
  for (auto sizes : {std::vector<int64_t>{4, 2}, std::vector<int64_t>{3, 1, 2}}) {
    Case c{sizes, {2, 3, 3}};
    c.momentum = std::nullopt;
    c.steps = 3;
    cases.push_back(c);
  }
  Case plain{{3, 4}, {3, 5}};
  plain.affine = false;
  plain.track_running_stats = false;
  cases.push_back(plain);
  // If the empty rank skipped a collective, the others would time out instead of matching.
  cases.push_back(Case{{3, 0, 4}, {4}});
  Case f64{{2, 5}, {3, 2, 2}};
  f64.dtype = torch::kDouble;
  f64.rtol = 1e-10;
  cases.push_back(f64);
  for (const auto& c : cases) {
    SCOPED_TRACE(describe(c));
    expect_sync_matches_reference(c);
  }
}

TEST(SyncBatchNormTest, EvalModeNormalisesLocallyWithoutCommunicating) {
  torch::manual_seed(8);
  for (bool track : {true, false}) {
    SCOPED_TRACE(track ? "with running stats" : "without running stats");
    Case c{{2, 3}, {3, 4, 4}};
    c.track_running_stats = track;
    c.steps = 1;
    const Data d = make_data(c);
    const auto eval_input = torch::randn({2, 3, 4, 4}) + 1;

    torch::nn::BatchNorm2d bn(bn_options(c));
    set_affine(bn, d.weight, d.bias);
    train_steps(bn, d.inputs, d.weightings);
    bn->eval();
    const auto expected = bn->forward(eval_input);

    torch::Tensor actual;
    run_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
      SyncBatchNorm sbn(sync_options(c, group));
      set_affine(sbn, d.weight, d.bias);
      const int64_t offset = rank == 0 ? 0 : 2;
      auto x = d.inputs[0].narrow(0, offset, c.batch_sizes[static_cast<size_t>(rank)]);
      sbn->forward(x).sum().backward();
      // Only rank 0 runs in eval mode: a collective there would wait for rank 1 until the
      // 10 s timeout and throw.
      if (rank == 0) {
        sbn->eval();
        actual = sbn->forward(eval_input);
      }
    });
    expect_close(actual, expected, "eval output");
  }
}

// With no process group at all (no default group exists in this test program) or a group of
// one, SyncBatchNorm is torch::nn::BatchNorm: forward, backward and running stats.
TEST(SyncBatchNormTest, EqualsBatchNormWithoutAGroupOrWithAGroupOfOne) {
  torch::manual_seed(9);
  ASSERT_THROW(default_group(), UsageError);
  std::vector<Case> cases{Case{{6}, {4}}, Case{{5}, {3, 6}}, Case{{4}, {3, 5, 5}}};
  Case nullopt_momentum{{4}, {2, 3, 3}};
  nullopt_momentum.momentum = std::nullopt;
  cases.push_back(nullopt_momentum);
  Case plain{{5}, {3, 4}};
  plain.affine = false;
  plain.track_running_stats = false;
  cases.push_back(plain);
  for (auto& c : cases) {
    c.steps = 3;
    c.rtol = 1e-6;
    SCOPED_TRACE(describe(c));
    const Data d = make_data(c);
    const RunResult ref = run_reference(c, d);
    std::vector<RunResult> runs;
    {
      SyncBatchNorm sbn(sync_options(c, nullptr));
      set_affine(sbn, d.weight, d.bias);
      runs.push_back(train_steps(sbn, d.inputs, d.weightings));
    }
    runs.push_back(run_sync(c, d)[0]);  // A Gloo group of one.
    for (const auto& run : runs) {
      for (size_t s = 0; s < run.steps.size(); ++s) {
        expect_close(run.steps[s].output, ref.steps[s].output, "output", c.rtol);
        expect_close(run.steps[s].grad_input, ref.steps[s].grad_input, "input gradient", c.rtol);
        if (c.affine) {
          expect_close(run.steps[s].grad_weight, ref.steps[s].grad_weight, "weight gradient",
                       c.rtol);
          expect_close(run.steps[s].grad_bias, ref.steps[s].grad_bias, "bias gradient", c.rtol);
        }
      }
      if (c.track_running_stats) {
        expect_close(run.running_mean, ref.running_mean, "running_mean", c.rtol);
        expect_close(run.running_var, ref.running_var, "running_var", c.rtol);
        EXPECT_EQ(run.num_batches_tracked.item<int64_t>(), 3);
      }
    }
  }
}

TEST(SyncBatchNormTest, RejectsInputsOfTheWrongRankOrChannelCount) {
  SyncBatchNorm sbn(3);
  auto message_of = [&](const torch::Tensor& x) -> std::string {
    try {
      sbn->forward(x);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(no UsageError)";
  };
  EXPECT_NE(message_of(torch::zeros({4})).find("[4]"), std::string::npos)
      << message_of(torch::zeros({4}));
  const auto five_d = message_of(torch::zeros({2, 3, 4, 4, 4}));
  EXPECT_NE(five_d.find("[2, 3, 4, 4, 4]"), std::string::npos) << five_d;
  const auto channels = message_of(torch::zeros({2, 5, 4}));
  EXPECT_NE(channels.find("[2, 5, 4]"), std::string::npos) << channels;
  EXPECT_NE(channels.find("3 channels"), std::string::npos) << channels;
  EXPECT_THROW(SyncBatchNorm{SyncBatchNormOptions(0)}, UsageError);
}

TEST(SyncBatchNormTest, HasBatchNormsParameterAndBufferNamesAndClones) {
  torch::nn::BatchNorm2d bn(5);
  SyncBatchNorm sbn(5);
  EXPECT_EQ(sbn->named_parameters().keys(), bn->named_parameters().keys());
  EXPECT_EQ(sbn->named_buffers().keys(), bn->named_buffers().keys());
  for (const auto& p : bn->named_parameters())
    expect_close(sbn->named_parameters()[p.key()], p.value(), p.key());
  for (const auto& b : bn->named_buffers()) {
    EXPECT_TRUE(torch::equal(sbn->named_buffers()[b.key()], b.value())) << b.key();
  }

  // clone() gives independent tensors with the same values and options.
  {
    torch::NoGradGuard no_grad;
    sbn->weight.fill_(2);
  }
  auto copy = std::dynamic_pointer_cast<SyncBatchNormImpl>(sbn->clone());
  ASSERT_TRUE(copy);
  EXPECT_TRUE(torch::equal(copy->weight, sbn->weight));
  {
    torch::NoGradGuard no_grad;
    copy->weight.fill_(3);
  }
  EXPECT_EQ(sbn->weight[0].item<float>(), 2.0f);
  std::ostringstream printed;
  sbn->pretty_print(printed);
  EXPECT_EQ(
      printed.str(),
      "dtrain::SyncBatchNorm(5, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true)");
}

// ---------------------------------------------------------------------------------------
// convert_sync_batchnorm

// Runs a few training steps so the running statistics and num_batches_tracked are not the
// initial ones, then gives the affine parameters random values.
void train_a_little(torch::nn::Module& model, const std::function<torch::Tensor()>& forward) {
  model.train();
  for (int i = 0; i < 3; ++i) forward();
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) p.copy_(torch::randn_like(p));
}

// Deep copies of a module's parameters and buffers, to compare against after conversion.
struct State {
  torch::OrderedDict<std::string, torch::Tensor> parameters, buffers;
};
State snapshot(const torch::nn::Module& m) {
  State s;
  for (const auto& p : m.named_parameters()) {
    s.parameters.insert(p.key(),
                        p.value().detach().clone().requires_grad_(p.value().requires_grad()));
  }
  for (const auto& b : m.named_buffers()) s.buffers.insert(b.key(), b.value().clone());
  return s;
}

void expect_same_state(const torch::nn::Module& actual, const State& expected) {
  const auto ap = actual.named_parameters();
  const auto& ep = expected.parameters;
  EXPECT_EQ(ap.keys(), ep.keys());
  for (const auto& p : ep) {
    ASSERT_TRUE(ap.contains(p.key())) << p.key();
    EXPECT_TRUE(torch::equal(ap[p.key()], p.value())) << p.key();
    EXPECT_EQ(ap[p.key()].requires_grad(), p.value().requires_grad()) << p.key();
  }
  const auto ab = actual.named_buffers();
  const auto& eb = expected.buffers;
  EXPECT_EQ(ab.keys(), eb.keys());
  for (const auto& b : eb) {
    ASSERT_TRUE(ab.contains(b.key())) << b.key();
    EXPECT_TRUE(torch::equal(ab[b.key()], b.value())) << b.key();
    EXPECT_EQ(ab[b.key()].scalar_type(), b.value().scalar_type()) << b.key();
  }
}

// C++ cannot put a plain nn::Sequential inside another (its forward is a template);
// the usual way is a subclass with a typed forward, which convert_sync_batchnorm treats as
// the Sequential it is.
struct NestedImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return SequentialImpl::forward(std::move(x)); }
};
TORCH_MODULE(Nested);

torch::nn::Sequential make_nested_model() {
  Nested head(
      torch::nn::Flatten(), torch::nn::Linear(4 * 4 * 4, 6),
      torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(6).momentum(c10::nullopt).eps(1e-3)));
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)),
                               torch::nn::BatchNorm2d(4), torch::nn::ReLU(), head);
}

void load_state(torch::nn::Module& dst, const State& src) {
  torch::NoGradGuard no_grad;
  for (auto& p : dst.named_parameters()) p.value().copy_(src.parameters[p.key()]);
  for (auto& b : dst.named_buffers()) b.value().copy_(src.buffers[b.key()]);
}

TEST(ConvertSyncBatchnormTest, ReplacesBatchNormsInANestedSequential) {
  torch::manual_seed(10);
  torch::nn::Sequential model = make_nested_model();
  auto head = model[3]->as<NestedImpl>();
  const auto input = torch::randn({5, 3, 6, 6});
  train_a_little(*model, [&] { return model->forward(input); });
  model->eval();
  const auto expected = model->forward(input);
  const State before = snapshot(*model);
  // An unconverted twin with the same state, for the training-mode comparison below.
  torch::nn::Sequential original = make_nested_model();
  load_state(*original, before);

  torch::nn::Sequential converted = convert_sync_batchnorm(model, /*group=*/nullptr);
  EXPECT_EQ(converted.ptr(), model.ptr()) << "the Sequential is converted in place, as in PyTorch";

  auto bn2d = converted->ptr(1)->as<SyncBatchNormImpl>();
  ASSERT_NE(bn2d, nullptr) << "model[1] is " << converted->ptr(1)->name();
  ASSERT_EQ(converted->ptr(3)->as<NestedImpl>(), head)
      << "the nested Sequential is the same object";
  auto bn1d = head->ptr(2)->as<SyncBatchNormImpl>();
  ASSERT_NE(bn1d, nullptr) << "model[3][2] is " << head->ptr(2)->name();
  EXPECT_EQ(model->named_modules()["3.2"]->as<SyncBatchNormImpl>(), bn1d)
      << "registered child replaced too";
  EXPECT_EQ(bn2d->options.num_features, 4);
  EXPECT_EQ(bn1d->options.num_features, 6);
  EXPECT_DOUBLE_EQ(bn1d->options.eps, 1e-3);
  EXPECT_FALSE(bn1d->options.momentum.has_value());
  EXPECT_TRUE(bn2d->options.momentum.has_value());
  EXPECT_FALSE(bn2d->is_training()) << "the train/eval mode is kept";
  EXPECT_EQ(bn1d->num_batches_tracked.item<int64_t>(), 3);
  expect_same_state(*converted, before);

  expect_close(converted->forward(input), expected, "eval output after conversion", 1e-6);
  // Still trainable, and with no process group it trains exactly like the original.
  converted->train();
  original->train();
  expect_close(converted->forward(input), original->forward(input), "train output after conversion",
               1e-6);
  expect_close(
      bn1d->running_mean,
      original[3]->as<NestedImpl>()->ptr(2)->as<torch::nn::BatchNorm1dImpl>()->running_mean,
      "running_mean after a training step", 1e-6);
}

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn(conv(x)); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool with_block) {
    features = register_module(
        "features", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 1)),
                                          torch::nn::BatchNorm2d(4), torch::nn::ReLU()));
    if (with_block) features->push_back(Block());
    heads = register_module(
        "heads", torch::nn::ModuleList(torch::nn::BatchNorm1d(4), torch::nn::Linear(4, 2)));
    extras = register_module(
        "extras",
        torch::nn::ModuleDict(std::vector<std::pair<std::string, std::shared_ptr<Module>>>{
            {"norm", torch::nn::BatchNorm1d(4).ptr()}, {"act", torch::nn::ReLU().ptr()}}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = features->forward(x).mean({2, 3});
    h = apply_norm(extras["norm"], h);
    return heads[1]->as<torch::nn::LinearImpl>()->forward(apply_norm(heads->ptr(0), h));
  }
  // The heads and extras hold BatchNorm1d before conversion and SyncBatchNorm after.
  static torch::Tensor apply_norm(const std::shared_ptr<torch::nn::Module>& m,
                                  const torch::Tensor& x) {
    if (auto s = std::dynamic_pointer_cast<SyncBatchNormImpl>(m)) return s->forward(x);
    return std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(m)->forward(x);
  }
  torch::nn::Sequential features{nullptr};
  torch::nn::ModuleList heads{nullptr};
  torch::nn::ModuleDict extras{nullptr};
};
TORCH_MODULE(Net);

TEST(ConvertSyncBatchnormTest, ConvertsInsideModuleListModuleDictAndACustomModulesSequential) {
  torch::manual_seed(11);
  Net net(false);
  const auto input = torch::randn({6, 3, 4, 4});
  train_a_little(*net, [&] { return net->forward(input); });
  net->eval();
  const State before = snapshot(*net);
  const auto expected = net->forward(input);

  std::shared_ptr<torch::nn::Module> out = convert_sync_batchnorm(net.ptr());
  EXPECT_EQ(out, net.ptr());
  EXPECT_NE(net->features->ptr(1)->as<SyncBatchNormImpl>(), nullptr);
  EXPECT_NE(net->heads->ptr(0)->as<SyncBatchNormImpl>(), nullptr);
  EXPECT_NE(net->extras["norm"]->as<SyncBatchNormImpl>(), nullptr);
  EXPECT_EQ(net->extras->keys(), (std::vector<std::string>{"norm", "act"}))
      << "ModuleDict order kept";
  // The registered children agree with what forward uses.
  EXPECT_NE(net->named_modules()["features.1"]->as<SyncBatchNormImpl>(), nullptr);
  EXPECT_NE(net->named_modules()["heads.0"]->as<SyncBatchNormImpl>(), nullptr);
  expect_same_state(*net, before);
  expect_close(net->forward(input), expected, "eval output after conversion", 1e-6);

  // A BatchNorm given on its own comes back as a new SyncBatchNorm, and the
  // shared_ptr<SequentialImpl> overload is not ambiguous.
  torch::nn::BatchNorm2d lone(torch::nn::BatchNorm2dOptions(3).affine(false));
  auto lone_sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(convert_sync_batchnorm(lone.ptr()));
  ASSERT_NE(lone_sync, nullptr);
  EXPECT_FALSE(lone_sync->options.affine);
  EXPECT_FALSE(lone_sync->weight.defined());
  torch::nn::Sequential seq(torch::nn::BatchNorm1d(2));
  EXPECT_NE(convert_sync_batchnorm(seq.ptr())->ptr(0)->as<SyncBatchNormImpl>(), nullptr);
}

TEST(ConvertSyncBatchnormTest, BatchNormMemberOfACustomModuleThrowsNamingItsPath) {
  Net net(true);  // features.3 is a Block whose `bn` member is a BatchNorm2d.
  std::string message;
  try {
    convert_sync_batchnorm(net.ptr());
  } catch (const UsageError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("'features.3.bn'"), std::string::npos) << message;
  EXPECT_NE(message.find("dtrain::SyncBatchNorm"), std::string::npos) << message;
  // Checked before anything changed: the convertible BatchNorms were left alone.
  EXPECT_NE(net->features->ptr(1)->as<torch::nn::BatchNorm2dImpl>(), nullptr);
  EXPECT_NE(net->heads->ptr(0)->as<torch::nn::BatchNorm1dImpl>(), nullptr);

  torch::nn::Sequential with_3d(torch::nn::BatchNorm3d(2));
  EXPECT_THROW(convert_sync_batchnorm(with_3d), UsageError);
}

}  // namespace
}  // namespace dtrain
