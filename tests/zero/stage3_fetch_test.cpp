// ZeRO stage 3's per-submodule fetch (src/zero/stage3_fetch.h), ranks as threads: resident
// parameter bytes between units stay within 1/N + persistent units + max live parameters
// (measured through the gathered buffers' storages, whoever holds them), the next unit is
// prefetched while one computes, bytes sent are 1.5x DDP's, and fetching per unit trains
// exactly as gathering the whole module does.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "dtrain/zero.h"
#include "support/thread_group.h"

namespace {

using dtrain::ProcessGroup;
using dtrain::test::run_ranks;
using nlohmann::json;
using namespace torch::nn;
using Params = std::vector<torch::Tensor>;

std::mutex seed_mu;

// Six 64x64 Linears (4,160 parameters each) and a small head (130): units 0, 2, ..., 12.
Sequential make_seq() {
  std::lock_guard<std::mutex> lock(seed_mu);
  torch::manual_seed(5);
  Sequential m;
  for (int i = 0; i < 6; ++i) m->push_back(Linear(64, 64)), m->push_back(ReLU());
  m->push_back(Linear(64, 2));
  m->to(torch::kFloat64);
  return m;
}

// The same layers inside a module of its own (not a Sequential: gathered whole, or fetched
// through engine.fetch()).
struct NetImpl : Module {
  Sequential body{nullptr}, head{nullptr};
  NetImpl() {
    auto seq = make_seq();
    body = register_module("body", Sequential());
    head = register_module("head", Sequential());
    size_t i = 0;
    for (auto& child : *seq) {
      if (i++ == 12)
        head->push_back(child);
      else
        body->push_back(child);
    }
  }
  torch::Tensor forward(torch::Tensor x) { return head->forward(body->forward(x)); }
};
TORCH_MODULE(Net);

// reuse 0: every unit released after each use (DeepSpeed's default 1e9 keeps every unit of this
// model gathered from its forward to its backward, from the second pass on).
json config(int64_t persistence, int64_t max_live, int64_t prefetch, bool overlap = false,
            int64_t reuse = 0) {
  return {{"train_micro_batch_size_per_gpu", 8},
          {"gradient_clipping", 0.0},  // as the DDP reference (DeepSpeed clips at 1.0)
          {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-2}}}}},
          {"zero_optimization",
           {{"stage", 3},
            {"overlap_comm", overlap},
            {"reduce_bucket_size", 5000},
            {"stage3_param_persistence_threshold", persistence},
            {"stage3_max_live_parameters", max_live},
            {"stage3_prefetch_bucket_size", prefetch},
            {"stage3_max_reuse_distance", reuse}}}};
}

struct Batch {
  torch::Tensor x, y;
};
Batch batch(int step, int rank) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(1000 + step * 16 + rank);
  return {torch::randn({8, 64}, g, torch::kFloat64), torch::randint(0, 2, {8}, g, torch::kLong)};
}

template <class E, class F>
void train(E& e, int rank, int steps, F&& forward) {
  for (int s = 0; s < steps; ++s) {
    auto b = batch(s, rank);
    e.backward(functional::cross_entropy(forward(b.x), b.y));
    e.step();
  }
}

template <class E>
Params gathered(E& e) {
  e.core().before_forward();  // the whole module (a collective)
  Params out;
  for (auto& p : e.module()->parameters()) out.push_back(p.detach().clone());
  return out;
}

double max_abs_diff(const Params& a, const Params& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, (a[i] - b[i]).abs().max().template item<double>());
  return m;
}

TEST(ZeroStage3Fetch, ResidentBytesBetweenUnitsStayWithinTheBound) {
  const int N = 2;
  // The head (130 elements) persists; at most one 4,160-element unit may be gathered ahead.
  auto cfg = config(/*persistence=*/200, /*max_live=*/2 * 4160, /*prefetch=*/4160);
  std::mutex mu;
  dtrain::zero::Stage3Stats stats;
  std::vector<std::string> trace;
  int64_t held_after_step = -1;
  run_ranks(N, [&](std::shared_ptr<ProcessGroup> pg) {
    auto e = dtrain::zero::initialize(make_seq(), cfg, {pg});
    std::vector<std::string> mine;
    e.core().set_stage3_trace([&](const std::string& s) { mine.push_back(s); });
    train(e, pg->rank(), 3, [&](const torch::Tensor& x) { return e(x); });
    std::lock_guard<std::mutex> lock(mu);
    if (pg->rank() == 0)
      stats = e.core().stage3_stats(), trace = mine, held_after_step = e.memory().params();
  });
  const int64_t total = (6 * 4160 + 130) * 8, whole_gather_peak = (total + total / N);
  EXPECT_EQ(stats.units, 7);
  EXPECT_EQ(stats.persistent_units, 1);
  EXPECT_EQ(stats.persistent_bytes, 130 * 8);
  // The flat padded to a multiple of 2 x N (DeepSpeed's stage 1/2 alignment), then cut in N.
  const int64_t align = 2 * N;
  EXPECT_EQ(stats.partition_bytes, (6 * 4160 + 130 + align - 1) / align * align / N * 8);
  const int64_t bound = stats.partition_bytes + stats.persistent_bytes + stats.max_live_bytes;
  std::printf(
      "peak resident parameter bytes between units: %lld (bound 1/N + persistent + max live = "
      "%lld; "
      "gathering the whole module holds %lld)\n",
      (long long)stats.peak_resident_bytes, (long long)bound, (long long)whole_gather_peak);
  EXPECT_GT(stats.peak_resident_bytes, stats.partition_bytes);
  EXPECT_LE(stats.peak_resident_bytes, bound);
  EXPECT_LT(stats.peak_resident_bytes, whole_gather_peak);
  EXPECT_EQ(held_after_step, stats.partition_bytes);  // between steps: the partition only
  // Prefetch: unit 2's gather starts before unit 0's forward ends, and in backward unit 10's
  // before unit 12's backward is done.
  auto at = [&](const std::string& what) {
    return std::find(trace.begin(), trace.end(), what) - trace.begin();
  };
  EXPECT_LT(at("launch 2"), at("end 0"));
  EXPECT_LT(at("launch 0"), at("launch 2"));
  EXPECT_LT(at("launch 2"), at("forward 0"));  // launched before unit 0 computes
  EXPECT_GT(stats.prefetches, 0);
  // Every unit is gathered twice per step (forward, backward) except the persistent head, once.
  EXPECT_EQ(stats.fetches, 3 * (2 * 6 + 1));
}

TEST(ZeroStage3Fetch, SendsOneAndAHalfTimesDdpBytes) {
  for (int N : {2, 4}) {
    std::mutex mu;
    int64_t sent = 0;
    run_ranks(N, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_seq(), config(0, 1000000, 10000, true), {pg});
      train(e, pg->rank(), 2, [&](const torch::Tensor& x) { return e(x); });
      std::lock_guard<std::mutex> lock(mu);
      if (pg->rank() == 0) sent = e.bytes_sent_last_step();
    });
    const int64_t n = 6 * 4160 + 130, padded = (n + N - 1) / N * N;
    const double ddp = 2.0 * (N - 1) * padded * 8 / N;
    std::printf("N=%d: stage 3 sends %lld bytes per step, %.3fx DDP's all-reduce\n", N,
                (long long)sent, sent / ddp);
    // Two gathers (forward, backward) and one reduce of (N-1)/N each: 3/2 of an all-reduce.
    EXPECT_NEAR(sent / ddp, 1.5, 0.01) << N;
  }
}

// overlap_comm: a bucket's reduction is waited for once two newer buckets are launched, so
// backward never holds more than two buckets of gradients at once (each 64x64 weight here is a
// bucket of its own, reduced from autograd's gradient itself); the whole model's gradients
// stayed on the device until the end of backward before. The results are the same bitwise.
TEST(ZeroStage3Fetch, OverlappedReductionsHoldAtMostTwoBucketsOfGradients) {
  const int N = 2;
  std::mutex mu;
  int most_alive = -1;
  Params overlapped, serial;
  run_ranks(N, [&](std::shared_ptr<ProcessGroup> pg) {
    auto cfg = config(0, 1000000, 5000, /*overlap=*/true);
    cfg["zero_optimization"]["reduce_bucket_size"] = 4096;  // a weight is a bucket
    auto e = dtrain::zero::initialize(make_seq(), cfg, {pg});
    // Each weight's incoming gradient, watched weakly (autograd then makes it .grad itself);
    // when the first layer's arrives (the last of backward), count the others still alive.
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> grads;
    int alive_at_first_layer = -1;
    std::vector<torch::Tensor> weights;
    for (auto& item : e.module()->named_parameters())
      if (item.key().find("weight") != std::string::npos) weights.push_back(item.value());
    for (size_t i = 0; i < weights.size(); ++i) {
      weights[i].register_hook([&, i](const torch::Tensor& g) {
        if (i == 0) {
          alive_at_first_layer = 0;
          for (auto& w : grads) alive_at_first_layer += w.expired() ? 0 : 1;
        }
        grads.emplace_back(g.storage().getWeakStorageImpl());
      });
    }
    train(e, pg->rank(), 2, [&](const torch::Tensor& x) { return e(x); });
    auto p_overlap = gathered(e);
    cfg["zero_optimization"]["overlap_comm"] = false;
    auto f = dtrain::zero::initialize(make_seq(), cfg, {pg});
    train(f, pg->rank(), 2, [&](const torch::Tensor& x) { return f(x); });
    auto p_serial = gathered(f);
    std::lock_guard<std::mutex> lock(mu);
    if (pg->rank() == 0)
      most_alive = alive_at_first_layer, overlapped = p_overlap, serial = p_serial;
  });
  // Before the first layer's: the head's weight (in a bucket with small ones: copied, freed at
  // once) and five 64x64 weights, each a bucket. The one launched last is still in flight (at
  // least 1 alive also shows the watch sees autograd's gradient); without the bound all five.
  std::printf("64x64 weight gradients alive when the first layer's arrives: %d of 5\n", most_alive);
  EXPECT_GE(most_alive, 1);
  EXPECT_LE(most_alive, 2);
  ASSERT_EQ(overlapped.size(), serial.size());
  EXPECT_EQ(max_abs_diff(overlapped, serial), 0.0);
}

TEST(ZeroStage3Fetch, PerUnitFetchTrainsAsTheWholeModuleGather) {
  const int N = 2;
  std::mutex mu;
  Params seq_fetch, net_whole, net_fetch;
  run_ranks(N, [&](std::shared_ptr<ProcessGroup> pg) {
    auto cfg = config(0, 1000000, 5000);
    auto a = dtrain::zero::initialize(make_seq(), cfg, {pg});
    train(a, pg->rank(), 4, [&](const torch::Tensor& x) { return a(x); });
    auto pa = gathered(a);
    auto b = dtrain::zero::initialize(Net(), cfg, {pg});  // not a Sequential: gathered whole
    train(b, pg->rank(), 4, [&](const torch::Tensor& x) { return b(x); });
    auto pb = gathered(b);
    auto c = dtrain::zero::initialize(Net(), cfg, {pg});
    auto& net = *c.module();
    c.fetch_units({net.body.ptr(), net.head.ptr()});
    train(c, pg->rank(), 4, [&](const torch::Tensor& x) {
      auto h = c.fetch(*net.body, [&] { return net.body->forward(x); });
      return c.fetch(*net.head, [&] { return net.head->forward(h); });
    });
    auto pc = gathered(c);
    EXPECT_EQ(c.core().stage3_stats().units, 2);
    std::lock_guard<std::mutex> lock(mu);
    if (pg->rank() == 0) seq_fetch = pa, net_whole = pb, net_fetch = pc;
  });
  ASSERT_EQ(seq_fetch.size(), net_whole.size());
  EXPECT_EQ(max_abs_diff(seq_fetch, net_whole), 0.0);  // ZeRO's linear has at::linear's numerics
  EXPECT_EQ(max_abs_diff(net_fetch, net_whole), 0.0);
}

TEST(ZeroStage3Fetch, UnitsThatDoNotCoverTheModelAreAnError) {
  run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    auto e = dtrain::zero::initialize(Net(), config(0, 1000000, 5000), {pg});
    try {
      e.fetch_units({e.module()->body.ptr()});
      FAIL() << "expected an error";
    } catch (const dtrain::UsageError& err) {
      EXPECT_NE(std::string(err.what()).find("parameter 'head.0.weight' is in no fetch unit"),
                std::string::npos)
          << err.what();
    }
    e.fetch_units({e.module()->body.ptr(), e.module()->head.ptr()});
    try {
      e.fetch(*e.module(), [] { return 0; });
      FAIL() << "expected an error";
    } catch (const dtrain::UsageError& err) {
      EXPECT_NE(std::string(err.what()).find("not one of the units"), std::string::npos)
          << err.what();
    }
  });
}

// stage3_max_reuse_distance (DeepSpeed's trace): from the second pass on, a unit that the last
// pass used again within the distance stays gathered. 300 elements reach from the last 64x64
// Linear (unit 10) over the head's forward and backward (130 each) to its own backward, and
// from the head to its backward; no further. The kept units are not fetched again, and
// training is bitwise the same.
TEST(ZeroStage3Fetch, UnitsUsedAgainWithinTheReuseDistanceStayGathered) {
  const int N = 2, steps = 3;
  std::mutex mu;
  std::map<int64_t, dtrain::zero::Stage3Stats> stats;
  std::map<int64_t, int64_t> sent;
  std::map<int64_t, Params> trained;
  std::vector<std::string> trace;
  for (int64_t reuse : {int64_t{0}, int64_t{300}, int64_t{1000000000}}) {
    run_ranks(N, [&](std::shared_ptr<ProcessGroup> pg) {
      auto e = dtrain::zero::initialize(make_seq(), config(0, 1000000, 5000, false, reuse), {pg});
      std::vector<std::string> mine;
      e.core().set_stage3_trace([&](const std::string& s) { mine.push_back(s); });
      train(e, pg->rank(), steps, [&](const torch::Tensor& x) { return e(x); });
      const int64_t bytes = e.bytes_sent_last_step();
      auto params = gathered(e);
      std::lock_guard<std::mutex> lock(mu);
      if (pg->rank() != 0) return;
      stats[reuse] = e.core().stage3_stats(), sent[reuse] = bytes, trained[reuse] = params;
      if (reuse == 300) trace = mine;
    });
  }
  const int64_t units = 7;
  EXPECT_EQ(stats[0].fetches, steps * 2 * units);
  EXPECT_EQ(stats[0].kept_for_reuse, 0);
  // The first pass has no trace; each later one keeps units 10 and 12 once each.
  EXPECT_EQ(stats[300].kept_for_reuse, (steps - 1) * 2);
  EXPECT_EQ(stats[300].fetches, steps * 2 * units - (steps - 1) * 2);
  EXPECT_LT(sent[300], sent[0]);
  EXPECT_NE(std::find(trace.begin(), trace.end(), "keep 10"), trace.end());
  EXPECT_NE(std::find(trace.begin(), trace.end(), "keep 12"), trace.end());
  EXPECT_EQ(std::find(trace.begin(), trace.end(), "keep 8"), trace.end());
  // DeepSpeed's default: every unit's forward is within 1e9 elements of its backward.
  EXPECT_EQ(stats[1000000000].kept_for_reuse, (steps - 1) * units);
  EXPECT_EQ(stats[1000000000].fetches, steps * 2 * units - (steps - 1) * units);
  std::printf(
      "fetches in %d steps: reuse 0: %lld, 300: %lld, 1e9: %lld; bytes sent in the last step: "
      "%lld, %lld, %lld\n",
      steps, (long long)stats[0].fetches, (long long)stats[300].fetches,
      (long long)stats[1000000000].fetches, (long long)sent[0], (long long)sent[300],
      (long long)sent[1000000000]);
  EXPECT_EQ(max_abs_diff(trained[300], trained[0]), 0.0);
  EXPECT_EQ(max_abs_diff(trained[1000000000], trained[0]), 0.0);
}

// A graph built while one set of units was fetched, whose backward runs after fetch_units()
// replaced them: the hooks on the old units' outputs must say so, not touch a dead fetcher.
TEST(ZeroStage3Fetch, BackwardAfterTheUnitsWereRedeclaredIsAnError) {
  run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    auto e = dtrain::zero::initialize(Net(), config(0, 1000000, 5000), {pg});
    auto& net = *e.module();
    e.fetch_units({net.body.ptr(), net.head.ptr()});
    auto b = batch(0, 0);
    auto h = e.fetch(*net.body, [&] { return net.body->forward(b.x); });
    auto loss =
        functional::cross_entropy(e.fetch(*net.head, [&] { return net.head->forward(h); }), b.y);
    e.fetch_units({net.body.ptr(), net.head.ptr()});
    try {
      e.backward(loss);
      FAIL() << "expected an error";
    } catch (const std::exception& err) {
      EXPECT_NE(std::string(err.what()).find("no longer fetches it"), std::string::npos)
          << err.what();
    }
  });
}

}  // namespace
