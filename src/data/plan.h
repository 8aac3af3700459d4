// Which rows of a table each rank reads in an epoch (the split dtrain/data_reader.h describes),
// from the row groups' sizes alone: every rank computes every rank's plan, so they agree on the
// number of steps without talking. Pure logic over DistributedSampler / ElasticSampler.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::data::detail {

// Rows [begin, end) of row group `group`, in that group's row order for the epoch (permuted
// with shuffle: row_permutation()).
struct Piece {
  int64_t group = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t rows() const { return end - begin; }
  bool operator==(const Piece&) const = default;
};

struct SplitOptions {
  int num_replicas = 1;
  int rank = 0;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  int64_t batch_size = 1;
};

// This rank's stream of rows for the epoch and the steps every rank takes.
struct RankPlan {
  std::vector<Piece> pieces;  // in reading order
  int64_t rows = 0;           // sum of the pieces' rows
  int64_t steps = 0;          // the same on every rank
};

// Distributed mode: DistributedSampler over row groups, then equal rows per rank (pad by
// repeating the rank's own rows from its start, or truncate to the smallest with drop_last).
// group_rows[i]: rows of row group i. Throws DataError when a rank would have no rows to pad
// from (more ranks than non-empty row groups can fill).
RankPlan distributed_plan(const std::vector<int64_t>& group_rows, int64_t epoch,
                          const SplitOptions& options);

// Elastic mode. `remaining`: the epoch's unread rows in global order (epoch_start() for a
// fresh epoch). Dealt round robin to the ranks; each step takes batch_size rows per rank.
std::vector<Piece> epoch_start(const std::vector<int64_t>& group_rows, int64_t epoch,
                               const SplitOptions& options);
RankPlan elastic_plan(const std::vector<Piece>& remaining, const SplitOptions& options);
// What is left of `remaining` after `steps` steps of every rank (same on every rank).
std::vector<Piece> elastic_after(const std::vector<Piece>& remaining, int64_t steps,
                                 const SplitOptions& options);

// The row order of row group `group` in `epoch`: randperm(rows) seeded by (seed, epoch, group)
// with shuffle, else empty (the identity).
std::vector<int64_t> row_permutation(int64_t rows, uint64_t seed, int64_t epoch, int64_t group,
                                     bool shuffle);

}  // namespace dtrain::data::detail
