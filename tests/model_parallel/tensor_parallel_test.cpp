// Tensor-parallel layers at T = 2 and 4, ranks as threads: forward outputs and every gradient
// equal those of the unsharded layer (built once, copied into every rank) within 1e-5.
#include <gtest/gtest.h>

#include "dtrain/error.h"
#include "dtrain/tensor_parallel.h"
#include "support/thread_group.h"

namespace dtrain {
namespace {

constexpr double kTol = 1e-5;

::testing::AssertionResult close(const torch::Tensor& got, const torch::Tensor& want) {
  if (got.sizes() != want.sizes()) {
    return ::testing::AssertionFailure() << "shape " << got.sizes() << " != " << want.sizes();
  }
  if (torch::allclose(got, want, kTol, kTol)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max |diff| = " << (got - want).abs().max().item<double>();
}

torch::nn::Linear copy_of(const torch::nn::Linear& l) {
  return torch::nn::Linear(std::dynamic_pointer_cast<torch::nn::LinearImpl>(l->clone()));
}

// Rows [r*n/T, (r+1)*n/T) of dimension `dim`.
torch::Tensor shard(const torch::Tensor& t, int64_t dim, int rank, int world) {
  const int64_t n = t.size(dim) / world;
  return t.narrow(dim, rank * n, n);
}

void run_ranks_synced(int world, const std::function<void(GroupPtr)>& fn) {
  test::run_ranks(world, [&](GroupPtr g) {
    fn(g);
    g->barrier();
  });
}

void ColumnThenRowEqualsTheUnshardedMlp(const int T) {
  torch::manual_seed(1);
  torch::nn::Linear fc1(8, 16), fc2(16, 12);
  torch::Tensor x = torch::randn({5, 8});
  torch::Tensor up = torch::randn({5, 12});  // weights the output, so every gradient is non-trivial
  run_ranks_synced(T, [&](GroupPtr g) {
    const int r = g->rank();
    // Reference: the unsharded MLP, on this rank's own copy.
    auto ref1 = copy_of(fc1), ref2 = copy_of(fc2);
    torch::Tensor xr = x.clone().requires_grad_(true);
    torch::Tensor yr = ref2(torch::relu(ref1(xr)));
    (yr * up).sum().backward();

    ColumnParallelLinear col(copy_of(fc1), g, /*gather_output=*/false);
    RowParallelLinear row(copy_of(fc2), g, /*input_is_parallel=*/true);
    torch::Tensor xp = x.clone().requires_grad_(true);
    torch::Tensor h = col(xp);
    EXPECT_EQ(h.size(1), 16 / T);
    torch::Tensor y = row(torch::relu(h));
    (y * up).sum().backward();

    EXPECT_TRUE(close(y, yr));
    EXPECT_TRUE(close(xp.grad(), xr.grad()));
    EXPECT_TRUE(close(col->weight.grad(), shard(ref1->weight.grad(), 0, r, T)));
    EXPECT_TRUE(close(col->bias.grad(), shard(ref1->bias.grad(), 0, r, T)));
    EXPECT_TRUE(close(row->weight.grad(), shard(ref2->weight.grad(), 1, r, T)));
    EXPECT_TRUE(close(row->bias.grad(), ref2->bias.grad()));
  });
}

void GatheredColumnAndScatteredRowEqualTheUnshardedLayers(const int T) {
  torch::manual_seed(2);
  torch::nn::Linear a(6, 8), b(8, 4);
  torch::Tensor x = torch::randn({3, 2, 6});  // leading dimensions pass through
  run_ranks_synced(T, [&](GroupPtr g) {
    const int r = g->rank();
    auto ra = copy_of(a), rb = copy_of(b);
    torch::Tensor xr = x.clone().requires_grad_(true);
    torch::Tensor ya = ra(xr);
    torch::Tensor yb = rb(ya.tanh());
    (ya.sum() + yb.pow(2).sum()).backward();

    ColumnParallelLinear col(copy_of(a), g, /*gather_output=*/true);
    RowParallelLinear row(copy_of(b), g, /*input_is_parallel=*/false);
    torch::Tensor xp = x.clone().requires_grad_(true);
    torch::Tensor pa = col(xp);
    torch::Tensor pb = row(pa.tanh());
    (pa.sum() + pb.pow(2).sum()).backward();

    EXPECT_TRUE(close(pa, ya));
    EXPECT_TRUE(close(pb, yb));
    EXPECT_TRUE(close(xp.grad(), xr.grad()));
    EXPECT_TRUE(close(col->weight.grad(), shard(ra->weight.grad(), 0, r, T)));
    EXPECT_TRUE(close(row->weight.grad(), shard(rb->weight.grad(), 1, r, T)));
    EXPECT_TRUE(close(row->bias.grad(), rb->bias.grad()));
  });
}

void VocabParallelEmbeddingEqualsTheEmbedding(const int T) {
  torch::manual_seed(3);
  torch::nn::Embedding emb(12, 5);
  torch::Tensor ids = torch::randint(0, 12, {4, 7}, torch::kInt64);
  torch::Tensor up = torch::randn({4, 7, 5});
  run_ranks_synced(T, [&](GroupPtr g) {
    const int r = g->rank();
    torch::nn::Embedding ref(std::dynamic_pointer_cast<torch::nn::EmbeddingImpl>(emb->clone()));
    torch::Tensor yr = ref(ids);
    (yr * up).sum().backward();
    torch::nn::Embedding copy(std::dynamic_pointer_cast<torch::nn::EmbeddingImpl>(emb->clone()));
    VocabParallelEmbedding vpe(copy, g);
    EXPECT_EQ(vpe->vocab_start(), r * 12 / T);
    torch::Tensor y = vpe(ids);
    (y * up).sum().backward();
    EXPECT_TRUE(close(y, yr));
    EXPECT_TRUE(close(vpe->weight.grad(), shard(ref->weight.grad(), 0, r, T)));
  });
}

void VocabParallelCrossEntropyEqualsTheFullOne(const int T) {
  torch::manual_seed(4);
  // Large logits check the max shift; targets hit every rank's shard.
  torch::Tensor logits = torch::randn({9, 16}) * 20;
  torch::Tensor target = torch::randint(0, 16, {9}, torch::kInt64);
  run_ranks_synced(T, [&](GroupPtr g) {
    const int r = g->rank();
    torch::Tensor full = logits.clone().requires_grad_(true);
    torch::Tensor want = torch::nn::functional::cross_entropy(full, target);
    want.backward();
    torch::Tensor local = shard(logits, 1, r, T).clone().requires_grad_(true);
    torch::Tensor got = vocab_parallel_cross_entropy(local, target, g);
    got.backward();
    EXPECT_TRUE(close(got, want));
    EXPECT_TRUE(close(local.grad(), shard(full.grad(), 1, r, T)));
  });
}

void ParallelizeShardsNamedLinearsOfASequential(const int T) {
  torch::manual_seed(5);
  torch::nn::Sequential model({{"fc1", torch::nn::Linear(8, 16)},
                               {"act", torch::nn::GELU()},
                               {"fc2", torch::nn::Linear(16, 8)},
                               {"head", torch::nn::Linear(8, 8)},
                               {"out", torch::nn::Tanh()}});
  torch::Tensor x = torch::randn({4, 8});
  run_ranks_synced(T, [&](GroupPtr g) {
    const int r = g->rank();
    auto ref = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
    torch::Tensor yr = ref->forward(x);
    yr.pow(2).sum().backward();

    // parallelize() leaves `model` alone (the shards are copies), so every rank may read it.
    // (Sequential::clone() drops the children's names: the reference's are "0", "1", ...)
    auto mine = model;
    auto tp = parallelize(
        mine,
        {{"fc1", ColwiseParallel{}}, {"fc2", RowwiseParallel{}}, {"head", ColwiseParallel{true}}},
        g);
    torch::Tensor y = tp->forward(x);
    y.pow(2).sum().backward();
    EXPECT_TRUE(close(y, yr));
    auto got = tp->named_parameters();
    auto want = ref->named_parameters();
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(close(got["fc1.weight"].grad(), shard(want["0.weight"].grad(), 0, r, T)));
    EXPECT_TRUE(close(got["fc1.bias"].grad(), shard(want["0.bias"].grad(), 0, r, T)));
    EXPECT_TRUE(close(got["fc2.weight"].grad(), shard(want["2.weight"].grad(), 1, r, T)));
    EXPECT_TRUE(close(got["fc2.bias"].grad(), want["2.bias"].grad()));
    EXPECT_TRUE(close(got["head.weight"].grad(), shard(want["3.weight"].grad(), 0, r, T)));

    EXPECT_THROW(parallelize(mine, {{"fc3", ColwiseParallel{}}}, g), UsageError);
    EXPECT_THROW(parallelize(mine, {{"act", ColwiseParallel{}}}, g), UsageError);
  });
}

void SizesNotDivisibleByTheGroupAreUsageErrors() {
  run_ranks_synced(2, [](GroupPtr g) {
    try {
      ColumnParallelLinear(4, 7, g);
      ADD_FAILURE() << "out_features 7 over 2 ranks was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "out_features = 7 is not divisible by the tensor-parallel size 2"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(RowParallelLinear(5, 4, g), UsageError);
    EXPECT_THROW(VocabParallelEmbedding(9, 4, g), UsageError);
  });
}

// One process per T (loading libtorch costs more than the checks).
class TensorParallel : public ::testing::TestWithParam<int> {};

TEST_P(TensorParallel, LayersLossAndParallelizeEqualTheUnshardedModel) {
  torch::set_num_threads(1);
  const int T = GetParam();
  {
    SCOPED_TRACE("ColumnThenRowEqualsTheUnshardedMlp");
    ColumnThenRowEqualsTheUnshardedMlp(T);
  }
  {
    SCOPED_TRACE("GatheredColumnAndScatteredRowEqualTheUnshardedLayers");
    GatheredColumnAndScatteredRowEqualTheUnshardedLayers(T);
  }
  {
    SCOPED_TRACE("VocabParallelEmbeddingEqualsTheEmbedding");
    VocabParallelEmbeddingEqualsTheEmbedding(T);
  }
  {
    SCOPED_TRACE("VocabParallelCrossEntropyEqualsTheFullOne");
    VocabParallelCrossEntropyEqualsTheFullOne(T);
  }
  {
    SCOPED_TRACE("ParallelizeShardsNamedLinearsOfASequential");
    ParallelizeShardsNamedLinearsOfASequential(T);
  }
  if (T == 2) SizesNotDivisibleByTheGroupAreUsageErrors();
}

INSTANTIATE_TEST_SUITE_P(T, TensorParallel, ::testing::Values(2, 4),
                         [](const auto& info) { return "T" + std::to_string(info.param); });

}  // namespace
}  // namespace dtrain
