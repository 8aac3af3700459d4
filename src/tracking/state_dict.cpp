// dtrain::mlflow state dicts as mlflow.pytorch logs and loads them (see dtrain/mlflow_pytorch.h).
// The file format is src/zero/pickle.h's torch.save writer and reader.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "core/params.h"
#include "dtrain/mlflow_pytorch.h"
#include "tracking/artifacts.h"
#include "zero/pickle.h"

namespace fs = std::filesystem;
namespace pickle = dtrain::zero::detail;

namespace dtrain::mlflow {
namespace {

// mlflow.pytorch._TORCH_STATE_DICT_FILE_NAME
constexpr const char* kStateDictFile = "state_dict.pth";

// Module._save_to_state_dict's order: own parameters, own buffers, then each child's.
void collect(const torch::nn::Module& m, const std::string& prefix, StateDict& out) {
  for (const auto& p : m.named_parameters(/*recurse=*/false))
    if (p.value().defined()) out.insert(prefix + p.key(), p.value().detach());
  for (const auto& b : m.named_buffers(/*recurse=*/false))
    if (b.value().defined()) out.insert(prefix + b.key(), b.value().detach());
  for (const auto& c : m.named_children()) collect(*c.value(), prefix + c.key() + ".", out);
}

std::string shape(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

// "'a', 'b', 'c' and 4 more": every key of a one-line error, up to a readable count.
std::string key_list(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 8;
  std::string s;
  for (size_t k = 0; k < keys.size() && k < kShown; ++k) s += (k ? ", '" : "'") + keys[k] + "'";
  if (keys.size() > kShown) s += " and " + std::to_string(keys.size() - kShown) + " more";
  return s;
}

std::string tracking_uri_of(const LoadOptions& options) {
  if (!options.tracking_uri.empty()) return options.tracking_uri;
  return param::String{"MLFLOW_TRACKING_URI", ""}.get();  // as Run::start reads it
}

}  // namespace

StateDict state_dict(const torch::nn::Module& module) {
  StateDict out;
  collect(module, "", out);
  return out;
}

void log_state_dict(Run& run, const torch::nn::Module& module, const std::string& artifact_path) {
  if (!run.active()) return;
  log_state_dict(run, state_dict(module), artifact_path);
}

void log_state_dict(Run& run, const StateDict& state_dict, const std::string& artifact_path) {
  if (!run.active()) return;
  auto dict = pickle::py_dict(/*ordered=*/true);  // state_dict() is an OrderedDict
  std::set<torch::Dtype> checked;
  for (const auto& item : state_dict) {
    const torch::Tensor& t = item.value();
    if (!t.defined()) {
      throw UsageError("mlflow log_state_dict: the tensor '" + item.key() +
                       "' is undefined; leave it out of the state dict");
    }
    // The writer knows the dtypes it has a torch.<X>Storage name for; ask it with an empty tensor
    // rather than keep a second list here.
    if (checked.insert(t.scalar_type()).second) {
      try {
        pickle::torch_save(*pickle::py_tensor(torch::empty({0}, t.options().device(torch::kCPU))));
      } catch (const InternalError&) {
        throw UsageError("mlflow log_state_dict: the tensor '" + item.key() + "' is of dtype " +
                         std::string(c10::toString(t.scalar_type())) +
                         ", which dtrain cannot write in torch.save's format; convert it (to "
                         "float32, for one)");
      }
    }
    pickle::py_set(dict, item.key(), pickle::py_tensor(t));
  }
  const std::vector<char> bytes = pickle::torch_save(*dict);
  const fs::path dir = fs::temp_directory_path() /
                       ("dtrain-state-dict-" + std::to_string(::getpid()) + "-" + run.id());
  fs::create_directories(dir);
  {
    std::ofstream out(dir / kStateDictFile, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::error_code ec;
      fs::remove_all(dir, ec);
      throw Error("mlflow log_state_dict: cannot write " + (dir / kStateDictFile).string());
    }
  }
  try {
    run.log_artifact(dir.string(), artifact_path);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    throw;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

StateDict load_state_dict(const std::string& uri, const LoadOptions& options) {
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

void load_state_dict(torch::nn::Module& module, const StateDict& sd) {
  StateDict own = state_dict(module);
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& item : own) {
    const torch::Tensor* given = sd.find(item.key());
    if (given == nullptr) {
      missing.push_back(item.key());
    } else if (given->sizes() != item.value().sizes()) {
      mismatched.push_back(item.key() + "' (" + shape(*given) + " in the state dict, " +
                           shape(item.value()) + " in the module)");
    }
  }
  for (const auto& item : sd)
    if (!own.contains(item.key())) unexpected.push_back(item.key());
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::string what;
    auto add = [&](const std::string& part) { what += (what.empty() ? "" : "; ") + part; };
    if (!missing.empty()) add("missing key(s) " + key_list(missing));
    if (!unexpected.empty()) add("unexpected key(s) " + key_list(unexpected));
    for (const auto& m : mismatched) add("size mismatch for '" + m);
    throw UsageError("mlflow load_state_dict: the state dict does not fit the module " +
                     module.name() + ": " + what +
                     " (load it into the architecture it was saved from)");
  }
  torch::NoGradGuard no_grad;
  for (auto& item : own) item.value().copy_(sd[item.key()]);
}

void load_state_dict(torch::nn::Module& module, const std::string& uri,
                     const LoadOptions& options) {
  load_state_dict(module, load_state_dict(uri, options));
}

}  // namespace dtrain::mlflow
