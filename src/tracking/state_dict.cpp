// dtrain::mlflow state dicts as mlflow.pytorch logs and loads them (see dtrain/mlflow_pytorch.h).
// The file format is src/zero/pickle.h's torch.save writer and reader.
#include <unistd.h>

#include <filesystem>
#include <set>

#include "core/params.h"
#include "dtrain/mlflow_pytorch.h"
#include "dtrain/zero.h"
#include "tracking/artifacts.h"
#include "zero/pickle.h"

namespace fs = std::filesystem;
namespace pickle = dtrain::zero::detail;

namespace dtrain::mlflow {
namespace {

// mlflow.pytorch._TORCH_STATE_DICT_FILE_NAME
constexpr const char* kStateDictFile = "state_dict.pth";

std::string tracking_uri_of(const LoadStateDictOptions& options) {
  if (!options.tracking_uri.empty()) return options.tracking_uri;
  return param::String{"MLFLOW_TRACKING_URI", ""}.get();  // as Run::start reads it
}

}  // namespace

void log_state_dict(Run& run, const torch::nn::Module& module, const std::string& artifact_path) {
  if (!run.active()) return;
  log_state_dict(run, dtrain::state_dict(module), artifact_path);
}

void log_state_dict(Run& run, const StateDict& state_dict, const std::string& artifact_path) {
  if (!run.active()) return;
  // The writer knows the dtypes it has a torch.<X>Storage name for; ask it with an empty tensor
  // rather than keep a second list here, so a dtype it lacks is the caller's error, named.
  std::set<torch::Dtype> checked;
  for (const auto& item : state_dict) {
    const torch::Tensor& t = item.value();
    if (!t.defined()) {
      throw UsageError("mlflow log_state_dict: the tensor '" + item.key() +
                       "' is undefined; leave it out of the state dict");
    }
    if (!checked.insert(t.scalar_type()).second) continue;
    try {
      pickle::torch_save(*pickle::py_tensor(torch::empty({0}, t.options().device(torch::kCPU))));
    } catch (const InternalError&) {
      throw UsageError("mlflow log_state_dict: the tensor '" + item.key() + "' is of dtype " +
                       std::string(c10::toString(t.scalar_type())) +
                       ", which dtrain cannot write in torch.save's format; convert it (to "
                       "float32, for one)");
    }
  }
  const fs::path dir = fs::temp_directory_path() /
                       ("dtrain-state-dict-" + std::to_string(::getpid()) + "-" + run.id());
  fs::create_directories(dir);
  try {
    zero::save_state_dict(state_dict, (dir / kStateDictFile).string());  // an OrderedDict
    run.log_artifact(dir.string(), artifact_path);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    throw;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

StateDict load_state_dict(const std::string& uri, const LoadStateDictOptions& options) {
  const std::string bytes =
      detail::read_artifact_file(uri, kStateDictFile, tracking_uri_of(options), options.timeout);
  const std::string where = uri + (uri.empty() || uri.back() == '/' ? "" : "/") + kStateDictFile;
  pickle::PyPtr value;
  try {
    value = pickle::torch_load(std::vector<char>(bytes.begin(), bytes.end()), where);
  } catch (const pickle::CheckpointError& e) {
    throw UsageError(std::string("mlflow load_state_dict: ") + e.what());
  }
  if (value->kind != pickle::PyValue::Kind::Dict) {
    throw UsageError("mlflow load_state_dict: " + where + " holds a " + value->describe() +
                     ", not a state dict (a dict of name -> tensor, as Module.state_dict() gives)");
  }
  StateDict out;
  for (const auto& [key, v] : value->dict) {
    if (key->kind != pickle::PyValue::Kind::Str) {
      throw UsageError("mlflow load_state_dict: " + where + " has a key of type " +
                       key->describe() + "; a state dict's keys are str");
    }
    if (v->kind != pickle::PyValue::Kind::Tensor) {
      throw UsageError("mlflow load_state_dict: the entry '" + key->s + "' of " + where + " is a " +
                       v->describe() +
                       ", not a tensor: dtrain reads state dicts of tensors (a model's "
                       "state_dict()); log the model's own state dict, or read this one in Python");
    }
    if (out.contains(key->s)) {
      throw UsageError("mlflow load_state_dict: " + where + " has the key '" + key->s + "' twice");
    }
    out.insert(key->s, v->tensor);
  }
  return out;
}

void load_state_dict(torch::nn::Module& module, const std::string& uri,
                     const LoadStateDictOptions& options) {
  const StateDict dict = load_state_dict(uri, options);
  try {
    dtrain::load_state_dict(module, dict, /*strict=*/true);
  } catch (const UsageError& e) {
    throw UsageError("mlflow load_state_dict: " + uri + ": " + e.what());
  }
}

}  // namespace dtrain::mlflow
