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
  // Which backend runs the collectives, per device type (PyTorch's names):
  // "auto": CPU tensors on the shared-memory backend when every rank runs on this host (same
  //   hostname, boot and /dev/shm), else Gloo; CUDA tensors (in a CUDA build, when every rank
  //   sees a GPU) on NCCL when every rank has a GPU of its own, else through pinned host
  //   buffers on the shared-memory backend (several ranks may share one GPU), else Gloo's own
  //   CUDA path. Every rank decides alike through the store.
  // "shm": the shared-memory backend for CPU tensors (and, staged, CUDA ones); UsageError if
  //   some rank is on another host. all_reduce, reduce, broadcast, all_gather and barrier go
  //   through one POSIX shared-memory segment; every other collective through a Gloo group it
  //   wraps.
  // "gloo": c10d's Gloo over TCP (what PyTorch's init_process_group("gloo") gives).
  // "nccl": c10d's NCCL for CUDA tensors, one GPU per rank (UsageError in a build without
  //   CUDA, or when ranks share a GPU); CPU tensors (objects, barriers) on what "auto" picks.
  // "cpu:B,cuda:B": one backend per device type, as PyTorch writes it ("cpu:gloo,cuda:nccl").
  // Default: "auto".
  std::string backend = "auto";
  // The GPU this rank's CUDA collectives use (NCCL's device). Default (-1): LOCAL_RANK (else
  // the rank) modulo the GPUs this process sees - torchrun's one device per local rank.
  // Ignored where no GPU is visible.
  int cuda_device = -1;
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
namespace comm {
struct GroupBackends;
}
std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                        const NewGroupOptions& options);
namespace diagnosis {
class GroupMonitor;
}

// A joined group. Destroying the last handle leaves the group and closes its sockets.
class ProcessGroup {
 public:
  // A group of one CPU backend named `backend` ("gloo" or "shm"), already joined (tests make
  // ranks as threads this way).
  ProcessGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::ProcessGroup> pg,
               std::string backend);
  // A group the backend factory built (comm/backend.h).
  ProcessGroup(c10::intrusive_ptr<c10d::Store> store,
               std::shared_ptr<const comm::GroupBackends> backends);
  ~ProcessGroup();
  int rank() const { return pg_->getRank(); }
  int world_size() const { return pg_->getSize(); }
  // The backend init_process_group chose: "shm", "gloo" or "nccl" when one backend serves
  // every device type, else one per device type ("cpu:shm,cuda:nccl"). On a machine that may
  // show a GPU, "auto" decides the CUDA backend at the group's first collective on a CUDA
  // tensor (a job that keeps to the CPU never starts CUDA); until then "cpu:shm,cuda:auto".
  std::string backend_name() const;
  // The backend for tensors on `device` ("shm", "gloo", "nccl"), "auto" for a CUDA backend not
  // decided yet, or "" when the group has none.
  std::string backend_name(c10::DeviceType device) const;
  // The GPU this rank's CUDA backend uses, or -1 when the group has no CUDA backend (or it is
  // not decided yet).
  int cuda_device() const;
  // The timeout of the group's collectives and store waits.
  std::chrono::milliseconds timeout() const;
  // The c10d group, for collectives not wrapped here yet. Not for barriers: on libtorch 2.x its
  // barrier() races with barriers that other threads issue at the same time on any group of
  // the process (a static tensor inside it, issue #16); barrier() below does not.
  const c10::intrusive_ptr<c10d::ProcessGroup>& c10d() const { return pg_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  // What the group runs on which device (comm/backend.h; dtrain's own code).
  const comm::GroupBackends& backends() const { return *backends_; }
  // Blocks until every rank has called barrier(), up to the group's timeout.
  void barrier();
  // The group's flight recorder and stall watchdog (dtrain/debug.h, dtrain/flight_recorder.h).
  const std::shared_ptr<diagnosis::GroupMonitor>& monitor() const { return monitor_; }

 private:
  friend std::shared_ptr<ProcessGroup> new_group(const std::vector<int>&, const NewGroupOptions&);
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  std::shared_ptr<const comm::GroupBackends> backends_;
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
// the r-th smallest of them), as torch.distributed.new_group makes it: new backends over the
// parent's store under a prefix numbered by how many sub-groups were made before - Gloo for
// CPU tensors (on the parent's network device), and for CUDA tensors NCCL where the parent
// has NCCL, else Gloo's CUDA path. REQUIRES: every rank of the parent calls new_group with the same
// `ranks`, in the same order relative to its other new_group calls, members or not (that keeps the
// numbering equal everywhere). Returns the sub-group on its members and nullptr on the others;
// members block until every member joined (up to the timeout). Use it through any collective
// options' `group` field; ranks there (src, dst) are the sub-group's.
// Throws UsageError for an empty list, a duplicate or a rank outside the parent.
std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                        const NewGroupOptions& options = NewGroupOptions{});

// Joins the group described by `options` and makes it the default group.
// Throws UsageError for a malformed init_method, a missing rank/world size, an unknown backend,
// or "nccl" where it cannot run (a build without CUDA, no GPU, ranks sharing a GPU);
// NetworkError/TimeoutError when peers cannot be reached in time.
std::shared_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options = {});

// The group init_process_group() made last; throws UsageError if there is none.
std::shared_ptr<ProcessGroup> default_group();

// Leaves the default group (it is destroyed when no other handle holds it).
void destroy_process_group();

}  // namespace dtrain
