// What a ZeRO stage partitions across the N ranks, and which part of the flat buffer a rank
// updates: the one place that gives the stage numbers their meaning (DeepSpeed's
// stage_1_and_2.py and stage3.py; the ZeRO paper's P_os, P_os+g, P_os+g+p). The engine asks
// these questions instead of comparing stage numbers.
//
//   stage | optimizer state | gradients            | parameters
//   ------+-----------------+----------------------+---------------------------------------
//     0   | full, per rank  | full, all-reduced    | full
//     1   | 1/N             | full, reduced to the | full; updated partitions all-gathered
//         |                 | partition's owner    |
//     2   | 1/N             | 1/N (reduced during  | full; updated partitions all-gathered
//         |                 | backward in buckets) |
//     3   | 1/N             | 1/N                  | 1/N, gathered around forward/backward
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "dtrain/error.h"
#include "dtrain/zero_config.h"

namespace dtrain::zero::detail {

// How a rank's averaged gradient reaches its update at the step.
enum class GradientPath {
  kAllReduce,       // the full flat gradient is all-reduced; every rank updates everything
  kReduceToOwners,  // the full flat gradient's partitions are reduced to their owners (during
                    // the boundary backward with overlap_comm, else at the step)
  kPartition,       // reduced bucket by bucket during backward into this rank's partition
};

// The flat buffer's length, padded so that N ranks' partitions are equal and start where
// DeepSpeed's stage 1/2 partitions start: a multiple of 2 x N (its nccl_start_alignment_factor
// of 2 elements per rank), so that each rank's optimizer file holds the elements DeepSpeed's
// engine loads into that rank.
inline int64_t padded_numel(int64_t numel, int world) {
  const int64_t align = 2 * static_cast<int64_t>(world);
  return (numel + align - 1) / align * align;
}

class Partitioning {
 public:
  // REQUIRES: 0 <= stage <= 3 (the config's range).
  static Partitioning for_stage(int stage) {
    DTRAIN_ASSERT(stage >= 0 && stage <= 3, "ZeRO stage out of range");
    return Partitioning(stage >= 1, stage >= 2, stage >= 3);
  }

  // The fp32 master copy and the optimizer state hold this rank's 1/N.
  bool optimizer() const { return optimizer_; }
  // A rank keeps only its partition's (reduced) gradients; the full .grad is released.
  bool gradients() const { return gradients_; }
  // Between uses a rank holds its 1/N of the parameters; they are gathered around forward and
  // backward.
  bool parameters() const { return parameters_; }

  GradientPath gradient_path() const {
    return gradients_   ? GradientPath::kPartition
           : optimizer_ ? GradientPath::kReduceToOwners
                        : GradientPath::kAllReduce;
  }
  // Buckets of gradients are reduced during backward: always when gradients are partitioned;
  // with a partitioned optimizer only under overlap_comm, in place in the model's full-precision
  // dtype (`in_model_dtype`: fp16/bf16's 16-bit gradients, or ones rounded to another
  // communication dtype, are reduced at the step), with peers to reduce with.
  bool reduces_in_backward(const ZeroOptimizationConfig& z, int world, bool in_model_dtype) const {
    return gradients_ || (optimizer_ && z.overlap_comm && world > 1 && in_model_dtype);
  }
  // After the step every rank's updated partition is all-gathered into the full parameters
  // (stages 1-2; stage 3 gathers when the parameters are next used).
  bool gathers_after_step() const { return optimizer_ && !parameters_; }
  // Each rank holds a part of the gradient, so the step's scalars (fp16 overflow flag, global
  // norm, Lamb's trust-ratio norms) are combined over the ranks.
  bool combines_step_scalars() const { return optimizer_; }

  // Without ZeRO (stage 0) DeepSpeed's 16-bit training runs its FP16_Optimizer, which steps once
  // on zero gradients when it is built (its state's step count then runs one ahead).
  bool deepspeed_zero_gradient_first_step(bool mixed) const { return !optimizer_ && mixed; }

  // DeepSpeed runs these stages with stage_1_and_2.py's optimizer (state partitioned,
  // parameters whole), whose checkpoint keys (single_partition_of_fp32_groups) apply.
  bool deepspeed_stage_1_and_2() const { return optimizer_ && !parameters_; }

  // Where this rank's update starts in the flat order ([offset, offset + its length)).
  int64_t update_offset(int rank, int64_t part) const { return optimizer_ ? rank * part : 0; }
  // The part of a full (padded) flat tensor this rank updates: all of it, or its partition.
  torch::Tensor mine(const torch::Tensor& full, int rank, int64_t part) const {
    return optimizer_ ? full.narrow(0, rank * part, part) : full;
  }

 private:
  Partitioning(bool optimizer, bool gradients, bool parameters)
      : optimizer_(optimizer), gradients_(gradients), parameters_(parameters) {}
  bool optimizer_, gradients_, parameters_;
};

}  // namespace dtrain::zero::detail
