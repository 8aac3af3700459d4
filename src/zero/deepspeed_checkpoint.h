// DeepSpeed's own ZeRO checkpoints (and dtrain's, which share their layout) read as dtrain's
// engine and `dtrain zero to-fp32` need them: the consolidated fp32 module, the parameters in
// the saved order, a checkpoint of DeepSpeed's read whole into dtrain's dicts, and the frozen
// parameters as DeepSpeed's zero_to_fp32 puts them together.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "zero/checkpoint_files.h"
#include "zero/pickle.h"
#include "zero/saved_optimizer.h"

namespace dtrain::zero::ckpt {

// A DeepSpeed checkpoint as the dicts load_state reads: the module from the fp32 master
// (consolidated_state_dict), DeepSpeed's steps and scheduler position, and (stages 1-2, Adam or
// SGD) every rank's partition of the optimizer state from its base_optimizer_state.
// `names`, `numels`: the engine's parameters in its flat order.
// `ds_value`: the model file (at `model_path`) as read, `ds` that as a dict.
std::pair<c10::impl::GenericDict, std::vector<c10::impl::GenericDict>> from_deepspeed(
    const fs::path& dir, const std::string& tag, const c10::impl::GenericDict& ds,
    const PyValue& ds_value, const fs::path& model_path, const std::vector<std::string>& names,
    const std::vector<int64_t>& numels, const std::string& type,
    const std::vector<std::string>& state_names, bool optimizer);

// The parameters' names and shapes, per group: DeepSpeed's param_shapes (a list of
// OrderedDicts name -> torch.Size), or dtrain's older param_names + param_shapes lists.
using SavedGroups = std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>>;
SavedGroups saved_parameters(const PyValue& model, const fs::path& model_path);

// The module of a model file (as read, at `model_path`) from the fp32 master of the optimizer
// files beside it in `ckpt` (consolidated_state_dict's work, from a file read once).
torch::OrderedDict<std::string, torch::Tensor> consolidated(const PyValue& model_file,
                                                            const fs::path& model_path,
                                                            const fs::path& ckpt);

// DeepSpeed's checkpoint's parameters (its model file `model`) in its order, placed by name in
// the engine's flat order (`names`, `offsets`, `numels`); nullopt when they are not the
// engine's parameters (another name, count or size).
std::optional<SavedOrder> saved_order(const PyValue& model, const fs::path& model_path,
                                      const std::vector<std::string>& names,
                                      const std::vector<int64_t>& offsets,
                                      const std::vector<int64_t>& numels);

// Why DeepSpeed's checkpoint in `ckpt` (its model file `model`, at `model_path`) cannot be read
// in parts (load_own_part's `deepspeed`); "" when it can: optimizer files of stages 1-3, rank
// 0's of one parameter group at stages 1-2, holding exactly the optimizer's `state_names`, and
// the engine's parameters (`names`, `numels`) in any order (saved_order places them). Anything
// else from_deepspeed reads whole (it also reads stage 0 and the other layouts or says why
// not). kStageZero: the checkpoint has no optimizer files.
inline constexpr const char* kStageZero = "stage 0";
std::string why_not_streamed(const fs::path& ckpt, const PyValue& model, const fs::path& model_path,
                             const std::vector<std::string>& names,
                             const std::vector<int64_t>& numels,
                             const std::vector<std::string>& state_names, const std::string& type);

// A checkpoint's frozen parameters as DeepSpeed's zero_to_fp32 puts them together
// (_zero2_merge_frozen_params, _zero3_merge_frozen_params): name -> the whole parameter, in its
// saved dtype, for the names in `wanted` (every one when empty). `model` is the model file at
// `model_path`. A stage-3 checkpoint (`model_path` is rank 0's zero_pp_rank_0 file) holds each
// as every saved rank's piece in that rank's model file, the pieces concatenated and cut to the
// parameter's size; a stage-2 one whole in its one model file. Nothing where the file has no
// frozen_param_shapes (stages 0-1, and dtrain's checkpoints before they were written).
std::map<std::string, torch::Tensor> frozen_params(const PyValue& model, const fs::path& model_path,
                                                   const std::set<std::string>& wanted);

}  // namespace dtrain::zero::ckpt
