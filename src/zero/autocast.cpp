// torch_autocast: the engine's forward under torch.autocast, as DeepSpeed 0.19.8's
// autocast_if_enabled (runtime/torch_autocast.py) runs it, with torch.autocast's own
// __enter__/__exit__ steps on the thread's autocast state.
#include "zero/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <atomic>
#include <iostream>
#include <string>
#include <typeindex>
#include <utility>

#include "dtrain/error.h"
#include "dtrain/zero.h"

namespace dtrain::zero::detail {

namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
void set_enabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
c10::ScalarType dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
void set_dtype(c10::DeviceType d, c10::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }
// torch.autocast's supported dtypes on CPU and CUDA (its __init__ turns itself off for others).
bool supported(c10::DeviceType, c10::ScalarType t) {
  return t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Half;
}
#else  // libtorch 1.13: one function per device; CPU autocast takes bf16 only.
bool enabled(c10::DeviceType d) {
  return d == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void set_enabled(c10::DeviceType d, bool on) {
  d == c10::DeviceType::CUDA ? at::autocast::set_enabled(on) : at::autocast::set_cpu_enabled(on);
}
c10::ScalarType dtype(c10::DeviceType d) {
  return d == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                    : at::autocast::get_autocast_cpu_dtype();
}
void set_dtype(c10::DeviceType d, c10::ScalarType t) {
  d == c10::DeviceType::CUDA ? at::autocast::set_autocast_gpu_dtype(t)
                             : at::autocast::set_autocast_cpu_dtype(t);
}
bool supported(c10::DeviceType d, c10::ScalarType t) {
  return t == c10::ScalarType::BFloat16 ||
         (d == c10::DeviceType::CUDA && t == c10::ScalarType::Half);
}
#endif

// torch.nn's module classes libtorch has, by their Python names (the short one and the one
// DeepSpeed's defaults spell, with the defining module).
const std::vector<std::pair<std::string, std::type_index>>& torch_nn_classes() {
  using namespace torch::nn;
  static const std::vector<std::pair<std::string, std::type_index>> classes = {
      {"linear.Linear", typeid(LinearImpl)},
      {"linear.Bilinear", typeid(BilinearImpl)},
      {"conv.Conv1d", typeid(Conv1dImpl)},
      {"conv.Conv2d", typeid(Conv2dImpl)},
      {"conv.Conv3d", typeid(Conv3dImpl)},
      {"conv.ConvTranspose1d", typeid(ConvTranspose1dImpl)},
      {"conv.ConvTranspose2d", typeid(ConvTranspose2dImpl)},
      {"conv.ConvTranspose3d", typeid(ConvTranspose3dImpl)},
      {"sparse.Embedding", typeid(EmbeddingImpl)},
      {"sparse.EmbeddingBag", typeid(EmbeddingBagImpl)},
      {"normalization.LayerNorm", typeid(LayerNormImpl)},
      {"normalization.GroupNorm", typeid(GroupNormImpl)},
      {"batchnorm.BatchNorm1d", typeid(BatchNorm1dImpl)},
      {"batchnorm.BatchNorm2d", typeid(BatchNorm2dImpl)},
      {"batchnorm.BatchNorm3d", typeid(BatchNorm3dImpl)},
      {"activation.MultiheadAttention", typeid(MultiheadAttentionImpl)},
      {"rnn.LSTM", typeid(LSTMImpl)},
      {"rnn.GRU", typeid(GRUImpl)},
      {"rnn.RNN", typeid(RNNImpl)},
  };
  return classes;
}

std::type_index class_named(const std::string& name) {
  for (const auto& [path, type] : torch_nn_classes()) {
    const std::string cls = path.substr(path.find('.') + 1);
    if (name == "torch.nn." + cls || name == "torch.nn.modules." + path) return type;
  }
  std::string known;
  for (const auto& [path, type] : torch_nn_classes())
    known += (known.empty() ? "" : ", ") + path.substr(path.find('.') + 1);
  throw UsageError("zero::initialize: torch_autocast.lower_precision_safe_modules: \"" + name +
                   "\" is not a torch.nn class libtorch has (" + known +
                   "); a C++ module is matched by its libtorch class, so name torch.nn classes "
                   "only");
}

// DeepSpeed's one message per process (rank 0) when torch.autocast is on outside the engine.
void note_outer_autocast(int rank, bool configured, c10::DeviceType device) {
  static std::atomic<bool> noted{false};
  if (rank != 0 || noted.exchange(true)) return;
  const std::string where = c10::DeviceTypeName(device, /*lower_case=*/true);
  if (configured)
    std::cerr << "dtrain zero: note: torch.autocast is on (cuda) outside the engine: its forward "
                 "follows the config's torch_autocast section, as DeepSpeed 0.19.8's does\n";
  else
    std::cerr << "dtrain zero: note: torch.autocast is on (cuda) outside the engine, and the "
                 "config's torch_autocast section is off: the engine's forward runs with "
                 "autocast off on "
              << where
              << ", as DeepSpeed 0.19.8 runs it; enable torch_autocast in the config to "
                 "autocast it\n";
}

}  // namespace

std::unordered_set<const c10::TensorImpl*> lower_precision_safe_parameters(
    torch::nn::Module& module, const std::vector<std::string>& classes) {
  std::vector<std::type_index> types;
  for (const auto& name : classes.empty()
                              ? std::vector<std::string>{"torch.nn.Linear", "torch.nn.Conv1d",
                                                         "torch.nn.Conv2d", "torch.nn.Conv3d"}
                              : classes)
    types.push_back(class_named(name));
  std::unordered_set<const c10::TensorImpl*> marked;
  // DeepSpeed compares module.__class__ exactly: a subclass is not marked.
  auto mark = [&](const torch::nn::Module& m) {
    if (std::find(types.begin(), types.end(), std::type_index(typeid(m))) == types.end()) return;
    for (const auto& p : m.parameters(/*recurse=*/false)) marked.insert(p.unsafeGetTensorImpl());
  };
  mark(module);  // itself (modules(true) would need it held by a shared_ptr)
  for (const auto& m : module.modules(/*include_self=*/false)) mark(*m);
  return marked;
}

std::optional<c10::ScalarType> autocast_dtype(c10::DeviceType device) {
  if (!enabled(device)) return std::nullopt;
  return dtype(device);
}

ForwardAutocast::ForwardAutocast(const EngineCore& core) {
  c10::ScalarType want = c10::ScalarType::Undefined;
  const bool configured = core.forward_autocast(&device_, &want);
  // DeepSpeed asks torch.is_autocast_enabled(), which is CUDA's state whatever its accelerator:
  // with it on, the engine's forward runs under torch.autocast even with the section off
  // (enabled=False: autocast off there on the engine's device).
  const bool outer = enabled(c10::DeviceType::CUDA);
  if (!configured && !outer) return;
  if (outer) note_outer_autocast(core.rank(), configured, device_);
  if (want == c10::ScalarType::Undefined) want = dtype(device_);  // torch's default for it
  // torch.autocast turns itself off (with a warning) for a dtype the device does not take.
  const bool on = configured && supported(device_, want);
  was_enabled_ = enabled(device_);
  was_dtype_ = dtype(device_);
  set_enabled(device_, on);
  if (on) set_dtype(device_, want);
  at::autocast::increment_nesting();
  active_ = true;
}

ForwardAutocast::~ForwardAutocast() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_enabled(device_, was_enabled_);
  set_dtype(device_, was_dtype_);
}

}  // namespace dtrain::zero::detail
