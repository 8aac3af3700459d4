// DistributedSampler: hand-computed index lists, the partition across ranks, the epoch
// reshuffle, argument errors, and an exact comparison with PyTorch 1.13's own
// torch.utils.data.DistributedSampler (python3-torch is required: the test fails without it).
#include "dtrain/sampler.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "dtrain/error.h"
#include "launcher/subprocess.h"
#include "support/scoped_env.h"

namespace dtrain {
namespace {

using Indices = std::vector<int64_t>;

DistributedSamplerOptions opts(int replicas, int rank, bool shuffle = false, bool drop_last = false,
                               uint64_t seed = 0) {
  DistributedSamplerOptions o;
  o.num_replicas = replicas;
  o.rank = rank;
  o.shuffle = shuffle;
  o.drop_last = drop_last;
  o.seed = seed;
  return o;
}

std::vector<Indices> per_rank(int64_t size, int replicas, bool shuffle, bool drop_last,
                              uint64_t seed = 0, int64_t epoch = 0) {
  std::vector<Indices> out;
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler s(size, opts(replicas, r, shuffle, drop_last, seed));
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

void check_no_shuffle_pads_from_the_start() {
  // 10 samples on 3 ranks: num_samples = ceil(10/3) = 4, total 12, padded 0..9,0,1.
  auto lists = per_rank(10, 3, false, false);
  EXPECT_EQ(lists[0], (Indices{0, 3, 6, 9}));
  EXPECT_EQ(lists[1], (Indices{1, 4, 7, 0}));
  EXPECT_EQ(lists[2], (Indices{2, 5, 8, 1}));
  DistributedSampler s(10, opts(3, 0));
  EXPECT_EQ(s.num_samples(), 4);
  EXPECT_EQ(s.total_size(), 12);
}

void check_drop_last_truncates() {
  // drop_last and 10 % 3 != 0: num_samples = ceil((10-3)/3) = 3, total 9: sample 9 is dropped.
  auto lists = per_rank(10, 3, false, true);
  EXPECT_EQ(lists[0], (Indices{0, 3, 6}));
  EXPECT_EQ(lists[1], (Indices{1, 4, 7}));
  EXPECT_EQ(lists[2], (Indices{2, 5, 8}));
  DistributedSampler s(10, opts(3, 2, false, true));
  EXPECT_EQ(s.num_samples(), 3);
  EXPECT_EQ(s.total_size(), 9);
}

void check_padding_longer_than_the_data_repeats_it() {
  // 2 samples on 5 ranks: total 5, padding 3 > 2, so the list repeats: 0,1,0,1,0.
  auto lists = per_rank(2, 5, false, false);
  EXPECT_EQ(lists, (std::vector<Indices>{{0}, {1}, {0}, {1}, {0}}));
  // With drop_last nobody gets anything: ceil((2-5)/5) = ceil(-0.6) = 0.
  for (const auto& l : per_rank(2, 5, false, true)) EXPECT_TRUE(l.empty());
  DistributedSampler s(2, opts(5, 4, false, true));
  EXPECT_EQ(s.num_samples(), 0);
  EXPECT_EQ(s.total_size(), 0);
}

void check_empty_dataset_and_even_split() {
  DistributedSampler empty(0, opts(3, 1, true));
  EXPECT_TRUE(empty.indices().empty());
  EXPECT_EQ(empty.num_samples(), 0);
  // 8 on 4 divides evenly: drop_last changes nothing.
  EXPECT_EQ(per_rank(8, 4, false, true), per_rank(8, 4, false, false));
  EXPECT_EQ(per_rank(8, 4, false, true)[3], (Indices{3, 7}));
}

// The hand-computed cases share one process: every test process pays libtorch's ~0.6 s of
// loading.
TEST(SamplerTest, HandComputedIndexLists) {
  check_no_shuffle_pads_from_the_start();
  check_drop_last_truncates();
  check_padding_longer_than_the_data_repeats_it();
  check_empty_dataset_and_even_split();
}

TEST(SamplerTest, SizesFollowPyTorchFormulas) {
  for (int64_t size : {0, 1, 2, 5, 7, 9, 10, 11, 100, 101}) {
    for (int replicas = 1; replicas <= 6; ++replicas) {
      for (bool drop_last : {false, true}) {
        DistributedSampler s(size, opts(replicas, replicas - 1, true, drop_last));
        int64_t expected = 0;
        if (drop_last && size % replicas != 0) {
          // Python: math.ceil((size - replicas) / replicas), possibly of a negative number.
          double q = static_cast<double>(size - replicas) / replicas;
          expected = static_cast<int64_t>(std::ceil(q));
        } else {
          expected = (size + replicas - 1) / replicas;
        }
        SCOPED_TRACE("size=" + std::to_string(size) + " replicas=" + std::to_string(replicas) +
                     " drop_last=" + std::to_string(drop_last));
        EXPECT_EQ(s.num_samples(), expected);
        EXPECT_EQ(s.total_size(), expected * replicas);
        EXPECT_EQ(static_cast<int64_t>(s.indices().size()), expected);
      }
    }
  }
}

TEST(SamplerTest, RanksPartitionTheDataset) {
  for (int64_t size : {1, 7, 10, 64, 101}) {
    for (int replicas = 1; replicas <= 4; ++replicas) {
      SCOPED_TRACE("size=" + std::to_string(size) + " replicas=" + std::to_string(replicas));
      // Without drop_last every index appears, and only the total_size - size padded
      // entries repeat one.
      std::map<int64_t, int> count;
      int64_t total = 0;
      for (const auto& l : per_rank(size, replicas, true, false, 7, 2)) {
        for (int64_t i : l) ++count[i];
        total += static_cast<int64_t>(l.size());
      }
      ASSERT_EQ(static_cast<int64_t>(count.size()), size);
      EXPECT_EQ(count.begin()->first, 0);
      EXPECT_EQ(count.rbegin()->first, size - 1);
      int64_t repeats = 0;
      for (auto& [i, c] : count) repeats += c - 1;
      EXPECT_EQ(repeats, total - size);
      EXPECT_LT(repeats, replicas);
      // With drop_last no index appears twice and fewer than `replicas` are dropped.
      std::set<int64_t> seen;
      for (const auto& l : per_rank(size, replicas, true, true, 7, 2)) {
        for (int64_t i : l) {
          EXPECT_TRUE(seen.insert(i).second) << "index " << i << " given to two ranks";
          EXPECT_GE(i, 0);
          EXPECT_LT(i, size);
        }
      }
      EXPECT_GT(static_cast<int64_t>(seen.size()), size - replicas);
    }
  }
}

TEST(SamplerTest, EpochReshufflesDeterministically) {
  DistributedSampler a(100, opts(2, 1, true, false, 42));
  DistributedSampler b(100, opts(2, 1, true, false, 42));
  Indices e0 = a.indices();
  EXPECT_EQ(e0, a.indices()) << "the same epoch must give the same order";
  EXPECT_EQ(e0, b.indices()) << "two samplers with one seed must agree";
  a.set_epoch(3);
  EXPECT_EQ(a.epoch(), 3);
  Indices e3 = a.indices();
  EXPECT_NE(e0, e3);
  b.set_epoch(1);
  b.set_epoch(3);
  EXPECT_EQ(b.indices(), e3) << "the order depends on the epoch only, not on history";
  // The seed matters, and seed + epoch is what is used (seed 40, epoch 5 == seed 42, epoch 3).
  DistributedSampler c(100, opts(2, 1, true, false, 40));
  EXPECT_NE(c.indices(), e0);
  c.set_epoch(5);
  EXPECT_EQ(c.indices(), e3);
  // Unshuffled, the epoch changes nothing.
  DistributedSampler d(100, opts(2, 1, false));
  Indices plain = d.indices();
  d.set_epoch(9);
  EXPECT_EQ(d.indices(), plain);
}

void check_bad_rank_or_replicas_is_a_usage_error() {
  EXPECT_THROW(DistributedSampler(10, opts(3, 3)), UsageError);
  EXPECT_THROW(DistributedSampler(10, opts(3, -1)), UsageError);
  EXPECT_THROW(DistributedSampler(10, opts(0, 0)), UsageError);
  EXPECT_THROW(DistributedSampler(-1, opts(1, 0)), UsageError);
  try {
    DistributedSampler(10, opts(2, 5));
    FAIL() << "rank 5 of 2 was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("[0, 1]"), std::string::npos) << e.what();
  }
}

using dtrain::test::ScopedEnv;

void check_defaults_come_from_the_environment_then_one_process() {
  {
    ScopedEnv env;
    env.set("RANK", nullptr);
    env.set("WORLD_SIZE", nullptr);
    DistributedSampler s(10);
    EXPECT_EQ(s.num_replicas(), 1);
    EXPECT_EQ(s.rank(), 0);
    EXPECT_EQ(s.num_samples(), 10);
  }
  {
    ScopedEnv env;
    env.set("RANK", "2");
    env.set("WORLD_SIZE", "3");
    DistributedSampler s(10);
    EXPECT_EQ(s.num_replicas(), 3);
    EXPECT_EQ(s.rank(), 2);
    DistributedSamplerOptions o;
    o.rank = 0;  // an explicit value wins over the environment's
    DistributedSampler t(10, o);
    EXPECT_EQ(t.num_replicas(), 3);
    EXPECT_EQ(t.rank(), 0);
  }
}

TEST(SamplerTest, RankAndReplicasAreCheckedAndDefaulted) {
  check_bad_rank_or_replicas_is_a_usage_error();
  check_defaults_come_from_the_environment_then_one_process();
}

// One Python process runs torch's DistributedSampler over the whole grid and prints every
// case as JSON; we rebuild each case here and demand the same list.
constexpr const char* kPython = "/usr/bin/python3";
constexpr const char* kGridScript = R"PY(
import json, sys
import torch
from torch.utils.data.distributed import DistributedSampler
cases = []
for size in (1, 7, 10, 64, 1000, 60000):
    for replicas in (1, 2, 3, 4):
        for seed in (0, 42):
            for epoch in (0, 3):
                for shuffle in (False, True):
                    for drop_last in (False, True):
                        for rank in range(replicas):
                            s = DistributedSampler(range(size), num_replicas=replicas, rank=rank,
                                                   shuffle=shuffle, seed=seed, drop_last=drop_last)
                            s.set_epoch(epoch)
                            cases.append({"size": size, "replicas": replicas, "rank": rank,
                                          "seed": seed, "epoch": epoch, "shuffle": shuffle,
                                          "drop_last": drop_last, "num_samples": len(s),
                                          "total_size": s.total_size, "indices": list(s)})
# One write: json.dump() writes piecewise, which is a syscall per piece when PYTHONUNBUFFERED is set.
sys.stdout.write(json.dumps({"torch": torch.__version__, "cases": cases}, separators=(",", ":")))
sys.stdout.flush()
)PY";

TEST(SamplerTest, MatchesPyTorchDistributedSamplerExactly) {
  test::RunOptions ro;
  ro.timeout = std::chrono::seconds(60);
  auto r = test::run_command({kPython, "-c", kGridScript}, ro);
  ASSERT_EQ(r.exit_code, 0) << "Debian's python3-torch is required at " << kPython
                            << " (apt-get install python3-torch); it failed: " << r.err;
  nlohmann::json doc = nlohmann::json::parse(r.out);
  const auto& cases = doc.at("cases");
  // 6 sizes x (1+2+3+4) ranks x 2 seeds x 2 epochs x 2 shuffle x 2 drop_last.
  ASSERT_EQ(cases.size(), 6u * 10 * 2 * 2 * 2 * 2) << "python3-torch " << doc.value("torch", "?");
  size_t compared = 0;
  int64_t nonempty_shuffled = 0;
  for (const auto& c : cases) {
    DistributedSampler s(
        c.at("size").get<int64_t>(),
        opts(c.at("replicas").get<int>(), c.at("rank").get<int>(), c.at("shuffle").get<bool>(),
             c.at("drop_last").get<bool>(), c.at("seed").get<uint64_t>()));
    s.set_epoch(c.at("epoch").get<int64_t>());
    SCOPED_TRACE(c.at("size").dump() + " replicas=" + c.at("replicas").dump() +
                 " rank=" + c.at("rank").dump() + " seed=" + c.at("seed").dump() +
                 " epoch=" + c.at("epoch").dump() + " shuffle=" + c.at("shuffle").dump() +
                 " drop_last=" + c.at("drop_last").dump());
    ASSERT_EQ(s.num_samples(), c.at("num_samples").get<int64_t>());
    ASSERT_EQ(s.total_size(), c.at("total_size").get<int64_t>());
    Indices expected = c.at("indices").get<Indices>();
    Indices got = s.indices();
    ASSERT_EQ(got.size(), expected.size());
    auto diff = std::mismatch(got.begin(), got.end(), expected.begin());
    ASSERT_TRUE(diff.first == got.end())
        << "first difference at position " << (diff.first - got.begin()) << ": C++ " << *diff.first
        << ", Python " << *diff.second;
    if (c.at("shuffle").get<bool>() && c.at("size").get<int64_t>() > 1) ++nonempty_shuffled;
    ++compared;
  }
  EXPECT_EQ(compared, cases.size());
  EXPECT_GT(nonempty_shuffled, 0);
}

}  // namespace
}  // namespace dtrain
