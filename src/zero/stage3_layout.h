// DeepSpeed's stage-3 checkpoint layout next to dtrain's stage-3 partition.
//
// dtrain's stage 3 cuts the flat parameter order (every parameter's elements, in order, padded
// to a multiple of the world size N) into N equal contiguous parts. DeepSpeed's stage 3
// partitions every parameter on its own: rank r holds elements [r*p, min((r+1)*p, n)) of a
// parameter of n elements, p = ceil(n / N), zero-padded to p, and its flat group is those
// pieces in the parameters' order (sum of p over the parameters). Checkpoints of stage 3 are
// written in DeepSpeed's layout (fp32_flat_groups), so that DeepSpeed's zero_to_fp32 reads them;
// these functions convert between the two.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtrain {
class ProcessGroup;
}

namespace dtrain::zero::detail {

// DeepSpeed's zero3_partitioned_param_info: the elements each rank holds of a parameter of
// `numel` elements over `world` ranks (ceil(numel / world)).
int64_t per_parameter_part(int64_t numel, int world);

// This rank's DeepSpeed stage-3 flat group from dtrain's partitions: `part` is this rank's
// contiguous part of the padded flat order (elements [rank*P, (rank+1)*P), P = part.numel()),
// `numels` every parameter's size in the flat order. Collective over `group` (every rank calls
// it with the same numels, in the same order relative to its other collectives); the parts are
// exchanged in chunks of at most `chunk` elements per rank, so the extra memory is about
// world * chunk elements whatever the model's size. Returns a CPU tensor of part's dtype.
torch::Tensor to_per_parameter(const std::shared_ptr<ProcessGroup>& group,
                               const torch::Tensor& part, const std::vector<int64_t>& numels,
                               int64_t chunk = 1 << 22);

// The flat order (sum of numels elements, unpadded) from every saved rank's DeepSpeed stage-3
// flat group, in rank order. Throws CheckpointError naming `where` when a group is shorter
// than the parameters need or of another length than the others.
torch::Tensor from_per_parameter(const std::vector<torch::Tensor>& flats,
                                 const std::vector<int64_t>& numels, const std::string& where);

// One saved rank's share of that: copies into `part` (the elements [lo, lo + part.numel()) of
// the flat order) those that rank `r`'s DeepSpeed stage-3 flat group `flat` (of `world` ranks)
// holds, so that a rank reads the files one at a time and keeps only its own part. Throws
// CheckpointError naming `where` when `flat` is not as long as the parameters need.
void scatter_per_parameter(const torch::Tensor& flat, int r, int world,
                           const std::vector<int64_t>& numels, int64_t lo, torch::Tensor& part,
                           const std::string& where);

}  // namespace dtrain::zero::detail
