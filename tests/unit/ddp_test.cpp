// DistributedDataParallel with ranks as threads: state broadcast, gradient averaging, bucket
// layout, no_sync, unused parameters, communication hooks, buffer broadcast, model checks.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <torch/version.h>

#include <atomic>

#include "dtrain/ddp.h"
#include "dtrain/error.h"
#include "support/thread_group.h"

namespace {

using dtrain::DDPOptions;
using dtrain::DistributedDataParallel;
using dtrain::ProcessGroup;
using dtrain::test::run_ranks;

struct NetImpl : torch::nn::Module {
  NetImpl(int64_t in = 8, int64_t hidden = 16, int64_t out = 4)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, out))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

// A model with a branch that forward() may skip.
struct BranchyImpl : torch::nn::Module {
  BranchyImpl()
      : used(register_module("used", torch::nn::Linear(4, 2))),
        skipped(register_module("skipped", torch::nn::Linear(4, 2))) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_both) {
    return use_both ? used(x) + skipped(x) : used(x);
  }
  torch::nn::Linear used, skipped;
};
TORCH_MODULE(Branchy);

// A generator of its own: the global one is shared by the rank threads.
torch::Tensor data_for(int rank, int64_t rows = 6, int64_t cols = 8) {
  return torch::randn({rows, cols}, at::make_generator<at::CPUGeneratorImpl>(1000 + rank));
}

std::vector<torch::Tensor> clone_all(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (auto& t : ts) out.push_back(t.detach().clone());
  return out;
}

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (auto& p : params) out.push_back(p.grad().detach().clone());
  return out;
}

// The gradient each rank would compute alone, for the model state rank 0 broadcast.
std::vector<torch::Tensor> local_grads(const std::vector<torch::Tensor>& state, int rank) {
  Net net;
  torch::NoGradGuard g;
  auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(state[i]);
  {
    torch::AutoGradMode on(true);
    net->forward(data_for(rank)).pow(2).mean().backward();
  }
  return grads_of(net->parameters());
}

TEST(DDP, ConstructionBroadcastsRankZeroParameters) {
  const int world = 3;
  // Built here, one seed per rank: torch::manual_seed is process-wide, so seeding inside the
  // rank threads would race.
  std::vector<Net> nets;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(r);
    nets.emplace_back();
  }
  auto expected = clone_all(nets[0]->parameters());
  ASSERT_FALSE(torch::equal(nets[1]->parameters()[0], expected[0])) << "ranks must start different";
  std::vector<std::vector<torch::Tensor>> after(world);
  run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
    DistributedDataParallel ddp(nets[pg->rank()], DDPOptions{.group = pg});
    after[pg->rank()] = clone_all(ddp.parameters());
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(after[r].size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_TRUE(torch::equal(after[r][i], expected[i])) << "rank " << r;
  }
}

TEST(DDP, BackwardLeavesTheAverageOfEveryRanksGradient) {
  for (int world : {2, 3}) {
    std::vector<std::vector<torch::Tensor>> state(world), grads(world);
    run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
      torch::manual_seed(7);
      Net net;
      DistributedDataParallel ddp(net, DDPOptions{.group = pg});
      state[pg->rank()] = clone_all(ddp.parameters());
      ddp(data_for(pg->rank())).pow(2).mean().backward();
      grads[pg->rank()] = grads_of(ddp.parameters());
    });
    std::vector<torch::Tensor> expected;
    for (int r = 0; r < world; ++r) {
      auto g = local_grads(state[0], r);
      if (expected.empty()) {
        expected = g;
      } else {
        for (size_t i = 0; i < g.size(); ++i) expected[i] += g[i];
      }
    }
    for (auto& e : expected) e /= world;
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_TRUE(torch::allclose(grads[r][i], expected[i], 1e-5, 1e-7))
            << "world " << world << " rank " << r << " param " << i;
      }
    }
  }
}

TEST(DDP, BucketsFollowReverseParameterOrderAndCaps) {
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    // fc1.weight 64x64 floats = 16 KB, fc1.bias, fc2.weight 64x64, fc2.bias.
    Net net(64, 64, 64);
    DDPOptions o{.group = pg};
    o.first_bucket_mb = 8.0 / 1024;  // 8 KB: the first bucket closes after fc2.weight
    o.bucket_cap_mb = 20.0 / 1024;   // 20 KB: then fc1.weight closes the second one
    DistributedDataParallel ddp(net, o);
    auto layout = ddp.reducer().bucket_parameter_indices();
    // Parameters in registration order: 0 fc1.weight, 1 fc1.bias, 2 fc2.weight, 3 fc2.bias.
    std::vector<std::vector<size_t>> expected{{3, 2}, {1, 0}};
    EXPECT_EQ(layout, expected);
  });
}

TEST(DDP, NoSyncAccumulatesLocallyThenAveragesTheSum) {
  const int world = 2;
  std::vector<std::vector<torch::Tensor>> state(world), grads(world);
  run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
    torch::manual_seed(3);
    Net net;
    DistributedDataParallel ddp(net, DDPOptions{.group = pg});
    state[pg->rank()] = clone_all(ddp.parameters());
    {
      auto guard = ddp.no_sync();
      ddp(data_for(pg->rank())).pow(2).mean().backward();
      ddp(data_for(pg->rank())).pow(2).mean().backward();
    }
    ddp(data_for(pg->rank())).pow(2).mean().backward();
    grads[pg->rank()] = grads_of(ddp.parameters());
  });
  // Three local backward passes on the same data, summed, averaged over the ranks.
  std::vector<torch::Tensor> expected;
  for (int r = 0; r < world; ++r) {
    auto g = local_grads(state[0], r);
    for (size_t i = 0; i < g.size(); ++i) {
      if (expected.size() <= i) expected.push_back(torch::zeros_like(g[i]));
      expected[i] += 3 * g[i] / world;
    }
  }
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_TRUE(torch::allclose(grads[r][i], expected[i], 1e-5, 1e-7));
  }
}

TEST(DDP, UnusedParameterIsAnErrorNamingIt) {
  std::atomic<int> errors{0};
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    Branchy model;
    DistributedDataParallel ddp(model, DDPOptions{.group = pg});
    try {
      ddp(torch::randn({3, 4}), false).sum().backward();
    } catch (const std::exception& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("skipped.weight"), std::string::npos) << what;
      EXPECT_NE(what.find("find_unused_parameters"), std::string::npos) << what;
      ++errors;
    }
  });
  EXPECT_EQ(errors.load(), 2);
}

TEST(DDP, FindUnusedParametersAveragesWithZerosFromRanksThatSkipped) {
  std::vector<torch::Tensor> skipped_grad(2), used_grad(2);
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    torch::manual_seed(0);
    Branchy model;
    DDPOptions o{.group = pg};
    o.find_unused_parameters = true;
    DistributedDataParallel ddp(model, o);
    // Rank 0 uses the branch, rank 1 does not; both use `used`.
    ddp(torch::ones({1, 4}), pg->rank() == 0).sum().backward();
    skipped_grad[pg->rank()] = model->skipped->weight.grad().clone();
    used_grad[pg->rank()] = model->used->weight.grad().clone();
  });
  // d(sum)/dW = ones for the ranks that used the layer; averaged over 2 ranks.
  EXPECT_TRUE(torch::allclose(skipped_grad[0], torch::full({2, 4}, 0.5)));
  EXPECT_TRUE(torch::allclose(skipped_grad[1], torch::full({2, 4}, 0.5)));
  EXPECT_TRUE(torch::allclose(used_grad[0], torch::ones({2, 4})));
}

TEST(DDP, ModelsThatDifferAcrossRanksAreRejectedNamingTheParameter) {
  std::atomic<int> errors{0};
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    Net net(8, pg->rank() == 0 ? 16 : 17, 4);
    try {
      DistributedDataParallel ddp(net, DDPOptions{.group = pg});
    } catch (const dtrain::UsageError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("fc1.weight"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
      ++errors;
    }
  });
  EXPECT_EQ(errors.load(), 2);
}

TEST(DDP, CompressionHooksAverageWithinHalfPrecision) {
  for (auto hook : {dtrain::fp16_compress_hook(), dtrain::bf16_compress_hook()}) {
    std::vector<std::vector<torch::Tensor>> state(2), grads(2);
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      torch::manual_seed(5);
      Net net;
      DDPOptions o{.group = pg};
      o.comm_hook = hook;
      DistributedDataParallel ddp(net, o);
      state[pg->rank()] = clone_all(ddp.parameters());
      ddp(data_for(pg->rank())).pow(2).mean().backward();
      grads[pg->rank()] = grads_of(ddp.parameters());
    });
    auto g0 = local_grads(state[0], 0);
    auto g1 = local_grads(state[0], 1);
    for (size_t i = 0; i < g0.size(); ++i) {
      auto expected = (g0[i] + g1[i]) / 2;
      EXPECT_TRUE(torch::allclose(grads[0][i], expected, 1e-2, 1e-3)) << "param " << i;
      EXPECT_TRUE(torch::equal(grads[0][i], grads[1][i]));
    }
  }
}

TEST(DDP, UserCommHookRunsOncePerBucket) {
  std::atomic<int> calls{0};
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    Net net(64, 64, 64);
    DDPOptions o{.group = pg};
    o.first_bucket_mb = 8.0 / 1024;
    o.bucket_cap_mb = 20.0 / 1024;
    DistributedDataParallel ddp(net, o);
    auto inner = dtrain::allreduce_hook();
    ddp.register_comm_hook([&](ProcessGroup& g, dtrain::GradBucket& b) {
      ++calls;
      return inner(g, b);
    });
    ddp(torch::randn({2, 64})).sum().backward();
  });
  EXPECT_EQ(calls.load(), 2 * 2);  // two buckets, two ranks
}

TEST(DDP, BuffersAreBroadcastFromRankZeroBeforeForward) {
  std::vector<torch::Tensor> means(2);
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4));
    DistributedDataParallel ddp(model, DDPOptions{.group = pg});
    auto bn = model[1]->as<torch::nn::BatchNorm1d>();
    {
      torch::NoGradGuard g;
      bn->running_mean.fill_(pg->rank() == 0 ? 1.5 : -7.0);
    }
    ddp.eval();  // no running-stat update: what is left is exactly what was broadcast
    ddp(torch::randn({3, 4}));
    means[pg->rank()] = bn->running_mean.clone();
  });
  EXPECT_TRUE(torch::equal(means[0], torch::full({4}, 1.5)));
  EXPECT_TRUE(torch::equal(means[1], torch::full({4}, 1.5)));
}

// optimizer.zero_grad() either way: setting gradients to none or zeroing them in place
// (libtorch 1.13's zero_grad() zeroes in place and takes no argument).
void zero_grad(torch::optim::Optimizer& opt, bool to_none) {
#if TORCH_VERSION_MAJOR >= 2
  opt.zero_grad(to_none);
#else
  if (to_none) {
    for (auto& group : opt.param_groups())
      for (auto& p : group.params()) p.mutable_grad().reset();
  } else {
    opt.zero_grad();
  }
#endif
}

// Trains `steps` Adam steps on this rank's data, a no_sync step (gradient accumulation)
// before every other one; returns the parameters and whether every gradient shared the one
// bucket's memory after each backward.
std::pair<std::vector<torch::Tensor>, bool> train_steps(std::shared_ptr<ProcessGroup> pg, bool view,
                                                        bool to_none, int steps) {
  Net net;
  DDPOptions o{.group = pg};
  o.gradient_as_bucket_view = view;
  DistributedDataParallel ddp(net, o);
  {
    // The same start for every run, from a generator of its own (the global one is shared by
    // the rank threads).
    torch::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    for (auto& p : ddp.parameters()) p.copy_(torch::randn(p.sizes(), gen) * 0.3);
  }
  torch::optim::Adam opt(ddp.parameters(), torch::optim::AdamOptions(1e-2));
  bool shared = true;
  auto grads_share_the_bucket = [&] {
    auto params = ddp.parameters();
    for (auto& p : params) shared = shared && p.grad().is_alias_of(params[0].grad());
  };
  for (int step = 0; step < steps; ++step) {
    zero_grad(opt, to_none);
    auto x = data_for(pg->rank() + 10 * step);
    if (step % 2 == 1) {
      auto guard = ddp.no_sync();
      ddp(x).pow(2).mean().backward();
    }
    ddp(x * 0.5).pow(2).mean().backward();
    grads_share_the_bucket();
    opt.step();
  }
  return {clone_all(ddp.parameters()), shared};
}

TEST(DDP, GradientAsBucketViewTrainsBitwiseAsCopiesAndSharesTheBucket) {
  for (bool to_none : {true, false}) {
    std::vector<std::vector<torch::Tensor>> copied(2), viewed(2);
    std::vector<int> shared(2, 0), shared_without(2, 1);
    run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
      const int r = pg->rank();
      std::tie(copied[r], shared_without[r]) = train_steps(pg, false, to_none, 4);
      std::tie(viewed[r], shared[r]) = train_steps(pg, true, to_none, 4);
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(shared[r]) << "set to none " << to_none << ", rank " << r
                             << ": a gradient is not its place in the bucket";
      EXPECT_FALSE(shared_without[r])
          << "without the option the gradients are tensors of their own";
      for (size_t i = 0; i < copied[r].size(); ++i) {
        EXPECT_TRUE(torch::equal(viewed[r][i], copied[r][i]))
            << "set to none " << to_none << ", rank " << r << ", param " << i;
      }
    }
    for (size_t i = 0; i < copied[0].size(); ++i)
      EXPECT_TRUE(torch::equal(viewed[0][i], viewed[1][i]));
  }
}

TEST(DDP, GradientAsBucketViewMovesExistingGradientsIntoTheBucket) {
  run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    torch::manual_seed(4);
    Net net;
    net->forward(data_for(pg->rank())).sum().backward();  // gradients before DDP exists
    std::vector<torch::Tensor> before = grads_of(net->parameters());
    DDPOptions o{.group = pg};
    o.gradient_as_bucket_view = true;
    DistributedDataParallel ddp(net, o);
    auto params = ddp.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(params[i].grad().is_alias_of(params[0].grad())) << "param " << i;
      EXPECT_TRUE(torch::equal(params[i].grad(), before[i])) << "param " << i;
    }
  });
}

TEST(DDP, ModuleReturnsTheUnwrappedModel) {
  run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    Net net;
    DistributedDataParallel ddp(net, DDPOptions{.group = pg});
    EXPECT_EQ(ddp.module().ptr().get(), net.ptr().get());
  });
}

}  // namespace
