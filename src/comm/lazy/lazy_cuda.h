// A group's CUDA backend decided at its first CUDA collective, not at init_process_group.
//
// Why: "auto" picks NCCL for CUDA tensors when every rank has a GPU of its own, else the CPU
// backend's host staging; deciding means asking CUDA for this rank's GPU (cuInit, the
// driver's start-up, a fraction of a second per process and more while the GPU idles) and
// exchanging every rank's answer. A job that never puts a tensor on a GPU - most CPU jobs on a
// GPU machine - should pay none of that, as PyTorch's init_process_group asks nothing of CUDA
// either. So where some rank's machine may show a GPU (the ranks tell each other at init,
// without asking CUDA), "auto" leaves the CUDA part undecided
// ("cuda:auto" in the group's description) until something needs it: a collective on a CUDA
// tensor, through dtrain's collectives or straight through the c10d group. Every rank issues
// its collectives in the same order, so every rank decides at the same one, from the same
// exchange, and decides alike.
//
// LazyCuda holds the decision (made once; a failure is kept and thrown again to later
// callers rather than exchanging twice). LazyRouter is the c10d backend the group binds for
// CUDA tensors - and for CPU tensors too when the CPU backend is of the same c10d kind
// (libtorch 2.x keeps one backend object per kind): it passes CPU tensors to the CPU backend
// untouched and the rest to the decided CUDA backend.
//
// Thread-safety: decide() serialises on a mutex; the router's calls are as thread-safe as the
// backends they reach.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/c10d_compat.h"
#include "core/thread_annotations.h"

namespace dtrain::comm {

// What a decision gives: the CUDA entry (none: no CUDA backend for this group) and the GPU.
struct CudaDecision {
  std::optional<DeviceBackend> entry;
  int device = -1;
};

class LazyCuda {
 public:
  using Decide = std::function<CudaDecision()>;
  // `cpu_name`: the group's CPU backend ("shm", "gloo"), for the description.
  LazyCuda(Decide decide, std::string cpu_name);

  // The CUDA entry, decided now if it was not yet (every rank at the same point); nullptr
  // when the group has no CUDA backend. Throws what the decision threw, every time.
  const DeviceBackend* get();
  // Without deciding: "auto" while undecided, then the decided backend's name ("" for none).
  std::string name() const;
  // The GPU of the decided backend; -1 while undecided or without one.
  int device() const;
  // The group's description: "cpu:shm,cuda:auto" while undecided, then as make_group_backends
  // writes it ("shm", "cpu:shm,cuda:nccl", or the CPU backend's name alone).
  std::string description() const;

 private:
  mutable Mutex mu_;
  Decide decide_ DTRAIN_GUARDED_BY(mu_);
  const std::string cpu_name_;
  bool decided_ DTRAIN_GUARDED_BY(mu_) = false;
  CudaDecision decision_ DTRAIN_GUARDED_BY(mu_);
  std::exception_ptr error_ DTRAIN_GUARDED_BY(mu_);
};

class LazyRouter : public Backend {
 public:
  // REQUIRES: cpu != nullptr (the group's CPU backend), lazy != nullptr.
  LazyRouter(c10::intrusive_ptr<Backend> cpu, std::shared_ptr<LazyCuda> lazy);

  const std::string getBackendName() const override;
  const c10::intrusive_ptr<Backend>& cpu() const { return cpu_; }

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  // Always the CPU backend's (a barrier has no tensor of the caller's).
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

 private:
  // The backend for a call on `tensors`: the CPU backend when none is on a GPU, else the
  // decided CUDA backend (deciding it now).
  Backend& route(const std::vector<at::Tensor>& tensors);
  Backend& route(const std::vector<std::vector<at::Tensor>>& lists,
                 const std::vector<at::Tensor>& more = {});

  c10::intrusive_ptr<Backend> cpu_;
  std::shared_ptr<LazyCuda> lazy_;
};

}  // namespace dtrain::comm
