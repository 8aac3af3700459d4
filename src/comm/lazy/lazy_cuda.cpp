#include "comm/lazy/lazy_cuda.h"

#include <utility>

#include "dtrain/error.h"

namespace dtrain::comm {

LazyCuda::LazyCuda(Decide decide, std::string cpu_name)
    : decide_(std::move(decide)), cpu_name_(std::move(cpu_name)) {}

const DeviceBackend* LazyCuda::get() {
  MutexLock lock(mu_);
  if (!decided_ && !error_) {
    try {
      decision_ = decide_();
      decided_ = true;
    } catch (...) {
      // The exchange is not repeatable (the peers moved on): later callers get the same error.
      error_ = std::current_exception();
    }
    decide_ = nullptr;  // what it captured (the store, the CPU backends) is not needed again
  }
  if (error_) std::rethrow_exception(error_);
  return decision_.entry ? &*decision_.entry : nullptr;
}

std::string LazyCuda::name() const {
  MutexLock lock(mu_);
  if (!decided_) return "auto";
  return decision_.entry ? decision_.entry->traits.name : "";
}

int LazyCuda::device() const {
  MutexLock lock(mu_);
  return decided_ ? decision_.device : -1;
}

std::string LazyCuda::description() const { return describe_backends(cpu_name_, name()); }

LazyRouter::LazyRouter(c10::intrusive_ptr<Backend> cpu, std::shared_ptr<LazyCuda> lazy)
    : Backend(cpu ? cpu->getRank() : 0, cpu ? cpu->getSize() : 1),
      cpu_(std::move(cpu)),
      lazy_(std::move(lazy)) {
  DTRAIN_ASSERT(cpu_ && lazy_, "LazyRouter needs a CPU backend and a LazyCuda");
}

const std::string LazyRouter::getBackendName() const {
  const std::string cuda = lazy_->name();
  return cuda.empty() || cuda == "auto" ? cpu_->getBackendName() : cuda;
}

Backend& LazyRouter::route(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.defined() && !t.is_cpu()) {
      const DeviceBackend* d = lazy_->get();
      if (!d) {
        throw UsageError("a collective on " + t.device().str() +
                         " tensors, but this group has no backend for them: not every rank "
                         "sees a GPU (CUDA_VISIBLE_DEVICES applies); move the tensor with .cpu()");
      }
      return *d->backend;
    }
  }
  return *cpu_;
}

Backend& LazyRouter::route(const std::vector<std::vector<at::Tensor>>& lists,
                           const std::vector<at::Tensor>& more) {
  std::vector<at::Tensor> all = more;
  for (const auto& l : lists) all.insert(all.end(), l.begin(), l.end());
  return route(all);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  return route(tensors).allreduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return route(tensors).allreduce_coalesced(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::reduce(std::vector<at::Tensor>& tensors,
                                                  const c10d::ReduceOptions& opts) {
  return route(tensors).reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::broadcast(std::vector<at::Tensor>& tensors,
                                                     const c10d::BroadcastOptions& opts) {
  return route(tensors).broadcast(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) {
  return route(outputs, inputs).allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions& opts) {
  return route({output, input})._allgather_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return route(outputs, inputs).allgather_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs,
                                                  const c10d::GatherOptions& opts) {
  return route(outputs, inputs).gather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::scatter(std::vector<at::Tensor>& outputs,
                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                   const c10d::ScatterOptions& opts) {
  return route(inputs, outputs).scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return route(inputs, outputs).reduce_scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return route({output, input})._reduce_scatter_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& output_split_sizes,
                                                         std::vector<int64_t>& input_split_sizes,
                                                         const c10d::AllToAllOptions& opts) {
  return route({output, input})
      .alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::alltoall(std::vector<at::Tensor>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::AllToAllOptions& opts) {
  return route({outputs, inputs}).alltoall(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::send(std::vector<at::Tensor>& tensors, int dst,
                                                int tag) {
  return route(tensors).send(tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::recv(std::vector<at::Tensor>& tensors, int src,
                                                int tag) {
  return route(tensors).recv(tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::recvAnysource(std::vector<at::Tensor>& tensors,
                                                         int tag) {
  return route(tensors).recvAnysource(tensors, tag);
}

c10::intrusive_ptr<c10d::Work> LazyRouter::barrier(const c10d::BarrierOptions& opts) {
  return cpu_->barrier(opts);
}

}  // namespace dtrain::comm
