// The files of a ZeRO checkpoint in DeepSpeed's layout: their names, reading and writing them
// whole (torch.save zips of dicts, zero/pickle.h), the tag, and the fields every reader needs.
// The layout (what each file holds) is described in checkpoint_save.cpp.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "zero/pickle.h"

namespace dtrain::zero::ckpt {

namespace fs = std::filesystem;
using c10::IValue;
using detail::PyValue;

// Stages 0-2's one model file (stage 3: stage3_model_file).
inline constexpr const char* kModelFile = "mp_rank_00_model_states.pt";
// The DeepSpeed release whose checkpoint layout dtrain writes (its optimizer files' ds_version,
// which DeepSpeed's loader parses and compares).
inline constexpr const char* kDeepSpeedVersion = "0.19.8";

// Writes `data` to `path` and fsyncs it (the checkpoint's files are complete before `latest`
// names them).
void write_file_synced(const fs::path& path, const std::vector<char>& data);

// fsyncs a directory, so that the names written in it persist.
void sync_dir(const fs::path& dir);

// A torch.save file, read whole, as a Python value.
detail::PyPtr load_file(const fs::path& path);

// A torch.save file holding a dict, as an IValue dict.
c10::impl::GenericDict load_dict(const fs::path& path);

// An empty dict of string keys.
c10::impl::GenericDict new_dict();

// d[key]; a checkpoint `from` without it is an Error that says so.
IValue get(const c10::impl::GenericDict& d, const std::string& key, const fs::path& from);

// torch.save of `v` to `path`, fsynced.
void save_file(const fs::path& path, const detail::PyValue& v);

// The model file's dict with the keys DeepSpeed's zero_to_fp32 reads: param_shapes as one
// group's OrderedDict of name -> torch.Size, shared_params (buffer_names is model_dict's), and
// `frozen`'s frozen_param_shapes and frozen_param_fragments (deepspeed_frozen_params).
detail::PyPtr deepspeed_model_file(const IValue& model,
                                   const std::pair<detail::PyPtr, detail::PyPtr>& frozen);

// Rank `rank`'s optimizer file.
std::string optim_file(int rank);

// DeepSpeed's stage 3 writes one model file per rank.
std::string stage3_model_file(int rank);

// `tag`, or where it is empty the tag DIR/latest names ("" without one); a `latest` naming
// no directory of DIR is a CheckpointError.
std::string resolve_tag(const fs::path& dir, const std::string& tag);

// d[key] of a dtrain checkpoint `from` (an Error without it).
const PyValue& field(const PyValue& d, const std::string& key, const fs::path& from);

// d[key], which must be a tensor.
const PyValue* tensor_field(const PyValue& d, const std::string& key, const fs::path& from);

// d[key] of DeepSpeed's or dtrain's checkpoint `from` (a CheckpointError without it).
const PyValue& need(const PyValue& d, const std::string& key, const fs::path& from);

// A torch.Size's dimensions.
std::vector<int64_t> shape_of(const PyValue& v);

// The number of elements of a shape.
int64_t numel_of(const std::vector<int64_t>& shape);

// The optimizer files of a checkpoint directory, in rank order (DeepSpeed names bf16 runs'
// files bf16_zero_pp_rank_*).
std::vector<fs::path> optim_files(const fs::path& ckpt, int world);

// Whether the model file's module holds `name` as an empty tensor (a stage-3 file in
// DeepSpeed's layout, whose parameters live in the optimizer files).
bool module_parameter_is_empty(const c10::impl::GenericDict& d, const std::string& name,
                               const fs::path& model_path);

}  // namespace dtrain::zero::ckpt
