// The GPUs a local search hands its trials (Tuner::fit, local mode), as a Ray node's raylet hands
// GPU instances to placement-group bundles (Ray 2.60, ResourceInstanceSet::TryAllocate):
//
//   - The node has N GPU instances of capacity 1 (TuneOptions::num_gpus), counted in units of
//     1/10000 as Ray's FixedPoint counts them (0.3 + 0.3 + 0.3 leaves 0.1, not 0.0999...).
//   - A request of g GPUs takes, while g >= 1, whole free instances, lowest id first; what is
//     left below 1 (all of g < 1; the Tuner refuses 1.5 as Ray does) goes to the best fit: the
//     instance whose free capacity exceeds it by the least (the lowest id on a tie). So fractions
//     pack: two trials of 0.5 share GPU 0 before any uses GPU 1. When any part does not fit,
//     nothing is taken (the trial waits).
//   - A trial's ids are the instances it holds any part of, lowest first; they are released when
//     its run ends (finished, stopped, failed, or paused by PBT), and a restarted run acquires
//     anew.
// The ids are indices 0..N-1. visible_devices() names them as the trial's processes see them:
// the entries of the driver's CUDA_VISIBLE_DEVICES at those indices when it is set (Ray's worker
// maps its ids through the list it started with; an index past the list's end gives the whole
// list, as there), else the indices themselves.
// Not thread-safe: the driver thread owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::tune::detail {

class GpuPool {
 public:
  static constexpr std::int64_t kUnit = 10000;  // Ray's RESOURCE_UNIT_SCALING

  // `gpus` instances, each free.
  explicit GpuPool(int gpus);

  // Units per instance a request took (0 where none); empty: nothing taken.
  using Allocation = std::vector<std::int64_t>;

  // `units` (> 0) GPUs' worth, as Ray allocates it; nullopt when it does not fit now.
  std::optional<Allocation> acquire(std::int64_t units);
  // Gives back what acquire() returned.
  void release(const Allocation& a);

  // The ids (indices) an allocation holds a part of, ascending.
  static std::vector<int> ids(const Allocation& a);
  // What the trial's CUDA_VISIBLE_DEVICES is, from `ids` and the driver's list (nullopt: unset).
  static std::string visible_devices(const std::vector<int>& ids,
                                     const std::optional<std::string>& driver_list);

  int size() const { return static_cast<int>(free_.size()); }

 private:
  std::vector<std::int64_t> free_;  // free units per instance
};

// g GPUs in the pool's units (Ray rounds to 1/10000).
std::int64_t gpu_units(double gpus);

}  // namespace dtrain::tune::detail
