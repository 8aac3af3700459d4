// DistributedDataParallel for torch::nn modules: PyTorch's DDP for the C++ frontend.
//
//   auto model = Net();                                  // any torch::nn module
//   dtrain::DistributedDataParallel ddp(model);          // broadcasts rank 0's state
//   auto loss = loss_fn(ddp(x), y);                      // forward through the wrapper
//   loss.backward();                                     // gradients are averaged here
//   optimizer.step();                                    // sees averaged gradients
//
// How it works (the Reducer, src/parallel/ddp.cpp):
//   1. Construction checks every rank has the same parameters (names, shapes, dtypes; the
//      error names the first mismatch and the ranks) and broadcasts rank 0's parameters and
//      buffers, coalesced into a few flat tensors.
//   2. Parameters are packed into buckets in reverse registration order (roughly the order
//      backward produces their gradients): the first bucket holds up to first_bucket_mb, the
//      others up to bucket_cap_mb. Each bucket is one flat tensor.
//   3. A post-hook on every parameter's gradient accumulator copies the finished gradient
//      into its bucket (with gradient_as_bucket_view the gradient already is its place in the
//      bucket after the first step, and nothing is copied). When a bucket is complete - and every
//      bucket before it has been launched, so all ranks issue collectives in the same order - its
//      communication hook starts an asynchronous all-reduce. Communication overlaps the rest of
//      backward.
//   4. At the end of backward (an autograd engine callback) the remaining buckets are
//      launched, every bucket is waited for, and the averaged gradients are copied back into
//      each parameter's .grad (with gradient_as_bucket_view they are there already).
// Why our own reducer rather than c10d::Reducer: Debian's libtorch ships c10d/reducer.hpp
// without the distributed-autograd header it includes, and the bucket logic above is small
// enough to own, test and extend (hooks, compression) ourselves.
//
// Thread-safety: one DDP object is used by one training thread.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/collectives.h"
#include "dtrain/module_ref.h"
#include "dtrain/process_group.h"

namespace dtrain {

// One bucket as a communication hook sees it.
struct GradBucket {
  int index = 0;                          // 0 is the first bucket launched (last parameters)
  torch::Tensor buffer;                   // flat, this rank's (not yet averaged) gradients
  std::vector<torch::Tensor> parameters;  // the parameters whose gradients it holds
  bool is_last = false;
};

// Starts communicating `bucket` and returns the pending work. When the Work's wait()
// returns, bucket.buffer must hold the gradients averaged over the group.
using CommHook = std::function<Work(ProcessGroup& group, GradBucket& bucket)>;

// The default: all_reduce(avg) of the buffer (on Gloo: a sum, then a division by the world size).
CommHook allreduce_hook();
// Compress to float16 / bfloat16 for the wire, average, decompress: half the bytes sent,
// at the cost of 16-bit precision in the averaged gradients.
CommHook fp16_compress_hook();
CommHook bf16_compress_hook();

struct DDPOptions {
  std::shared_ptr<ProcessGroup> group;  // Default: the default group.
  double bucket_cap_mb = 25;            // Default: 25 MB (PyTorch's).
  double first_bucket_mb = 1;           // Default: 1 MB (PyTorch's).
  // Broadcast rank 0's buffers (e.g. BatchNorm running stats) before every forward.
  bool broadcast_buffers = true;  // Default: true.
  // Allow parameters that get no gradient in an iteration (they contribute zeros). Without
  // it such a parameter is an error at the end of backward, naming it. Default: false.
  bool find_unused_parameters = false;
  // Each parameter's .grad shares memory with its place in the bucket (PyTorch's option of
  // the same name): backward accumulates straight into the bucket, and the averaged gradients
  // are not copied back - one gradient-sized copy less per step, and one gradient-sized
  // buffer less. optimizer.zero_grad() works both ways: zeroing in place keeps the sharing,
  // setting to none costs one copy into the bucket at the next backward. A gradient the user
  // replaces is copied in likewise. Default: false (PyTorch's).
  bool gradient_as_bucket_view = false;
  CommHook comm_hook;  // Default: allreduce_hook().
};

namespace detail {

// The non-template core shared by every DistributedDataParallel<M>.
class Reducer {
 public:
  Reducer(torch::nn::Module& module, DDPOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  void before_forward();  // buffer broadcast, per-iteration reset
  void set_sync(bool enabled) { sync_enabled_ = enabled; }
  bool sync_enabled() const { return sync_enabled_; }
  void set_comm_hook(CommHook hook) { options_.comm_hook = std::move(hook); }
  // Bucket layout, by parameter index (in module.parameters() order), for tests.
  std::vector<std::vector<size_t>> bucket_parameter_indices() const;
  ProcessGroup& group() { return *group_; }

 private:
  struct Bucket {
    std::vector<size_t> params;    // indices into params_
    std::vector<int64_t> offsets;  // element offset of each param in buffer
    torch::Tensor buffer;
    size_t pending = 0;  // parameters not ready yet this iteration
    bool launched = false;
    Work work;
  };

  void check_parameters_match();
  void broadcast_state(const std::vector<torch::Tensor>& tensors);
  void build_buckets();
  void install_hooks();
  void mark_ready(size_t param_index);
  void launch_ready_buckets();
  void launch(Bucket& bucket, size_t index);
  void finalize();
  // Parameter i's place in its bucket, shaped like the parameter.
  torch::Tensor bucket_view(size_t i) const;
  // With gradient_as_bucket_view: whether parameter i's .grad is its bucket view already.
  bool grad_is_bucket_view(size_t i) const;

  torch::nn::Module& module_;
  DDPOptions options_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> param_names_;
  std::vector<torch::Tensor> buffers_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> location_;  // param -> (bucket, slot)
  std::vector<bool> ready_;
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
  size_t next_bucket_ = 0;
  bool sync_enabled_ = true;
  bool callback_queued_ = false;
};

}  // namespace detail

// Wraps a module holder (torch::nn::Linear, a TORCH_MODULE type, nn::Sequential) or a
// std::shared_ptr to a module. Movable, not copyable.
template <typename ModuleType>
class DistributedDataParallel {
 public:
  explicit DistributedDataParallel(ModuleType module, DDPOptions options = {})
      : module_(std::move(module)),
        reducer_(
            std::make_unique<detail::Reducer>(detail::module_ref(module_), std::move(options))) {}

  // Runs the wrapped module's forward (after broadcasting buffers when asked to).
  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    reducer_->before_forward();
    return module_->forward(std::forward<Args>(args)...);
  }
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // The unwrapped module (what rank 0 saves in a checkpoint).
  ModuleType& module() { return module_; }
  std::vector<torch::Tensor> parameters() const { return detail::module_ref(module_).parameters(); }
  void train(bool on = true) { detail::module_ref(module_).train(on); }
  void eval() { train(false); }

  void register_comm_hook(CommHook hook) { reducer_->set_comm_hook(std::move(hook)); }

  // While the guard lives, backward accumulates gradients locally without communicating;
  // the first backward after it averages the accumulated gradients (gradient accumulation).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(detail::Reducer& r) : r_(r), was_(r.sync_enabled()) { r_.set_sync(false); }
    ~NoSyncGuard() { r_.set_sync(was_); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    detail::Reducer& r_;
    bool was_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }

  detail::Reducer& reducer() { return *reducer_; }

 private:
  ModuleType module_;
  std::unique_ptr<detail::Reducer> reducer_;
};

}  // namespace dtrain
