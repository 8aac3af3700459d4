// DeviceMesh: the world's ranks laid out as an n-dimensional array, with a process group per
// dimension - what 3D parallel training (data x pipeline x tensor) is organised by.
//
//   dtrain::DeviceMesh mesh({{"dp", 2}, {"pp", 2}, {"tp", 2}});   // 8 ranks
//   mesh.group("tp");        // this rank's tensor-parallel peers (2 ranks)
//   mesh.coordinate("pp");   // which pipeline stage this rank is
//
// Layout: row-major, the last dimension varying fastest. With dims (dp, pp, tp) that is
// Megatron-LM's layout: tensor-parallel peers have consecutive ranks, so under one launcher per
// host they share the host (tensor parallelism talks the most). Global rank of coordinates
// (c0, ..., cn-1) = sum_i c_i * prod_{j>i} size_j.
//
// Construction is collective: every rank of `world` constructs the same mesh at the same point
// (it calls new_group() once per group of every dimension, in the same order everywhere).
// Thread-safety: const methods are safe from any thread; the groups follow collectives.h.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/process_group.h"

namespace dtrain {

class DeviceMesh {
 public:
  // `dims`: (name, size) pairs, outermost first; names distinct and non-empty, sizes >= 1, and
  // the product of the sizes equal to world's size (UsageError otherwise, naming both).
  // `world`: the group whose ranks are laid out (default: the default group).
  explicit DeviceMesh(std::vector<std::pair<std::string, int>> dims,
                      std::shared_ptr<ProcessGroup> world = nullptr);

  // The dimensions, in the order given.
  const std::vector<std::pair<std::string, int>>& dims() const { return dims_; }
  int ndim() const { return static_cast<int>(dims_.size()); }
  // Size of a dimension; UsageError for an unknown name (listing the known ones).
  int size(const std::string& dim) const;
  // This rank's coordinate along `dim` (equal to its rank in group(dim)).
  int coordinate(const std::string& dim) const;
  // This rank's coordinates, in the order of dims().
  const std::vector<int>& coordinates() const { return coords_; }
  // The group of the ranks that differ from this one only along `dim`.
  const std::shared_ptr<ProcessGroup>& group(const std::string& dim) const;
  // Global ranks of group(dim), in group-rank order.
  std::vector<int> group_ranks(const std::string& dim) const;
  // The global rank at `coords` (one per dimension, each in range; UsageError otherwise).
  int rank_at(const std::vector<int>& coords) const;
  // This rank in the world group, and the world size.
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::shared_ptr<ProcessGroup>& world() const { return world_; }

 private:
  int index_of(const std::string& dim) const;

  std::vector<std::pair<std::string, int>> dims_;
  std::vector<int> coords_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;
  std::shared_ptr<ProcessGroup> world_;
  int rank_ = 0;
  int world_size_ = 1;
};

}  // namespace dtrain
