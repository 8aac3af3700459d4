// Pipeline parallelism: a model's layers split into stages, one rank per stage (or several
// stages per rank, interleaved), with micro-batches streaming through them.
//
//   auto stages = dtrain::split_sequential(model, /*parts=*/mesh.size("pp"));
//   dtrain::Pipeline pipe(stages, mesh, {dtrain::Schedule::kOneFOneB, /*micro_batches=*/8});
//   torch::optim::SGD opt(pipe.parameters(), 0.1);
//   opt.zero_grad();
//   torch::Tensor loss = pipe.train_step(x, y, loss_fn);   // defined on the last stage only
//   opt.step();
//
// train_step splits the batch into M equal micro-batches, runs each stage's forwards and
// backwards in the order the schedule gives, and leaves in every parameter's .grad() the
// gradient of the mean over micro-batches of loss_fn (so a mean-reducing loss_fn gives the
// full batch's gradient, as without the pipeline). Activations go to the next stage and their
// gradients back by send/recv on the pipeline group; each message carries a small header with
// its dtype and shape ahead of the data, so stages need not declare what they exchange.
//
// Schedules (P ranks, M micro-batches, V stages per rank):
//   kGPipe               all M forwards, then all M backwards; M activations live per stage.
//   kOneFOneB            (PipeDream-flush / Megatron) P-1-p warm-up forwards on rank p, then
//                        one forward one backward, then the remaining backwards; at most P live.
//   kInterleavedOneFOneB (Megatron's interleaved) V model chunks per rank, global stage
//                        s = chunk * P + rank; a bubble V times smaller. Needs M % P == 0.
// Sends are asynchronous and waited at the end of the step. Receives are posted ahead, those
// of the next two operations before each operation runs, so an activation or gradient moves
// while the receiver computes. A message is one Gloo message, the header (dtype, shape) and
// the data after it (the sender copies the data in once), received ahead into a buffer of the
// size that message had at the previous step (a changed shape costs one more message).
// Waiting on a receive is bounded by the group's timeout. A rank always sends before it waits, so
// no schedule deadlocks. After train_step threw (a stage's error, a peer's failure) the pipeline's
// messages are out of step: build a new group and Pipeline.
//
// REQUIRES: every rank of the pipeline group calls train_step with the same batch size
// (inputs matter on the first stage, targets on the last; other ranks may pass any tensors
// of the right batch size). The stages' output is one tensor; a stage's input that is not
// floating point gets no gradient (so only stage 0 may take ids).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/collectives.h"
#include "dtrain/ddp.h"
#include "dtrain/mesh.h"
#include "dtrain/process_group.h"

namespace dtrain {

enum class SplitBy {
  kLayers,      // about the same number of children per stage
  kParameters,  // about the same number of parameters per stage (children stay whole)
};

// Splits `model`'s children, in order, into `parts` Sequentials (sharing the children, not
// copying them). UsageError when parts < 1 or exceeds the number of children.
std::vector<torch::nn::Sequential> split_sequential(const torch::nn::Sequential& model, int parts,
                                                    SplitBy by = SplitBy::kLayers);

enum class Schedule { kGPipe, kOneFOneB, kInterleavedOneFOneB };
// "gpipe", "1f1b", "interleaved_1f1b" (also "one_f_one_b", "interleaved_one_f_one_b").
Schedule parse_schedule(const std::string& name);
std::string schedule_name(Schedule schedule);

struct PipelineOptions {
  Schedule schedule = Schedule::kOneFOneB;  // Default: 1F1B.
  int micro_batches = 1;                    // Default: 1 (no pipelining). Must divide the batch.
  int virtual_stages = 1;                   // Stages per rank; > 1 only with kInterleavedOneFOneB.
  // Data parallelism over replicas of this pipeline (the mesh's "dp" dimension): each of this
  // rank's chunks is wrapped in a DistributedDataParallel with these options. Micro-batches
  // before the last accumulate gradients locally (DDP's no_sync); the last one's backward
  // averages each chunk's accumulated gradients over `group` in DDP's buckets, overlapping
  // the rest of the step. A null group means the mesh's "dp" group (the mesh constructor; a
  // UsageError with the group constructor). A one-rank group wraps nothing. Default: none.
  std::optional<DDPOptions> data_parallel;
};

// One step of a schedule on one rank: a forward or backward of micro-batch `micro_batch`
// through this rank's model chunk `chunk` (0 unless interleaved).
struct PipelineOp {
  enum Kind { kForward, kBackward } kind;
  int micro_batch;
  int chunk;
  bool operator==(const PipelineOp& o) const {
    return kind == o.kind && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};
// "F3" / "B3", with ".c" appended for chunk c > 0.
std::string to_string(const PipelineOp& op);

// The order of operations of `schedule` on rank `stage` of `stages` ranks. UsageError for
// an invalid combination (e.g. interleaved with M % P != 0, or V > 1 without interleaving).
std::vector<PipelineOp> schedule_ops(Schedule schedule, int stages, int stage, int micro_batches,
                                     int virtual_stages = 1);

using LossFn =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

class Pipeline {
 public:
  // `stages`: all P*V stages of the model in order (this rank keeps chunk c = stage c*P+rank),
  // or only this rank's V chunks. `group`: the pipeline ranks, in stage order.
  Pipeline(std::vector<torch::nn::Sequential> stages, std::shared_ptr<ProcessGroup> group,
           PipelineOptions options = {});
  // The same over mesh.group("pp").
  Pipeline(std::vector<torch::nn::Sequential> stages, const DeviceMesh& mesh,
           PipelineOptions options = {});

  // One forward and backward of the whole batch (see the file comment). Returns the mean loss
  // over the micro-batches on the rank holding the last stage, an undefined tensor elsewhere.
  // Throws UsageError for a batch not divisible by micro_batches; NetworkError/TimeoutError
  // when a peer fails.
  torch::Tensor train_step(const torch::Tensor& inputs, const torch::Tensor& targets,
                           const LossFn& loss_fn);

  // This rank's chunks and their parameters (what its optimizer updates).
  const std::vector<torch::nn::Sequential>& local_stages() const { return local_; }
  std::vector<torch::Tensor> parameters() const;
  bool is_first_stage() const { return rank_ == 0; }
  bool is_last_stage() const { return rank_ == size_ - 1; }
  int stage() const { return rank_; }
  int num_stages() const { return size_; }

  // What the last train_step did here: its operations in order, and the most micro-batches
  // whose activations were alive at once (forward done, backward not yet), over all chunks.
  const std::vector<PipelineOp>& last_trace() const { return trace_; }
  int peak_live_activations() const { return peak_live_; }
  // Whether this rank's chunks are wrapped in DistributedDataParallel (options.data_parallel
  // over a group of more than one rank).
  bool data_parallel() const { return !ddp_.empty(); }

 private:
  std::shared_ptr<ProcessGroup> group_;
  PipelineOptions options_;
  std::vector<torch::nn::Sequential> local_;
  int rank_ = 0, size_ = 1;
  std::vector<PipelineOp> trace_;
  int peak_live_ = 0;
  std::vector<std::unique_ptr<DistributedDataParallel<torch::nn::Sequential>>>
      ddp_;  // one per chunk, or none

  // Point to point (pipeline.cpp explains the protocol). Messages are keyed by (micro-batch,
  // receiving global stage, activation or gradient).
  struct WireShape {
    c10::ScalarType dtype;
    std::vector<int64_t> sizes;
    bool operator==(const WireShape& o) const;
  };
  struct PendingRecv {
    int src = 0;
    torch::Tensor message;  // header and the remembered shape's payload, as bytes
    Work work;
  };
  void send_part(const torch::Tensor& t, int dst, int tag);
  void send_message(const torch::Tensor& t, int dst, int key);
  void post_receive(int src, int key);
  torch::Tensor take_receive(int key);
  std::map<int, WireShape> sent_shapes_, recv_shapes_;  // each message's shape at the previous step
  std::map<int, PendingRecv> pending_;                  // receives posted, not yet taken
  std::vector<Work> sent_works_;                        // this step's sends, waited at its end
  std::vector<torch::Tensor> sent_keep_;
};

// Averages the gradients of `params` over `group` after a step, in one flat all-reduce (a
// parameter without a gradient gets a zero one; a null or one-rank group does nothing). For
// a Pipeline prefer PipelineOptions::data_parallel (DDP's buckets, overlapped with the last
// micro-batch's backward); this is for parameters outside a pipeline.
void all_reduce_gradients(const std::vector<torch::Tensor>& params,
                          const std::shared_ptr<ProcessGroup>& group);

}  // namespace dtrain
