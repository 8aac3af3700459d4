// 3D parallel training (data x pipeline x tensor) of the example's transformer LM: on 8 ranks
// (threads, each with real Gloo groups) as dp x pp x tp = 2 x 2 x 2 it follows the same loss
// curve as one rank training the unsharded, unpipelined model.
#include <gtest/gtest.h>

#include "gpt.h"
#include "support/thread_group.h"

namespace {

gpt::Config small() {
  gpt::Config c;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_layers = 2;
  c.block = 16;
  c.batch = 8;
  c.steps = 6;
  c.micro_batches = 2;
  return c;
}

std::vector<double> curve(int world, std::vector<std::pair<std::string, int>> dims,
                          const gpt::Config& cfg, const gpt::Corpus& corpus) {
  std::vector<double> losses;
  std::mutex mu;
  dtrain::test::run_ranks(world, [&](std::shared_ptr<dtrain::ProcessGroup> g) {
    dtrain::DeviceMesh mesh(dims, g);
    auto r = gpt::train(cfg, corpus, mesh);
    std::lock_guard<std::mutex> lock(mu);
    if (g->rank() == 0) losses = r.losses;
  });
  return losses;
}

TEST(Gpt3D, TwoByTwoByTwoFollowsTheSingleProcessLossCurve) {
  torch::set_num_threads(1);
  const gpt::Config cfg = small();
  const gpt::Corpus corpus = gpt::load_corpus(DTRAIN_GPT_CORPUS, cfg.block);
  auto one = curve(1, {{"dp", 1}, {"pp", 1}, {"tp", 1}}, cfg, corpus);
  auto three_d = curve(8, {{"dp", 2}, {"pp", 2}, {"tp", 2}}, cfg, corpus);
  ASSERT_EQ(one.size(), static_cast<size_t>(cfg.steps));
  ASSERT_EQ(three_d.size(), one.size());
  for (size_t s = 0; s < one.size(); ++s) EXPECT_NEAR(three_d[s], one[s], 1e-4) << "step " << s;
  EXPECT_LT(one.back(), one.front())
      << "the model should learn something in " << cfg.steps << " steps";
}

TEST(Gpt3D, InterleavedPipelineWithTensorParallelFollowsTheSameCurve) {
  torch::set_num_threads(1);
  gpt::Config cfg = small();
  cfg.schedule = dtrain::Schedule::kInterleavedOneFOneB;
  cfg.virtual_stages = 2;
  cfg.micro_batches = 4;
  cfg.steps = 3;
  const gpt::Corpus corpus = gpt::load_corpus(DTRAIN_GPT_CORPUS, cfg.block);
  gpt::Config plain = cfg;
  plain.schedule = dtrain::Schedule::kOneFOneB;
  plain.virtual_stages = 1;
  auto one = curve(1, {{"dp", 1}, {"pp", 1}, {"tp", 1}}, plain, corpus);
  auto piped = curve(4, {{"dp", 1}, {"pp", 2}, {"tp", 2}}, cfg, corpus);
  ASSERT_EQ(piped.size(), one.size());
  for (size_t s = 0; s < one.size(); ++s) EXPECT_NEAR(piped[s], one[s], 1e-4) << "step " << s;
}

}  // namespace
