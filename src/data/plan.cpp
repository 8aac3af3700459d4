#include "data/plan.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>

#include "dtrain/data_table.h"
#include "dtrain/error.h"
#include "dtrain/sampler.h"

namespace dtrain::data::detail {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The epoch's order of all row groups: DistributedSampler on one replica is exactly
// randperm(n) seeded with seed + epoch (or 0..n-1), as ElasticSampler::global_order() takes it.
std::vector<int64_t> group_order(int64_t n, int64_t epoch, const SplitOptions& o) {
  DistributedSampler whole(n, {.num_replicas = 1, .rank = 0, .shuffle = o.shuffle, .seed = o.seed});
  whole.set_epoch(epoch);
  return whole.indices();
}

// Rank k's share of a list dealt round robin.
std::vector<Piece> dealt(const std::vector<Piece>& all, int k, int world) {
  std::vector<Piece> out;
  for (size_t i = static_cast<size_t>(k); i < all.size(); i += static_cast<size_t>(world))
    out.push_back(all[i]);
  return out;
}

int64_t rows_of(const std::vector<Piece>& pieces) {
  int64_t n = 0;
  for (const auto& p : pieces) n += p.rows();
  return n;
}

}  // namespace

RankPlan distributed_plan(const std::vector<int64_t>& group_rows, int64_t epoch,
                          const SplitOptions& o) {
  const auto n = static_cast<int64_t>(group_rows.size());
  RankPlan plan;
  if (n == 0) return plan;
  DistributedSampler mine(n, {.num_replicas = o.num_replicas,
                              .rank = o.rank,
                              .shuffle = o.shuffle,
                              .seed = o.seed,
                              .drop_last = o.drop_last});
  mine.set_epoch(epoch);
  const std::vector<int64_t> order = group_order(n, epoch, o);
  const int64_t total = mine.total_size();
  // Rank k's row groups: DistributedSampler's padded (or truncated) list, every W-th from k.
  auto groups_of = [&](int k) {
    std::vector<int64_t> g;
    for (int64_t j = k; j < total; j += o.num_replicas) g.push_back(order[j % n]);
    return g;
  };
  std::vector<int64_t> rank_rows(static_cast<size_t>(o.num_replicas), 0);
  for (int k = 0; k < o.num_replicas; ++k)
    for (int64_t g : groups_of(k)) rank_rows[k] += group_rows[g];
  const std::vector<int64_t> my_groups = groups_of(o.rank);
  DTRAIN_ASSERT(my_groups == mine.indices(), "row groups differ from DistributedSampler's");
  const int64_t target = o.drop_last ? *std::min_element(rank_rows.begin(), rank_rows.end())
                                     : *std::max_element(rank_rows.begin(), rank_rows.end());
  if (target > 0 && rank_rows[o.rank] == 0) {
    throw DataError("data: rank " + std::to_string(o.rank) + " of " +
                    std::to_string(o.num_replicas) +
                    " gets only empty row groups, so it has no rows to read while others have " +
                    std::to_string(target) +
                    ": write the table with at least as many non-empty row groups as ranks");
  }
  // This rank's rows, repeated from its start (padding) or cut (drop_last) to `target`.
  int64_t left = target;
  while (left > 0) {
    for (int64_t g : my_groups) {
      if (left == 0) break;
      const int64_t take = std::min(left, group_rows[g]);
      if (take == 0) continue;
      plan.pieces.push_back({g, 0, take});
      left -= take;
    }
  }
  plan.rows = target;
  plan.steps = ceil_div(target, o.batch_size);
  return plan;
}

std::vector<Piece> epoch_start(const std::vector<int64_t>& group_rows, int64_t epoch,
                               const SplitOptions& o) {
  std::vector<Piece> all;
  for (int64_t g : group_order(static_cast<int64_t>(group_rows.size()), epoch, o))
    if (group_rows[g] > 0) all.push_back({g, 0, group_rows[g]});
  return all;
}

RankPlan elastic_plan(const std::vector<Piece>& remaining, const SplitOptions& o) {
  RankPlan plan;
  int64_t longest = 0;
  for (int k = 0; k < o.num_replicas; ++k)
    longest = std::max(longest, rows_of(dealt(remaining, k, o.num_replicas)));
  plan.pieces = dealt(remaining, o.rank, o.num_replicas);
  plan.rows = rows_of(plan.pieces);
  plan.steps = ceil_div(longest, o.batch_size);
  return plan;
}

std::vector<Piece> elastic_after(const std::vector<Piece>& remaining, int64_t steps,
                                 const SplitOptions& o) {
  std::vector<Piece> left;
  for (int k = 0; k < o.num_replicas; ++k) {
    int64_t skip = steps * o.batch_size;
    for (Piece p : dealt(remaining, k, o.num_replicas)) {
      const int64_t cut = std::min(skip, p.rows());
      skip -= cut;
      p.begin += cut;
      if (p.rows() > 0) left.push_back(p);
    }
  }
  return left;
}

std::vector<int64_t> row_permutation(int64_t rows, uint64_t seed, int64_t epoch, int64_t group,
                                     bool shuffle) {
  if (!shuffle || rows <= 1) return {};
  // splitmix64 over (seed, epoch, group): one independent stream per row group and epoch.
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const uint64_t s =
      mix(mix(mix(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(group));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(s);
  torch::Tensor perm = torch::randperm(rows, gen, torch::TensorOptions().dtype(torch::kLong));
  const int64_t* p = perm.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + rows);
}

}  // namespace dtrain::data::detail
