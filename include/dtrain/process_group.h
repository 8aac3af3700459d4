// Process groups: how the workers of a job find each other and talk.
//
// init_process_group() is PyTorch's call with PyTorch's names: under `dtrain run` or
// torchrun the defaults read the worker environment (env://) and join the agent's store
// under /worker/attempt_<restart>; tcp://HOST:PORT and file:///PATH work without a launcher.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace dtrain {

struct ProcessGroupOptions {
  // "auto": the shared-memory backend when every rank runs on this host (same hostname,
  //   boot and /dev/shm), else Gloo; every rank decides alike through the store.
  // "shm": the shared-memory backend, an error (UsageError) if some rank is on another host.
  //   all_reduce, reduce, broadcast, all_gather and barrier go through one POSIX shared-memory
  //   segment; every other collective through a Gloo group it wraps.
  // "gloo": c10d's Gloo over TCP only (what PyTorch's init_process_group("gloo") gives).
  // "nccl": not built yet - dtrain links libtorch's CPU libraries only (UsageError).
  // Default: "auto".
  std::string backend = "auto";
  // "env://" (the launcher's environment), "tcp://HOST:PORT" (rank 0 hosts the store) or
  // "file:///PATH" (a file every rank can reach; remove it before reusing it). Default: env://.
  std::string init_method = "env://";
  // Required for tcp:// and file://; with env:// they must match the environment if given.
  // Default: -1 (from the environment).
  int world_size = -1;
  int rank = -1;
  // Timeout of every store wait and collective. Default: 30 minutes (PyTorch's).
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // Collective diagnosis (dtrain/debug.h): "off", "info" or "detail". Default (""):
  // DTRAIN_DEBUG, else "info" (flight recorder and stall report, always on).
  std::string debug;
  // How long a collective waits before the stall report names the ranks that have not
  // entered it. Default (0): DTRAIN_STALL_TIMEOUT (seconds), else 60 s.
  std::chrono::milliseconds stall_timeout{0};
};

class ProcessGroup;
struct NewGroupOptions;
std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                        const NewGroupOptions& options);
namespace diagnosis {
class GroupMonitor;
}

// A joined group. Destroying the last handle leaves the group and closes its sockets.
class ProcessGroup {
 public:
  ProcessGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::ProcessGroup> pg,
               std::string backend);
  int rank() const { return pg_->getRank(); }
  int world_size() const { return pg_->getSize(); }
  // "shm" or "gloo": the backend init_process_group chose.
  const std::string& backend_name() const { return backend_; }
  // The c10d group, for collectives not wrapped here yet. Not for barriers: on libtorch 2.x its
  // barrier() races with barriers that other threads issue at the same time on any group of
  // the process (a static tensor inside it, issue #16); barrier() below does not.
  const c10::intrusive_ptr<c10d::ProcessGroup>& c10d() const { return pg_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  // Blocks until every rank has called barrier(), up to the group's timeout.
  void barrier();
  // The group's flight recorder and stall watchdog (dtrain/debug.h, dtrain/flight_recorder.h).
  const std::shared_ptr<diagnosis::GroupMonitor>& monitor() const { return monitor_; }

 private:
  friend std::shared_ptr<ProcessGroup> new_group(const std::vector<int>&, const NewGroupOptions&);
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  std::string backend_;
  // How many new_group() calls were made over this group: the next sub-group's store prefix.
  int subgroups_created_ = 0;
  std::shared_ptr<diagnosis::GroupMonitor> monitor_;
};

struct NewGroupOptions {
  // The group whose ranks `ranks` numbers and whose store the sub-group rendezvous on.
  // Default: the default group.
  std::shared_ptr<ProcessGroup> parent;
  // Timeout of the sub-group's store waits and collectives. Default (0): the parent's.
  std::chrono::milliseconds timeout{0};
};

// A sub-group over `ranks` (ranks of the parent, distinct, any order; the sub-group's rank r is
// the r-th smallest of them), on Gloo, as torch.distributed.new_group makes it: a new Gloo
// group over the parent's store under a prefix numbered by how many sub-groups were made
// before. REQUIRES: every rank of the parent calls new_group with the same `ranks`, in the
// same order relative to its other new_group calls, members or not (that keeps the numbering
// equal everywhere). Returns the sub-group on its members and nullptr on the others; members
// block until every member joined (up to the timeout). Use it through any collective
// options' `group` field; ranks there (src, dst) are the sub-group's.
// Throws UsageError for an empty list, a duplicate or a rank outside the parent.
std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                        const NewGroupOptions& options = NewGroupOptions{});

// Joins the group described by `options` and makes it the default group.
// Throws UsageError for a malformed init_method, a missing rank/world size, or "nccl" in a
// build without CUDA; NetworkError/TimeoutError when peers cannot be reached in time.
std::shared_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options = {});

// The group init_process_group() made last; throws UsageError if there is none.
std::shared_ptr<ProcessGroup> default_group();

// Leaves the default group (it is destroyed when no other handle holds it).
void destroy_process_group();

}  // namespace dtrain
