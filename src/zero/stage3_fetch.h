// ZeRO stage 3's per-submodule parameter fetch (DeepSpeed's PartitionedParameterCoordinator):
// the module is cut into units (the children of a torch::nn::Sequential, each a contiguous
// range of the flat parameter buffer); a unit's parameters are gathered just before its
// forward and again before its backward, into a buffer of the unit's own, and released after
// each, so that between units a rank holds its 1/N partition, the persistent units and what
// was prefetched. Gathering: each rank that owns a piece of the unit's flat range broadcasts
// it (asynchronously), so the next units can be fetched while this one computes:
//   stage3_prefetch_bucket_size   elements fetched ahead of use, at most;
//   stage3_max_live_parameters    elements gathered at once (resident or in flight), at most,
//                                 except that the unit needed now is always fetched;
//   stage3_param_persistence_threshold  a unit smaller than this stays gathered from its first
//                                 fetch after a step until the next step (per unit, where
//                                 DeepSpeed decides per parameter);
//   stage3_max_reuse_distance     a unit is not released if the previous forward-backward's
//                                 order of fetches uses it again within this many elements
//                                 (DeepSpeed's trace: from the second pass on, a forward's units
//                                 whose backward comes within the distance stay gathered for it,
//                                 at the default 1e9 all of a model under ~500M parameters; 0
//                                 releases every unit after each use).
// Residency is measured, not assumed: each gathered buffer is watched through a weak
// reference to its storage, so a buffer that something else (autograd's saved tensors) keeps
// alive after its release still counts. That is why a torch::nn::Linear unit runs through
// ZeRO's own linear (zero3_linear below), which saves the weight itself for backward, not the
// transposed view at::linear saves (which would keep every gathered weight alive until its
// backward), as DeepSpeed's LinearFunctionForZeroStage3 does.
#pragma once

#include <torch/torch.h>

#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/collectives.h"
#include "dtrain/zero.h"

namespace dtrain::zero::detail {

class EngineImpl;

class Stage3Fetch {
 public:
  // units: per unit, the indices into core.params_ (contiguous, ascending).
  Stage3Fetch(EngineImpl& core, std::vector<std::vector<size_t>> units);

  size_t size() const { return units_.size(); }
  // Forward: make unit u resident (wait for its prefetch or fetch it now), then prefetch the
  // next units in forward order.
  void begin_forward(size_t u);
  // Forward done: release u unless persistent; `out` (when it requires grad) gets a hook that
  // fetches u again when backward reaches it and prefetches the units before it.
  void end_forward(size_t u, const torch::Tensor* out);
  // A parameter's gradient was accumulated (from the engine's hook, during backward): a unit
  // whose every gradient is in is released.
  void on_grad_ready(size_t param);
  // End of backward: waits for anything still in flight, releases every non-persistent unit.
  void end_backward();
  // The partitions changed (step, checkpoint load): every unit, persistent ones too, is stale.
  void release_all();
  bool any_resident() const;
  // Bytes of the gathered buffers the engine holds now.
  int64_t held_bytes() const;

  void set_trace(std::function<void(const std::string&)> trace) { trace_ = std::move(trace); }
  const Stage3Stats& stats() const { return stats_; }

 private:
  struct Unit {
    std::vector<size_t> params;
    int64_t begin = 0, end = 0;  // flat range
    bool persistent = false;
    torch::Tensor buffer;     // gathered (or being gathered); undefined when released
    std::vector<Work> works;  // in flight while non-empty
    // Where the other ranks' pieces arrive (offset into buffer): the collectives never hold
    // `buffer` itself, so a released buffer is freed at once (a backend may keep a finished
    // collective's tensors a moment longer, on its own thread).
    std::vector<std::pair<torch::Tensor, int64_t>> incoming;
    size_t grads_pending = 0;
    bool used_in_backward = false;
    bool pointed = false;  // the parameters are views of `buffer`
  };
  void launch(size_t u);  // start gathering u (no-op when resident or in flight)
  void wait(size_t u);    // u resident, params pointed at its buffer
  void release(size_t u);
  // Release u after a use, unless the trace says it is used again within the reuse distance.
  void release_after_use(size_t u, bool in_backward);
  void record_use(size_t u, bool in_backward);  // u is used now: the trace
  // A use inside a forward-backward (backward, or a forward with autograd on): part of the
  // trace and kept for reuse; a forward under NoGradGuard (evaluation) is neither.
  static bool in_pass(bool in_backward) { return in_backward || torch::GradMode::is_enabled(); }
  void prefetch_after(size_t u, int direction);
  int64_t live_elements() const;
  void record_resident();    // a unit boundary: update the peak
  int64_t resident_bytes();  // partition + every gathered storage still alive
  void trace(const std::string& what) {
    if (trace_) trace_(what);
  }

  EngineImpl& core_;
  // Watched by the backward hooks on the units' outputs (weakly): a graph that outlives this
  // fetcher (its engine destroyed, or fetch_units() called again) gets a clear error from its
  // backward rather than a hook into a dead object.
  std::shared_ptr<const bool> alive_ = std::make_shared<const bool>(true);
  std::vector<Unit> units_;
  std::vector<size_t> unit_of_;  // param -> unit
  // The units used (with parameters) in this forward-backward, in order, and in the last
  // complete one (DeepSpeed's trace); `on_trace_` while this pass has followed it so far.
  std::vector<size_t> uses_, trace_uses_;
  bool on_trace_ = false;
  struct Watched {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    int64_t bytes;
  };
  std::vector<Watched> watched_;
  Stage3Stats stats_;
  std::function<void(const std::string&)> trace_;
};

}  // namespace dtrain::zero::detail
