// Device tensors through a host backend: collectives on CUDA tensors run by a CPU backend
// (the shared-memory one), each tensor copied to a pinned host buffer and back.
//
// Why: NCCL refuses two ranks on one GPU, yet people debug with several ranks on one GPU,
// and a machine with one GPU can only test that way. Through shared memory the host copies
// are the whole cost (two PCIe copies per tensor), which for ranks on one host is cheaper
// than Gloo's own CUDA path (the same copies plus loopback TCP).
//
// Stream semantics (what PyTorch's CUDA collectives promise): the copy to the host is ordered
// after the work already queued on the caller's current stream (it waits for it); the copy
// back is queued on the caller's current stream when the Work is waited for, so kernels the
// caller queues after wait() see the result. The pinned buffers come from libtorch's caching
// host allocator, which keeps a buffer until the copy that reads it has finished.
//
// One instance serves both device types of a group (libtorch 2.x keeps one backend per
// backend type): CPU tensors go to the inner backend unchanged, unless `stage_all` (tests of
// the staging path on machines without a GPU).
//
// Errors and timeouts are the inner backend's. Thread-safety: as the inner backend's.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <vector>

#include "comm/c10d_compat.h"

namespace dtrain::comm {

class StagedBackend : public Backend {
 public:
  // `inner` runs every collective, on host tensors. REQUIRES: inner != nullptr.
  explicit StagedBackend(c10::intrusive_ptr<Backend> inner, bool stage_all = false);

  const std::string getBackendName() const override { return inner_->getBackendName(); }
  const c10::intrusive_ptr<Backend>& inner() const { return inner_; }

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
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
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

 private:
  bool stages(const at::Tensor& t) const;
  // Host copies of `tensors` (the tensor itself where it is not staged). With `copy_in`
  // false the host buffers are allocated but not filled (outputs).
  std::vector<at::Tensor> to_host(const std::vector<at::Tensor>& tensors, bool copy_in) const;
  // to_host for each list of a list of lists (gather's outputs, scatter's inputs).
  std::vector<std::vector<at::Tensor>> to_host(const std::vector<std::vector<at::Tensor>>& lists,
                                               bool copy_in) const;

  c10::intrusive_ptr<Backend> inner_;
  bool stage_all_;
};

}  // namespace dtrain::comm
