// Horovod's elastic API for libtorch C++ (hvd.elastic), on dtrain's elastic machinery.
//
//     dtrain::hvd::init();
//     dtrain::hvd::elastic::TorchState state(*model, &optimizer, {{"epoch", 0}, {"batch", 0}});
//     dtrain::hvd::elastic::run(state, [&](dtrain::hvd::elastic::TorchState& s) {
//       for (; s["epoch"] < epochs; ++s["epoch"], s["batch"] = 0) {
//         for (; s["batch"] < batches; ++s["batch"]) {
//           ... forward, backward, DistributedOptimizer::step() ...
//           if (s["batch"] % 10 == 0) s.commit();
//         }
//       }
//     });
//   launched with: dtrain horovodrun --min-np 2 --max-np 4 --host-discovery-script ./hosts.sh prog
//
// How Horovod's semantics map onto dtrain (docs/horovod.md, src/horovod/horovodrun_elastic.cpp):
//   Horovod keeps the workers alive across a membership change: a collective fails with
//   HorovodInternalError, run() catches it, the survivors restore() their last commit from
//   process memory, re-form the ring and sync() from rank 0. dtrain's elastic launcher
//   instead restarts the worker processes: the agent of the host whose worker failed leaves
//   the job (Horovod's blacklisting), the other agents meet again without it and start their
//   workers at the smaller size. State therefore comes back through ElasticState
//   (dtrain/elastic_state.h): commit() writes the model, the optimizer and the fields to
//   node-local memory (/dev/shm, which outlives the worker processes, not the host), and
//   run() restores the newest commit any survivor holds and broadcasts it. The visible result
//   is Horovod's: the survivors go on from the last commit at the smaller size; the steps
//   after it are redone.
//   - commit(): saves in memory (every commit_every-th also on disk if checkpoint_dir is set),
//     then check_host_updates().
//   - restore(): COLLECTIVE here (Horovod's is local): rolls every rank back to the newest
//     commit. run() calls it on a restarted job; call it yourself to roll back in-process.
//   - sync(): COLLECTIVE: rank 0's model, optimizer state and fields to every rank. run()
//     calls it at the start of a fresh job (Horovod syncs at every reset).
//   - check_host_updates(): true when a host waits to join (the script listed a new one and
//     its agent arrived). Horovod raises HostsUpdatedInterrupt at the next commit and resets
//     without rolling back. Here the running agents restart their workers at their next
//     monitor tick (0.1 s) after the new agent arrived, wherever the workers are, so the
//     steps since the last commit are redone (as after a failure). commit() throws
//     HostsUpdatedInterrupt right after saving when it sees a host waiting, and run() then
//     waits for that restart: when the check comes first, nothing is redone.
//   - register_reset_callbacks(): called by run() after a restart, when the world size may
//     have changed (e.g. to rescale the learning rate by hvd::size()).
// Not built: Horovod's in-process reset (the workers are restarted; each restart pays the
// program's start-up and hvd::init()), ElasticSampler in TorchState (use ElasticState's
// sampler directly), other frameworks' states (TensorFlowKerasState...).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/error.h"

namespace dtrain {
class ElasticState;
}

namespace dtrain::hvd::elastic {

// Thrown by commit()/check_host_updates() when a host waits to join the job; run() handles it.
class HostsUpdatedInterrupt : public Error {
 public:
  using Error::Error;
};

struct TorchStateOptions {
  // Also commit to disk here (rank 0), every disk_every-th commit; survives the loss of every
  // host. Default: none (memory only).
  std::string checkpoint_dir;
  int64_t disk_every = 1;               // Default: 1 (when checkpoint_dir is set)
  std::string prefix = "hvd_elastic_";  // commit file names. Default: "hvd_elastic_"
  bool verbose = true;                  // rank 0 says what it resumed from. Default: true
};

// The model's parameters and buffers, the optimizer's state and integer fields (Horovod's
// TorchState(model, optimizer, epoch=0, batch=0)).
// REQUIRES: hvd::init() ran; model and optimizer outlive this object; every rank holds the
// same replica after each step (DistributedOptimizer). Not thread-safe.
class TorchState {
 public:
  // optimizer may be null. Throws UsageError when hvd is not initialized.
  TorchState(torch::nn::Module& model, torch::optim::Optimizer* optimizer,
             std::map<std::string, int64_t> fields = {}, TorchStateOptions options = {});
  ~TorchState();
  TorchState(const TorchState&) = delete;
  TorchState& operator=(const TorchState&) = delete;

  // A field (created as 0 if new: Horovod's state.attr = value).
  int64_t& operator[](const std::string& name) { return fields_[name]; }
  const std::map<std::string, int64_t>& fields() const { return fields_; }

  // save(), then check_host_updates() (throws HostsUpdatedInterrupt when a host waits).
  void commit();
  // Saves the state in memory (rank 0 of each host writes it) without the host check.
  void save();
  // COLLECTIVE. Rolls back to the newest commit; returns false (and changes nothing) when there is
  // none.
  bool restore();
  // COLLECTIVE. Rank 0's model, optimizer state and fields on every rank.
  void sync();
  // Whether a host waits to join the job (its agent is counted as late in this round).
  bool check_host_updates();
  void register_reset_callbacks(std::vector<std::function<void()>> callbacks);
  // COLLECTIVE. Training is over: after a barrier, removes this job's memory commits. Call it
  // last, on every rank, when the launcher does not remove them (`dtrain horovodrun` does when
  // the job ends; a failure after finish() would restart from scratch).
  void finish();

  // Commits made by this job so far (the number restored after a restart).
  int64_t commits() const;
  // "memory:/dev/shm/..." or "disk:DIR/..." when the job resumed from a commit; else empty.
  const std::string& resumed_from() const { return resumed_from_; }

  // run()'s start: restore (restarted job) or sync (fresh job), then the reset callbacks
  // (restarted job only). Returns whether it restored.
  bool on_start();

 private:
  void load_fields();

  torch::nn::Module& model_;
  torch::optim::Optimizer* optimizer_;
  std::map<std::string, int64_t> fields_;
  TorchStateOptions options_;
  std::string memory_dir_;
  std::unique_ptr<ElasticState> es_;
  std::vector<std::function<void()>> reset_callbacks_;
  std::string resumed_from_;
};

// Horovod's hvd.elastic.run: starts fn(state) from the right state (the last commit after a
// restart, rank 0's state on a fresh job) and returns what fn returns. A lost peer makes a
// collective inside fn throw; that ends this worker with the error, and the launcher restarts
// the survivors (see above). HostsUpdatedInterrupt from commit() makes run() wait up to
// `restart_wait` for that restart, then throw TimeoutError.
template <class F>
auto run(TorchState& state, F&& fn,
         std::chrono::milliseconds restart_wait = std::chrono::seconds(60)) -> decltype(fn(state));

namespace detail {
[[noreturn]] void wait_for_restart(std::chrono::milliseconds limit, const std::string& why);
}

template <class F>
auto run(TorchState& state, F&& fn, std::chrono::milliseconds restart_wait) -> decltype(fn(state)) {
  state.on_start();
  try {
    return fn(state);
  } catch (const HostsUpdatedInterrupt& e) {
    detail::wait_for_restart(restart_wait, e.what());
  }
}

}  // namespace dtrain::hvd::elastic
