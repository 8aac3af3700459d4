// Checkpoints: everything needed to resume a run exactly.
//
// save_checkpoint() writes, on rank 0 only (others return at once unless told otherwise),
// the unwrapped model's parameters and buffers, the optimizer's state, step, epoch, the
// sampler's epoch, the CPU RNG state and user metadata, atomically: it writes
// DIR/NAME.tmp.<pid>, fsyncs it, renames it over DIR/NAME and fsyncs DIR, so a crash mid-save
// leaves the last good checkpoint intact (and at most a stray NAME.tmp.<pid>, which
// latest_checkpoint() ignores). load_checkpoint() works on every rank. The optimizer comes
// back with its per-parameter state and its param groups' options (lr, betas...), as
// Python's load_state_dict() does; libtorch's Optimizer::load() alone drops the options. A run
// stopped after step k and resumed from its checkpoint ends with bitwise the parameters of an
// uninterrupted run (CPU), provided the training loop is deterministic given the RNG state and the
// sampler's epoch.
#pragma once

#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>

namespace dtrain {

struct TrainingState {
  int64_t step = 0;   // optimizer steps taken
  int64_t epoch = 0;  // the epoch to resume in
  int64_t sampler_epoch = 0;
  int64_t batch_in_epoch = 0;                   // batches of `epoch` already done
  std::map<std::string, std::string> metadata;  // anything else (config, metrics)
};

struct SaveOptions {
  // Write from this rank only. Default: 0. -1 = every rank writes (to its own path).
  int writer_rank = 0;
  // The caller's rank. Default: the default group's rank if one exists, else RANK, else 0.
  std::optional<int> rank;
  bool save_rng = true;  // Default: true (torch's default CPU generator state).
  // fsync the file and its directory, so the checkpoint survives a crash of the machine.
  // false: still atomic (write, rename) for processes, no fsync - for a tmpfs (/dev/shm),
  // where there is nothing to sync. Default: true.
  bool durable = true;
};

// Writes `path` atomically (see above). Returns true on the rank that wrote.
// Throws Error with the path and errno text when the directory is not writable.
bool save_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer, const TrainingState& state,
                     const SaveOptions& options = {});

struct LoadOptions {
  bool load_rng = true;  // Default: true: restore the CPU generator state saved with it.
};

// Loads into `model` (and `optimizer` if given) and returns the training state. Throws
// UsageError naming the path when it does not exist, and Error when it is not a dtrain
// checkpoint or the model's parameter names/shapes do not match (naming the first one).
TrainingState load_checkpoint(const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer* optimizer, const LoadOptions& options = {});

// A model's state dict, as PyTorch's module.state_dict(): its parameters and buffers by
// dotted name in PyTorch's order (each module's parameters, then its buffers, then its
// children's, depth first; undefined ones left out), detached, sharing storage with the model
// (clone() it to keep a copy). What the Distributor returns for a trained model.
using StateDict = torch::OrderedDict<std::string, torch::Tensor>;
StateDict state_dict(const torch::nn::Module& model);

// Copies `dict` into the model's parameters and buffers (no autograd; the dtype converts as
// copy_ converts it). Throws UsageError naming the first entry that is missing, unexpected or of
// another shape, before copying anything (the model is left as it was). strict = false ignores
// missing and unexpected names (shapes must still agree).
void load_state_dict(torch::nn::Module& model, const StateDict& dict, bool strict = true);

// The newest checkpoint file in `dir` matching `prefix*.pt` by step number in its name
// (PREFIX<step>.pt), or nullopt if none.
std::optional<std::string> latest_checkpoint(const std::string& dir,
                                             const std::string& prefix = "ckpt_");

}  // namespace dtrain
