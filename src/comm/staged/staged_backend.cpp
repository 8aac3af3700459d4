#include "comm/staged/staged_backend.h"

#include <mutex>
#include <utility>

#include "core/thread_annotations.h"
#include "dtrain/error.h"

namespace dtrain::comm {

namespace {

// The inner backend's Work, plus the copies of its host results back into the caller's
// device tensors, made once, by the first wait() that sees the collective done.
class StagedWork : public c10d::Work {
 public:
  StagedWork(int rank, c10d::OpType type, c10::intrusive_ptr<c10d::Work> inner,
             std::vector<std::pair<at::Tensor, at::Tensor>> back, std::vector<at::Tensor> keep)
      : c10d::Work(rank, type),
        inner_(std::move(inner)),
        back_(std::move(back)),
        keep_(std::move(keep)) {}

  bool wait(std::chrono::milliseconds timeout) override {
    const bool done = inner_->wait(timeout);  // throws the inner backend's error
    MutexLock lock(mu_);
    if (!copied_) {
      for (auto& [device, host] : back_) device.copy_(host, /*non_blocking=*/device.is_cuda());
      copied_ = true;
    }
    return done;
  }
  // True once wait() copied the results back (before that the caller's tensors do not hold
  // them yet, whatever the inner backend says), or once the inner collective failed (nothing
  // will be copied; the error is the inner one).
  bool isCompleted() override {
    {
      MutexLock lock(mu_);
      if (copied_) return true;
    }
    return inner_->isCompleted() && inner_->exception() != nullptr;
  }
  std::exception_ptr exception() const override { return inner_->exception(); }
  std::vector<at::Tensor> result() override {
    std::vector<at::Tensor> out;
    for (auto& [device, host] : back_) out.push_back(device);
    return out;
  }
  void abort() override { inner_->abort(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::vector<std::pair<at::Tensor, at::Tensor>> back_;  // (caller's tensor, host result)
  std::vector<at::Tensor> keep_;                         // host inputs, alive until done
  Mutex mu_;
  bool copied_ DTRAIN_GUARDED_BY(mu_) = false;
};

std::vector<std::pair<at::Tensor, at::Tensor>> pairs(const std::vector<at::Tensor>& device,
                                                     const std::vector<at::Tensor>& host) {
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (size_t i = 0; i < device.size(); ++i) {
    if (!device[i].is_same(host[i])) out.emplace_back(device[i], host[i]);
  }
  return out;
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& list : lists) out.insert(out.end(), list.begin(), list.end());
  return out;
}

}  // namespace

StagedBackend::StagedBackend(c10::intrusive_ptr<Backend> inner, bool stage_all)
    : Backend(inner ? inner->getRank() : 0, inner ? inner->getSize() : 1),
      inner_(std::move(inner)),
      stage_all_(stage_all) {
  DTRAIN_ASSERT(inner_, "StagedBackend needs an inner backend");
}

bool StagedBackend::stages(const at::Tensor& t) const {
  return t.defined() && (stage_all_ || !t.device().is_cpu());
}

std::vector<at::Tensor> StagedBackend::to_host(const std::vector<at::Tensor>& tensors,
                                               bool copy_in) const {
  std::vector<at::Tensor> host;
  host.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (!stages(t)) {
      host.push_back(t);
      continue;
    }
    // Pinned when the source is a CUDA tensor: the copies are DMA, and the copy back can be
    // asynchronous on the caller's stream.
    at::Tensor h = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(t.is_cuda()));
    if (copy_in) h.copy_(t);  // waits for the work queued on the current stream
    host.push_back(h);
  }
  return host;
}

std::vector<std::vector<at::Tensor>> StagedBackend::to_host(
    const std::vector<std::vector<at::Tensor>>& lists, bool copy_in) const {
  std::vector<std::vector<at::Tensor>> host;
  host.reserve(lists.size());
  for (const auto& list : lists) host.push_back(to_host(list, copy_in));
  return host;
}

c10::intrusive_ptr<c10d::Work> StagedBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  auto host = to_host(tensors, true);
  auto w = inner_->allreduce(host, opts);
  return c10::make_intrusive<StagedWork>(rank_, c10d::OpType::ALLREDUCE, w, pairs(tensors, host),
                                         host);
}

c10::intrusive_ptr<c10d::Work> StagedBackend::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  auto host = to_host(tensors, true);
  auto w = inner_->reduce(host, opts);
  // Only the root's tensor holds the result (NCCL leaves the others as they were).
  auto back = opts.rootRank == rank_ ? pairs(tensors, host)
                                     : std::vector<std::pair<at::Tensor, at::Tensor>>{};
  return c10::make_intrusive<StagedWork>(rank_, c10d::OpType::REDUCE, w, back, host);
}

c10::intrusive_ptr<c10d::Work> StagedBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  const bool root = opts.rootRank == rank_;
  auto host = to_host(tensors, /*copy_in=*/root);
  auto w = inner_->broadcast(host, opts);
  auto back = root ? std::vector<std::pair<at::Tensor, at::Tensor>>{} : pairs(tensors, host);
  return c10::make_intrusive<StagedWork>(rank_, c10d::OpType::BROADCAST, w, back, host);
}

c10::intrusive_ptr<c10d::Work> StagedBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  auto in = to_host(inputs, true);
  auto out = to_host(outputs, false);
  auto back = pairs(flatten(outputs), flatten(out));
  auto w = inner_->allgather(out, in, opts);
  return c10::make_intrusive<StagedWork>(rank_, c10d::OpType::ALLGATHER, w, back, in);
}

c10::intrusive_ptr<c10d::Work> StagedBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  auto in = to_host({input}, true);
  auto out = to_host({output}, false);
  auto w = inner_->_allgather_base(out[0], in[0], opts);
  return c10::make_intrusive<StagedWork>(rank_, c10d::OpType::_ALLGATHER_BASE, w,
                                         pairs({output}, out), in);
}

c10::intrusive_ptr<c10d::Work> StagedBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::GatherOptions& opts) {
  auto in = to_host(inputs, true);
  auto out = to_host(outputs, false);
  auto back = pairs(flatten(outputs), flatten(out));
  auto w = inner_->gather(out, in, opts);
  return c10::make_intrusive<StagedWork>(rank_, c10d::OpType::GATHER, w, back, in);
}

c10::intrusive_ptr<c10d::Work> StagedBackend::scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      const c10d::ScatterOptions& opts) {
  auto in = to_host(inputs, true);
  auto out = to_host(outputs, false);
  auto w = inner_->scatter(out, in, opts);
  return c10::make_intrusive<StagedWork>(rank_, c10d::OpType::SCATTER, w, pairs(outputs, out),
                                         flatten(in));
}

c10::intrusive_ptr<c10d::Work> StagedBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  auto in = to_host(inputs, true);
  auto out = to_host(outputs, false);
  auto w = inner_->reduce_scatter(out, in, opts);
  return c10::make_intrusive<StagedWork>(rank_, c10d::OpType::REDUCE_SCATTER, w,
                                         pairs(outputs, out), flatten(in));
}

c10::intrusive_ptr<c10d::Work> StagedBackend::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  auto in = to_host({input}, true);
  auto out = to_host({output}, false);
  auto w = inner_->alltoall_base(out[0], in[0], output_split_sizes, input_split_sizes, opts);
  return c10::make_intrusive<StagedWork>(rank_, c10d::OpType::ALLTOALL_BASE, w,
                                         pairs({output}, out), in);
}

c10::intrusive_ptr<c10d::Work> StagedBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  auto in = to_host(inputs, true);
  auto out = to_host(outputs, false);
  auto w = inner_->alltoall(out, in, opts);
  return c10::make_intrusive<StagedWork>(rank_, c10d::OpType::ALLTOALL, w, pairs(outputs, out), in);
}

c10::intrusive_ptr<c10d::Work> StagedBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                   int tag) {
  auto host = to_host(tensors, true);
  auto w = inner_->send(host, dst, tag);
  return c10::make_intrusive<StagedWork>(rank_, c10d::OpType::SEND, w,
                                         std::vector<std::pair<at::Tensor, at::Tensor>>{}, host);
}

c10::intrusive_ptr<c10d::Work> StagedBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                   int tag) {
  auto host = to_host(tensors, false);
  auto w = inner_->recv(host, src, tag);
  return c10::make_intrusive<StagedWork>(rank_, c10d::OpType::RECV, w, pairs(tensors, host),
                                         std::vector<at::Tensor>{});
}

c10::intrusive_ptr<c10d::Work> StagedBackend::barrier(const c10d::BarrierOptions& opts) {
  return inner_->barrier(opts);
}

}  // namespace dtrain::comm
