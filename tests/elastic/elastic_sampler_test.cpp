// ElasticSampler (dtrain/elastic_sampler.h): DistributedSampler's batches at an unchanged
// world size, a remainder re-split exactly once at a new one, the epoch's tail, bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "dtrain/elastic_sampler.h"
#include "dtrain/error.h"
#include "dtrain/sampler.h"

namespace {

using dtrain::ElasticSampler;

TEST(ElasticSampler, MatchesDistributedSamplerAtAnUnchangedWorldSize) {
  for (int rank = 0; rank < 2; ++rank) {
    ElasticSampler es(100, 8, {.num_replicas = 2, .rank = rank, .seed = 5});
    es.set_epoch(3);
    dtrain::DistributedSampler ds(100, {.num_replicas = 2, .rank = rank, .seed = 5});
    ds.set_epoch(3);
    auto expected = ds.indices();
    std::vector<int64_t> got;
    for (int step = 0; step < 6; ++step) {  // the 6 full global batches of 16
      auto b = es.next_batch();
      ASSERT_TRUE(b.has_value());
      EXPECT_EQ(b->size(), 8u);
      got.insert(got.end(), b->begin(), b->end());
    }
    EXPECT_EQ(got, std::vector<int64_t>(expected.begin(), expected.begin() + 48))
        << "rank " << rank;
    EXPECT_EQ(es.offset(), 96);
  }
}

TEST(ElasticSampler, ResplitsTheRemainderOverNewRanksExactlyOnce) {
  std::map<int64_t, int> count;
  int64_t offset = 0;
  for (int rank = 0; rank < 3; ++rank) {  // 4 steps at world size 3
    ElasticSampler es(103, 5, {.num_replicas = 3, .rank = rank, .seed = 1});
    es.set_epoch(2);
    for (int step = 0; step < 4; ++step) {
      auto b =
          es.next_batch();  // kept: `for (i : *es.next_batch())` would read a destroyed temporary
      ASSERT_TRUE(b.has_value());
      for (int64_t i : *b) ++count[i];
    }
    offset = es.offset();
  }
  EXPECT_EQ(offset, 60);
  int64_t steps = -1;
  for (int rank = 0; rank < 2; ++rank) {  // the rest at world size 2, from the committed offset
    ElasticSampler es(103, 5, {.num_replicas = 2, .rank = rank, .seed = 1});
    es.set_epoch(2, offset);
    EXPECT_EQ(es.steps_left(), 5);  // ceil(43 / 10)
    int64_t n = 0;
    while (auto b = es.next_batch()) {
      for (int64_t i : *b) ++count[i];
      ++n;
    }
    if (steps >= 0) {
      EXPECT_EQ(n, steps) << "every rank must take the same number of steps";
    }
    steps = n;
    EXPECT_TRUE(es.epoch_done());
  }
  ASSERT_EQ(count.size(), 103u);
  for (const auto& [i, c] : count) EXPECT_EQ(c, 1) << "sample " << i;
}

TEST(ElasticSampler, TheEpochsTailMayLeaveARankEmptyButNeverOutOfStep) {
  // 13 samples, 3 ranks of 2: global batches of 6, 6 and 1.
  std::vector<size_t> last_sizes;
  for (int rank = 0; rank < 3; ++rank) {
    ElasticSampler es(13, 2, {.num_replicas = 3, .rank = rank, .shuffle = false});
    ASSERT_TRUE(es.next_batch());
    ASSERT_TRUE(es.next_batch());
    auto last = es.next_batch();
    ASSERT_TRUE(last.has_value()) << "rank " << rank;
    last_sizes.push_back(last->size());
    EXPECT_FALSE(es.next_batch().has_value());
  }
  EXPECT_EQ(last_sizes, (std::vector<size_t>{1, 0, 0}));
}

TEST(ElasticSampler, RejectsBadInput) {
  EXPECT_THROW(ElasticSampler(10, 0, {.num_replicas = 1, .rank = 0}), dtrain::UsageError);
  EXPECT_THROW(ElasticSampler(10, 2, {.num_replicas = 2, .rank = 2}), dtrain::UsageError);
  ElasticSampler es(10, 2, {.num_replicas = 1, .rank = 0});
  try {
    es.set_epoch(0, 11);
    FAIL() << "an offset past the dataset must throw";
  } catch (const dtrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("offset 11 is outside [0, 10]"), std::string::npos)
        << e.what();
  }
}

}  // namespace
