// Horovod's API for libtorch C++ (namespace dtrain::hvd), on dtrain's runtime.
//
//     dtrain::hvd::init();                                   // under dtrain run / horovodrun /
//     torchrun torch::optim::SGD sgd(model->parameters(), 0.01 * dtrain::hvd::size());
//     dtrain::hvd::broadcast_parameters(model->named_parameters(), 0);
//     dtrain::hvd::DistributedOptimizer opt(sgd, model->named_parameters());
//     loss.backward(); opt.step();                            // gradients averaged over ranks
//
// How it works (Horovod's design, src/horovod/controller.cpp):
//   1. Every operation (allreduce, allgather, broadcast, alltoall, reducescatter, join,
//      barrier) is a named request queued to this process's background thread; the call
//      returns a handle at once (the synchronous forms wait on it).
//   2. Every HOROVOD_CYCLE_TIME ms the background threads of all ranks negotiate: each
//      all-gathers the requests it queued since the last cycle. Every rank thus holds the same
//      table "name -> ranks that submitted it", and a name is ready when every rank has.
//      Ready names are executed in one order every rank derives alike (by rank 0's submission
//      order), so ranks that submit the same names in different orders still pair them.
//   3. Consecutive ready allreduces with the same dtype and options are fused into one
//      buffer of up to HOROVOD_FUSION_THRESHOLD bytes (default 64 MiB; 0 turns fusion off)
//      and reduced with one collective.
//   4. Stall check: a name some ranks submitted and others not for
//      HOROVOD_STALL_CHECK_TIME_SECONDS (default 60) makes rank 0 warn, naming the tensor and
//      the missing ranks; after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (default 0: never) every
//      pending operation fails with that report.
// The collectives run on a process group of hvd's own (the shared-memory backend on one
// host, Gloo across hosts) over the job's store, so hvd's background thread never
// interleaves with collectives the program issues on dtrain's default group.
//
// Why a process-wide context (STYLE.md prefers passing groups): Horovod's API is global by
// contract (hvd.rank(), hvd.allreduce() take no group), and programs ported from it keep
// that shape. The context is made by init() and torn down by shutdown() (or at exit).
//
// Also Horovod's: the response cache (HOROVOD_CACHE_CAPACITY), the timeline
// (HOROVOD_TIMELINE=FILE: rank 0 writes one Chrome trace with each tensor's phases), Adasum.
// Elastic Horovod (hvd::elastic::run, TorchState): dtrain/horovod_elastic.h.
// Not built: process sets.
//
// Thread-safety: every function may be called from any thread once init() returned.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/codec.h"
#include "dtrain/error.h"

namespace dtrain::hvd {

// ---- basics ----------------------------------------------------------------------------

struct InitOptions {
  // Timeout of every collective and of every synchronize(). Default: 30 minutes.
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
};

// Joins the job: reads the worker environment (dtrain run, torchrun, horovodrun, the cluster
// engines: RANK/WORLD_SIZE/LOCAL_* or HOROVOD_*), builds hvd's process group over the job's
// store (the default group's when init_process_group() ran, else one init() makes) and starts
// the background thread. A second call while initialized does nothing.
// Outside a launched job (no launcher's variables, no HOROVOD_RANK/HOROVOD_SIZE), runs as one
// process - size 1, rank 0 - as Horovod's hvd.init() does without horovodrun. Throws
// NetworkError/TimeoutError when peers are missing.
void init(const InitOptions& options = {});
// Waits (up to the timeout) until every rank called shutdown(), fails what is still
// pending, stops the background thread and leaves hvd's group. Called at exit if not before.
void shutdown();
bool is_initialized();
int size();
int rank();
int local_size();
int local_rank();
int cross_size();  // number of hosts (nodes)
int cross_rank();  // this host's index

// ---- collectives ----------------------------------------------------------------------

enum class ReduceOp { Average, Sum, Adasum, Min, Max, Product };
// hvd::Average, hvd::Sum, ... as in Python.
inline constexpr ReduceOp Average = ReduceOp::Average;
inline constexpr ReduceOp Sum = ReduceOp::Sum;
inline constexpr ReduceOp Adasum = ReduceOp::Adasum;
inline constexpr ReduceOp Min = ReduceOp::Min;
inline constexpr ReduceOp Max = ReduceOp::Max;
inline constexpr ReduceOp Product = ReduceOp::Product;

// hvd::Compression::none / hvd::Compression::fp16: what goes over the wire. fp16 casts
// floating-point tensors to float16 for the reduction and back (half the bytes, 16-bit
// precision); other dtypes are sent as they are.
enum class Compression { none, fp16 };

struct AllreduceOptions {
  // Default: Average. Adasum: Horovod's adaptive summation, a' = (1 - a.b/(2|a|^2)) a +
  // (1 - a.b/(2|b|^2)) b per tensor, combined by recursive doubling (ranks 2k and 2k+1, then
  // pairs of pairs, ...); floating-point tensors on a power-of-2 number of ranks (else UsageError).
  ReduceOp op = ReduceOp::Average;
  // Requests are matched across ranks by name. Default: "allreduce.noname.<n>", n counting
  // this rank's unnamed allreduces (so unnamed calls must come in the same order everywhere).
  std::string name;
  Compression compression = Compression::none;
  double prescale_factor = 1.0;   // multiplies the input before the reduction
  double postscale_factor = 1.0;  // multiplies the result (after Average's division)
};

// A pending operation. synchronize() returns its result; poll() says whether it is done.
using Handle = int;

torch::Tensor allreduce(const torch::Tensor& tensor, const AllreduceOptions& options = {});
// In place: `tensor` receives the result.
torch::Tensor allreduce_(torch::Tensor& tensor, const AllreduceOptions& options = {});
Handle allreduce_async(const torch::Tensor& tensor, const AllreduceOptions& options = {});
Handle allreduce_async_(torch::Tensor& tensor, const AllreduceOptions& options = {});
// Reduces every tensor (fused, as one group); returns the results in order. Names default to
// "grouped_allreduce.noname.<n>.<i>"; a given name gets ".<i>" appended.
std::vector<torch::Tensor> grouped_allreduce(const std::vector<torch::Tensor>& tensors,
                                             const AllreduceOptions& options = {});

// Concatenates every rank's tensor along dim 0 in rank order; the first dimension may differ
// between ranks, the others must match.
torch::Tensor allgather(const torch::Tensor& tensor, const std::string& name = "");
Handle allgather_async(const torch::Tensor& tensor, const std::string& name = "");
// Rank root_rank's tensor on every rank (same shape and dtype everywhere).
torch::Tensor broadcast(const torch::Tensor& tensor, int root_rank, const std::string& name = "");
torch::Tensor broadcast_(torch::Tensor& tensor, int root_rank, const std::string& name = "");
Handle broadcast_async_(torch::Tensor& tensor, int root_rank, const std::string& name = "");

struct AlltoallResult {
  torch::Tensor output;           // the rows every rank sent us, in rank order
  torch::Tensor received_splits;  // int64 [size]: rows from each rank
};
// Sends rows [sum(splits[:j]), +splits[j]) of `tensor` to rank j. `splits` (int64 [size],
// summing to tensor.size(0)); undefined: equal parts (size(0) must divide evenly).
AlltoallResult alltoall(const torch::Tensor& tensor, const torch::Tensor& splits = {},
                        const std::string& name = "");
// Reduces every rank's tensor (op Average or Sum) and returns this rank's part of dim 0:
// rows split as evenly as possible, the first ranks getting one more.
torch::Tensor reducescatter(const torch::Tensor& tensor, ReduceOp op = ReduceOp::Average,
                            const std::string& name = "");
// This rank has no more data: it takes part in the other ranks' allreduces with zeros (and
// in allgathers with no rows) until every rank has joined. Returns the rank that joined last.
int join();
// Blocks until every rank called barrier().
void barrier();

// Waits for the operation (up to the timeout given to init()) and returns its result; throws
// what made it fail (UsageError for mismatched requests, TimeoutError after the timeout or
// the stall shutdown, NetworkError for a lost peer).
torch::Tensor synchronize(Handle handle);
bool poll(Handle handle);

// ---- model state ---------------------------------------------------------------------

// Every rank gets root_rank's values, in place (names must match across ranks).
void broadcast_parameters(const torch::OrderedDict<std::string, torch::Tensor>& params,
                          int root_rank);
void broadcast_parameters(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                          int root_rank);
// The optimizer's state (per-parameter state tensors and step counts, and each parameter
// group's options) becomes root_rank's. State the root has and a rank lacks (before its first
// step) is created from the root's.
void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root_rank);

namespace detail {
std::string broadcast_bytes(const std::string& bytes, int root_rank, const std::string& name);
}  // namespace detail

// Any value dtrain's codec encodes (dtrain/codec.h): root_rank's value on every rank.
template <Encodable T>
T broadcast_object(const T& value, int root_rank = 0, const std::string& name = "") {
  return decode<T>(detail::broadcast_bytes(encode(value), root_rank, name));
}

// ---- DistributedOptimizer ------------------------------------------------------------------

struct DistributedOptimizerOptions {
  Compression compression = Compression::none;
  // Backward passes accumulated locally before one reduction. Default: 1.
  int backward_passes_per_step = 1;
  // Average, Sum or Adasum. Adasum (Horovod's Adasum optimizer): step() steps the wrapped
  // optimizer locally on this rank's gradients (its state, e.g. momentum, stays per rank),
  // combines the parameter deltas with Adasum and sets every rank's parameters to
  // start + adasum(deltas); a power-of-2 number of ranks. Unlike Horovod, the local step and
  // the reduction both happen in step() (no overlap with backward).
  ReduceOp op = ReduceOp::Average;
  // With Average: gradients are divided by this before the sum and the result by
  // size/factor after it. Default: 1.
  double gradient_predivide_factor = 1.0;
};

// Wraps an optimizer (Horovod's hvd.DistributedOptimizer). A hook on each parameter's
// gradient accumulator submits its allreduce (named by the parameter) as soon as backward
// has produced it - after backward_passes_per_step passes - so communication overlaps the
// rest of backward; step() waits for every reduction, then steps the wrapped optimizer.
// REQUIRES: `optimizer` outlives this object; every rank passes the same names.
// Thread-safety: one training thread.
class DistributedOptimizer {
 public:
  DistributedOptimizer(torch::optim::Optimizer& optimizer,
                       const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
                       DistributedOptimizerOptions options = {});
  DistributedOptimizer(torch::optim::Optimizer& optimizer,
                       const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
                       DistributedOptimizerOptions options = {});
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Submits what the hooks have not (parameters without a gradient reduce zeros), waits for
  // every reduction (each up to init()'s timeout) and writes the results into the gradients.
  // Throws TimeoutError naming a parameter still pending after the timeout.
  void synchronize();
  // Synchronizes (unless synchronize() ran since the last step and a SkipSynchronize guard
  // is alive), then steps the wrapped optimizer.
  void step();
  void zero_grad();
  torch::optim::Optimizer& optimizer() { return optimizer_; }

  // While alive, step() does not synchronize again: for clipping between the two:
  //   opt.synchronize(); clip_grad_norm_(...); { auto g = opt.skip_synchronize(); opt.step(); }
  class SkipSynchronize {
   public:
    explicit SkipSynchronize(DistributedOptimizer& o) : o_(o) { o_.skip_ = true; }
    ~SkipSynchronize() { o_.skip_ = false; }
    SkipSynchronize(const SkipSynchronize&) = delete;
    SkipSynchronize& operator=(const SkipSynchronize&) = delete;

   private:
    DistributedOptimizer& o_;
  };
  [[nodiscard]] SkipSynchronize skip_synchronize() { return SkipSynchronize(*this); }

 private:
  void install_hooks();
  void on_gradient(size_t index);
  void submit(size_t index);
  void adasum_synchronize();

  torch::optim::Optimizer& optimizer_;
  DistributedOptimizerOptions options_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
  std::vector<int> passes_left_;  // backward passes until a parameter is submitted
  std::vector<Handle> handles_;   // -1: not submitted this step
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
  bool skip_ = false;
  bool synchronized_ = false;
};

}  // namespace dtrain::hvd
