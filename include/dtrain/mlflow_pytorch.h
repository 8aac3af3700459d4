// dtrain::mlflow state dicts in the format of MLflow's PyTorch flavor: what a C++ program logs,
// Python's mlflow.pytorch.load_state_dict reads, and what Python's mlflow.pytorch.log_state_dict
// logs, a C++ program reads.
//
//   // C++: train, then log the weights (rank 0 only, as every dtrain::mlflow call)
//   dtrain::mlflow::log_state_dict(run, *model, "state_dict");
//   // Python: evaluate or serve
//   //   sd = mlflow.pytorch.load_state_dict(f"runs:/{run_id}/state_dict")
//   //   net.load_state_dict(sd)   # net: the same architecture written with torch.nn
//   // C++: load what either side logged
//   dtrain::mlflow::load_state_dict(*model, "runs:/" + run_id + "/state_dict");
//
// The artifact is MLflow's: `<artifact_path>/state_dict.pth`, torch.save's zip format of an
// OrderedDict name -> tensor, which torch.load(weights_only=True) (torch 2.x's default) reads.
// The names are PyTorch's `state_dict()` keys, as dtrain::state_dict(module) (dtrain/checkpoint.h)
// gives them: a C++ module and the same architecture in torch.nn have the same keys when their
// submodules are registered under the same names (a Sequential's "0", "1", ... on both sides).
// See docs/tracking.md.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <string>

#include "dtrain/checkpoint.h"  // StateDict, state_dict(module), load_state_dict(module, dict)
#include "dtrain/mlflow.h"

namespace dtrain::mlflow {

// mlflow.pytorch.log_state_dict(state_dict, artifact_path): uploads
// `<artifact_path>/state_dict.pth` (empty `artifact_path`: state_dict.pth at the top) to the
// run. Tensors are saved from the CPU (a CUDA tensor loads back onto the CPU) with their own
// elements only (a view does not carry its base). A no-op when the run is inactive (off rank 0);
// an upload that fails is a warning, as Run::log_artifact. Throws UsageError for a dtype
// torch.save's format as dtrain writes it lacks (float64/32/16, bfloat16, int64/32/16/8, uint8
// and bool are written). Pass the unwrapped module, not the DDP wrapper.
void log_state_dict(Run& run, const torch::nn::Module& module, const std::string& artifact_path);
void log_state_dict(Run& run, const StateDict& state_dict, const std::string& artifact_path);

struct LoadStateDictOptions {
  // For runs:/ URIs and mlflow-artifacts: URIs without a host. Default: MLFLOW_TRACKING_URI.
  std::string tracking_uri;
  // Each request to the server (the file's download included) gives up after this.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

// mlflow.pytorch.load_state_dict(state_dict_uri): reads `<uri>/state_dict.pth`, where `uri` is
// runs:/<run id>/<artifact path>, mlflow-artifacts:/<path> (or ://host:port/<path>), or a local
// directory (file:/// or a plain path). Reads what Python's torch.save writes for a state dict
// (an OrderedDict or dict of str -> tensor; views, non-contiguous tensors and tensors sharing a
// storage keep their layout and sharing). Throws UsageError (one line, naming the URI or key)
// when the run or file is not there, the file is not torch.save's format, or it holds something
// other than str -> tensor (a checkpoint dict with an optimizer or an epoch: load it in Python);
// NetworkError when the server cannot be reached.
StateDict load_state_dict(const std::string& uri, const LoadStateDictOptions& options = {});

// Module.load_state_dict(mlflow.pytorch.load_state_dict(uri), strict=True): the two together,
// through dtrain::load_state_dict (dtrain/checkpoint.h): a key the module lacks or the state dict
// lacks, or a shape that differs, is a UsageError of one line naming the URI and the key,
// raised before anything is copied (the module is left as it was). Non-strict:
// dtrain::load_state_dict(module, load_state_dict(uri), /*strict=*/false).
void load_state_dict(torch::nn::Module& module, const std::string& uri,
                     const LoadStateDictOptions& options = {});

}  // namespace dtrain::mlflow
