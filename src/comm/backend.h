// Collective backends behind one factory: what init_process_group, new_group and hvd build.
//
// A backend runs collectives on the tensors of one or more device types (c10d::Backend on
// libtorch 2.x; on 1.13 a backend is a c10d::ProcessGroup). Each is registered here once, with
// a traits record - the devices, dtypes and operations it takes - so the collectives' front end
// (src/comm/collectives.cpp) checks a call against the backend that will run it, not against
// one backend's limits.
//
//   name    devices        what it is
//   gloo    cpu (+cuda)    c10d's ProcessGroupGloo over TCP; CUDA tensors too where libtorch's
//                          Gloo was built with CUDA (PyPI's 2.x wheels)
//   shm     cpu (+cuda)    dtrain's shared-memory backend (comm/shm) for ranks on one host,
//                          wrapping a Gloo group for what it does not do itself; CUDA tensors go
//                          through pinned host buffers (comm/staged), so several ranks can share
//                          one GPU
//   nccl    cuda           c10d's ProcessGroupNCCL (CUDA builds only: DTRAIN_CUDA); one GPU per
//   rank
//
// A group's backend spec, as in torch.distributed.init_process_group:
//   "auto"   CPU: shm when every rank is on this host, else gloo. CUDA (when this process sees a
//            GPU): nccl when every rank has a GPU of its own, else the CPU backend's staging
//            (shm) or Gloo's own CUDA path (gloo) - decided at the group's first CUDA
//            collective, not at init, so a job that keeps its tensors on the CPU never starts
//            CUDA (comm/lazy/lazy_cuda.h).
//   "gloo"   gloo for CPU and (where it can) CUDA tensors, as PyTorch 2.x registers it.
//   "shm"    shm for CPU, staged shm for CUDA; UsageError if a rank is on another host.
//   "nccl"   nccl for CUDA tensors, and the CPU backend "auto" picks for CPU tensors (objects,
//            barriers, DDP's model check): PyTorch's "nccl" has no CPU backend at all.
//   "cpu:B,cuda:B"  one backend per device type (B: auto, gloo, shm or nccl).
// Every rank must pass the same spec; the choices "auto" makes are computed from what every
// rank published in the store, so every rank makes the same ones.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/c10d_compat.h"

namespace dtrain::comm {

// The operations a backend runs (bit flags of BackendTraits::ops).
enum Op : uint32_t {
  kOpAllreduce = 1u << 0,
  kOpReduce = 1u << 1,
  kOpBroadcast = 1u << 2,
  kOpAllgather = 1u << 3,
  kOpGather = 1u << 4,
  kOpScatter = 1u << 5,
  kOpReduceScatter = 1u << 6,
  kOpAlltoall = 1u << 7,
  kOpSendRecv = 1u << 8,
  kOpBarrier = 1u << 9,
  kOpAll = (1u << 10) - 1,
};

// What a backend takes on one device type.
struct BackendTraits {
  std::string name;  // "gloo", "shm", "nccl"
  std::vector<at::ScalarType> dtypes;
  uint32_t ops = 0;
  // Reduces with ReduceOp AVG itself (else the front end sums and divides).
  bool native_avg = false;
  // How it moves CUDA tensors: "" (CPU), "nccl", "gloo", "host staging".
  std::string cuda_path;

  bool supports(at::ScalarType t) const;
  bool supports(Op op) const { return (ops & op) != 0; }
  // "float32, float64, ..." for messages.
  std::string dtype_list() const;
};

// One device type's backend in a group.
struct DeviceBackend {
  c10::DeviceType device = c10::DeviceType::CPU;
  BackendTraits traits;
  c10::intrusive_ptr<Backend> backend;
};

// A group's description from its backends' names ("" for a device it has none for): the one
// name when one backend serves every device it has, else "cpu:CPU,cuda:CUDA".
std::string describe_backends(const std::string& cpu, const std::string& cuda);

class LazyCuda;  // comm/lazy/lazy_cuda.h

// What a group was built with: one entry per device type it takes tensors on.
struct GroupBackends {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::vector<DeviceBackend> devices;
  // "shm", "gloo", "nccl" when one backend serves every device; else "cpu:shm,cuda:nccl".
  // With `lazy_cuda`, what it was at init ("cpu:shm,cuda:auto"): describe() is the current one.
  std::string description;
  std::chrono::milliseconds timeout{0};
  // The GPU this rank's CUDA backend uses (-1: none). With `lazy_cuda`: see current_cuda_device().
  int cuda_device = -1;
  // The CUDA backend "auto" decides at the group's first CUDA collective (comm/lazy), where the
  // machine may show a GPU; null when it was decided at init (or the group takes no CUDA).
  std::shared_ptr<LazyCuda> lazy_cuda;

  // The backend for tensors on `device`, or nullptr when the group has none. For CUDA in a
  // group with `lazy_cuda` this decides it: call it where every rank does (a collective).
  const DeviceBackend* find(c10::DeviceType device) const;
  // The backend's name for `device` without deciding anything: "auto" for an undecided CUDA
  // backend, "" when the group has none.
  std::string name_for(c10::DeviceType device) const;
  // The description as of now (see `description`).
  std::string describe() const;
  // The GPU as of now: -1 while a lazy CUDA backend is undecided.
  int current_cuda_device() const;
};

// A CPU tensor (uninitialised) that `group`'s CPU backend reduces where it lies - in the
// shared-memory backend's pool (comm/shm/shm_pool.h), so its all_reduce copies nothing in or
// out - or an ordinary one where the backend has no such memory or no room left. For buffers a
// group reduces again and again: DDP's gradient buckets.
at::Tensor empty_for_collectives(const GroupBackends& group, at::IntArrayRef sizes,
                                 at::ScalarType dtype);

// How to build a group's backends.
struct GroupRequest {
  std::string spec = "auto";  // see the header comment
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int world = 1;
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // The GPU this rank uses for CUDA collectives: -1 picks LOCAL_RANK (else the rank) modulo
  // the visible GPUs, torchrun's one-device-per-local-rank convention. Ignored when this
  // process sees no GPU.
  int cuda_device = -1;
  // Gloo's network device: this host name (tests: "127.0.0.1"); "" = GLOO_SOCKET_IFNAME or
  // Gloo's default.
  std::string gloo_hostname;
  // For a sub-group: the parent's backends, whose kinds (and Gloo devices) it reuses.
  const GroupBackends* like = nullptr;
  // Whether this rank's machine may show a GPU; unset: ask it (cuda::may_see_gpu()). For tests
  // of groups whose ranks differ.
  std::optional<bool> may_see_gpu;
};

// Builds the backends `request.spec` asks for and the c10d group that dispatches to them.
// REQUIRES: every rank of the group calls it with the same spec, at the same point.
// Throws UsageError for an unknown or malformed spec, a backend this build or machine cannot
// give ("nccl" without CUDA or with two ranks on one GPU, "shm" across hosts) - on every rank
// alike where the reason is shared; NetworkError/TimeoutError when peers cannot be reached.
GroupBackends make_group_backends(const GroupRequest& request);

// One backend by name ("gloo", "shm", "nccl") for `device`'s type: the factory's single entry
// point for code that needs a backend rather than a group. `device` picks the GPU for nccl.
c10::intrusive_ptr<Backend> make_backend(const std::string& name,
                                         const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, std::chrono::milliseconds timeout,
                                         c10::Device device);

// The registered backends' names and traits per device type (for messages and tests).
std::vector<std::string> backend_names();
std::optional<BackendTraits> backend_traits(const std::string& name, c10::DeviceType device);

// Whether this build of dtrain has CUDA (DTRAIN_CUDA at configure time) and NCCL.
bool built_with_cuda();

// The timeout `backend` runs its collectives under (Gloo's and the shared-memory backend's own,
// looking through a staging backend); nullopt for a backend that does not say.
std::optional<std::chrono::milliseconds> backend_timeout(Backend& backend);

}  // namespace dtrain::comm
