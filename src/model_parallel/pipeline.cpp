#include "dtrain/pipeline.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "dtrain/collectives.h"
#include "dtrain/error.h"

namespace dtrain {

// ---- splitting ----

std::vector<torch::nn::Sequential> split_sequential(const torch::nn::Sequential& model, int parts,
                                                    SplitBy by) {
  const int n = static_cast<int>(model->size());
  if (parts < 1 || parts > n) {
    throw UsageError("split_sequential: cannot split " + std::to_string(n) + " layers into " +
                     std::to_string(parts) + " stages; use 1 to " + std::to_string(n) + " stages");
  }
  std::vector<int64_t> weight(n, 1);
  if (by == SplitBy::kParameters) {
    for (int i = 0; i < n; ++i) {
      int64_t count = 0;
      for (const auto& p : model->ptr(i)->parameters()) count += p.numel();
      weight[i] = count;
    }
  }
  // Greedy cut: stage k takes layers until the running total reaches (k+1)/parts of the
  // whole, taking at least one and leaving at least one for each later stage.
  int64_t total = 0;
  for (auto w : weight) total += w;
  std::vector<int> ends;
  int64_t running = 0;
  int i = 0;
  for (int k = 0; k < parts - 1; ++k) {
    const int limit = n - (parts - k - 1);
    running += weight[i++];
    while (i < limit &&
           static_cast<long double>(running) * parts < static_cast<long double>(total) * (k + 1)) {
      running += weight[i++];
    }
    ends.push_back(i);
  }
  ends.push_back(n);
  std::vector<torch::nn::Sequential> stages;
  auto any = model->begin();
  auto names = model->named_children();
  int begin = 0;
  for (int end : ends) {
    torch::nn::Sequential stage;
    for (int j = begin; j < end; ++j)
      stage->push_back(std::string(names[j].key()), torch::nn::AnyModule(*(any + j)));
    stages.push_back(stage);
    begin = end;
  }
  return stages;
}

// ---- schedules ----

Schedule parse_schedule(const std::string& name) {
  if (name == "gpipe") return Schedule::kGPipe;
  if (name == "1f1b" || name == "one_f_one_b") return Schedule::kOneFOneB;
  if (name == "interleaved_1f1b" || name == "interleaved_one_f_one_b")
    return Schedule::kInterleavedOneFOneB;
  throw UsageError("unknown pipeline schedule '" + name + "'; use gpipe, 1f1b or interleaved_1f1b");
}

std::string schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kGPipe:
      return "gpipe";
    case Schedule::kOneFOneB:
      return "1f1b";
    case Schedule::kInterleavedOneFOneB:
      return "interleaved_1f1b";
  }
  return "?";
}

std::string to_string(const PipelineOp& op) {
  // Appended piece by piece: GCC 12 warns (-Wstringop-overflow, a false positive) on
  // "literal" + std::to_string(...) here.
  std::string s(op.kind == PipelineOp::kForward ? "F" : "B");
  s += std::to_string(op.micro_batch);
  if (op.chunk > 0) {
    s += '.';
    s += std::to_string(op.chunk);
  }
  return s;
}

std::vector<PipelineOp> schedule_ops(Schedule schedule, int stages, int stage, int micro_batches,
                                     int virtual_stages) {
  const int P = stages, p = stage, M = micro_batches, V = virtual_stages;
  if (P < 1 || p < 0 || p >= P || M < 1 || V < 1) {
    throw UsageError(
        "pipeline schedule: need stages >= 1, 0 <= stage < stages, micro_batches >= 1 and "
        "virtual_stages >= 1; got stages=" +
        std::to_string(P) + " stage=" + std::to_string(p) + " micro_batches=" + std::to_string(M) +
        " virtual_stages=" + std::to_string(V));
  }
  if (V > 1 && schedule != Schedule::kInterleavedOneFOneB) {
    throw UsageError("pipeline schedule: virtual_stages=" + std::to_string(V) +
                     " needs the interleaved_1f1b schedule (" + schedule_name(schedule) +
                     " runs one stage per rank)");
  }
  std::vector<PipelineOp> ops;
  auto F = [&](int mb, int c = 0) { ops.push_back({PipelineOp::kForward, mb, c}); };
  auto B = [&](int mb, int c = 0) { ops.push_back({PipelineOp::kBackward, mb, c}); };
  if (schedule == Schedule::kGPipe) {
    for (int m = 0; m < M; ++m) F(m);
    for (int m = 0; m < M; ++m) B(m);
    return ops;
  }
  if (schedule == Schedule::kOneFOneB) {
    // Rank p starts P-1-p forwards ahead, so the last stage's first backward can start as
    // soon as its first forward is done; then each backward frees what a forward holds.
    const int warmup = std::min(P - 1 - p, M);
    for (int m = 0; m < warmup; ++m) F(m);
    for (int i = 0; i < M - warmup; ++i) {
      F(warmup + i);
      B(i);
    }
    for (int m = M - warmup; m < M; ++m) B(m);
    return ops;
  }
  // Interleaved (Megatron-LM): the k-th forward of this rank runs chunk (k / P) % V of
  // micro-batch (k / (P V)) P + k % P, i.e. groups of P micro-batches go through chunk 0,
  // then chunk 1, ...; backwards walk the chunks in reverse.
  if (M % P != 0) {
    throw UsageError("interleaved_1f1b: micro_batches=" + std::to_string(M) +
                     " must be a multiple of the pipeline size " + std::to_string(P));
  }
  const int total = M * V;
  auto mb_of = [&](int k) { return (k / (P * V)) * P + k % P; };
  auto chunk_f = [&](int k) { return (k % (P * V)) / P; };
  auto chunk_b = [&](int k) { return V - 1 - (k % (P * V)) / P; };
  int warmup = (M == P) ? total : std::min(total, (P - p - 1) * 2 + (V - 1) * P);
  for (int k = 0; k < warmup; ++k) F(mb_of(k), chunk_f(k));
  for (int i = 0; i < total - warmup; ++i) {
    F(mb_of(warmup + i), chunk_f(warmup + i));
    B(mb_of(i), chunk_b(i));
  }
  for (int k = total - warmup; k < total; ++k) B(mb_of(k), chunk_b(k));
  return ops;
}

// ---- point to point with shapes ----
//
// Every activation or gradient that crosses ranks is one message of the step, keyed by
// (micro-batch, receiving global stage, activation or gradient). Gloo's send and recv meet by
// rendezvous: the bytes move only once both are posted, so a receive posted at the moment it
// is needed costs a round trip between the ranks (and the wake-ups of both ranks' threads) on
// the step's critical path. So each rank posts its receives ahead: before running an
// operation, it posts the receives of the next kRecvLookahead operations (Megatron's
// p2p_communication and torch.distributed.pipelining post the next receive the same way), and
// a sender never waits for its sends until the end of the step.
//
// A message is one Gloo message of bytes: a header (dtype, rank, sizes; kHeaderBytes) and the
// payload after it, so a hop costs one send, one receive and one notification (a separate
// header message doubled each, and every one is a syscall on the rank's thread and a wake-up
// of the peer's Gloo thread). The sender copies the payload into the message once.
//
// A message can be received ahead only into a buffer of the right size, so both ends
// remember each message's dtype and shape from the previous step (the same on both ends:
// the sender's last header is the receiver's). The message is posted with the header and a
// payload of that shape (the header alone at the first step, where nothing is remembered).
// When the shape is what was remembered, that is all; when it changed (or at the first step),
// the sender sends the posted size with the new shape in the header and whatever bytes in the
// payload, then the real payload under a second tag, which the receiver takes after reading
// the header.

namespace {

constexpr int kMaxDims = 8;
constexpr int64_t kHeaderBytes =
    (kMaxDims + 2) * 8;            // dtype, rank, sizes as int64; keeps the payload 16-byte aligned
constexpr int kRecvLookahead = 2;  // operations ahead of the running one whose receives are posted

enum class Part { kMessage = 0, kResized = 1 };

int message_key(int mb, int stage, int num_stages, bool grad) {
  return (mb * num_stages + stage) * 2 + (grad ? 1 : 0);
}
int tag_of(int key, Part part) { return key * 2 + static_cast<int>(part); }

int64_t payload_bytes(const std::vector<int64_t>& sizes, c10::ScalarType dtype) {
  int64_t n = static_cast<int64_t>(c10::elementSize(dtype));
  for (int64_t s : sizes) n *= s;
  return n;
}

// A tensor of `sizes` and `dtype` over `bytes` + `offset`, keeping `bytes` alive (no copy).
torch::Tensor over_bytes(const torch::Tensor& bytes, int64_t offset,
                         const std::vector<int64_t>& sizes, c10::ScalarType dtype) {
  return torch::from_blob(
      bytes.data_ptr<uint8_t>() + offset, sizes, [bytes](void*) {},
      torch::TensorOptions().dtype(dtype));
}

}  // namespace

bool Pipeline::WireShape::operator==(const WireShape& o) const {
  return dtype == o.dtype && sizes == o.sizes;
}

void Pipeline::send_part(const torch::Tensor& t, int dst, int tag) {
  PointToPointOptions o;
  o.group = group_;
  o.tag = tag;
  sent_works_.push_back(send_async(t, dst, o));
  sent_keep_.push_back(t);  // alive until the send completes
}

void Pipeline::send_message(const torch::Tensor& t, int dst, int key) {
  if (t.dim() > kMaxDims) {
    throw UsageError("Pipeline: a stage output has " + std::to_string(t.dim()) +
                     " dimensions; at most " + std::to_string(kMaxDims) + " are supported");
  }
  torch::Tensor data = t.detach().contiguous();
  WireShape now{t.scalar_type(), t.sizes().vec()};
  const int64_t nbytes = payload_bytes(now.sizes, now.dtype);
  auto it = sent_shapes_.find(key);
  const bool same = it != sent_shapes_.end() && it->second == now;
  // The size the receiver posted: the header and the remembered shape's payload.
  const int64_t posted =
      kHeaderBytes +
      (it == sent_shapes_.end() ? 0 : payload_bytes(it->second.sizes, it->second.dtype));
  torch::Tensor msg = torch::empty({posted}, torch::kUInt8);
  auto* h = reinterpret_cast<int64_t*>(msg.data_ptr<uint8_t>());
  std::fill(h, h + kMaxDims + 2, int64_t{0});
  h[0] = static_cast<int64_t>(now.dtype);
  h[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) h[d + 2] = t.size(d);
  if (same) {
    if (nbytes > 0)
      std::memcpy(msg.data_ptr<uint8_t>() + kHeaderBytes, data.data_ptr(),
                  static_cast<size_t>(nbytes));
    send_part(msg, dst, tag_of(key, Part::kMessage));
    return;
  }
  // First step, or the shape changed: the posted size (its payload bytes unused), then the
  // real payload.
  send_part(msg, dst, tag_of(key, Part::kMessage));
  send_part(torch::from_blob(
                data.data_ptr(), {nbytes}, [data](void*) {}, torch::kUInt8),
            dst, tag_of(key, Part::kResized));
  sent_shapes_[key] = std::move(now);
}

void Pipeline::post_receive(int src, int key) {
  PendingRecv& r = pending_[key];
  r.src = src;
  auto it = recv_shapes_.find(key);
  const int64_t posted =
      kHeaderBytes +
      (it == recv_shapes_.end() ? 0 : payload_bytes(it->second.sizes, it->second.dtype));
  r.message = torch::empty({posted}, torch::kUInt8);
  PointToPointOptions o;
  o.group = group_;
  o.tag = tag_of(key, Part::kMessage);
  r.work = recv_async(r.message, src, o);
}

torch::Tensor Pipeline::take_receive(int key) {
  auto node = pending_.extract(key);
  TORCH_INTERNAL_ASSERT(!node.empty(), "Pipeline: receive of message ", key, " was not posted");
  PendingRecv& r = node.mapped();
  r.work.wait();
  const auto* h = reinterpret_cast<const int64_t*>(r.message.data_ptr<uint8_t>());
  if (h[1] < 0 || h[1] > kMaxDims || h[0] < 0 ||
      h[0] >= static_cast<int64_t>(c10::ScalarType::NumOptions)) {
    throw Error("Pipeline: message " + std::to_string(key) + " from rank " + std::to_string(r.src) +
                " has a corrupt header (dtype " + std::to_string(h[0]) + ", " +
                std::to_string(h[1]) + " dimensions); the pipeline ranks are out of step");
  }
  WireShape now{static_cast<c10::ScalarType>(h[0]), std::vector<int64_t>(h + 2, h + 2 + h[1])};
  auto it = recv_shapes_.find(key);
  // The payload is the message's tail: a tensor over it that keeps the message alive.
  if (it != recv_shapes_.end() && it->second == now)
    return over_bytes(r.message, kHeaderBytes, now.sizes, now.dtype);
  // First step, or the shape changed (the message's payload bytes were filler).
  torch::Tensor bytes = torch::empty({payload_bytes(now.sizes, now.dtype)}, torch::kUInt8);
  PointToPointOptions o;
  o.group = group_;
  o.tag = tag_of(key, Part::kResized);
  recv(bytes, r.src, o);
  torch::Tensor data = over_bytes(bytes, 0, now.sizes, now.dtype);
  recv_shapes_[key] = std::move(now);
  return data;
}

// ---- Pipeline ----

Pipeline::Pipeline(std::vector<torch::nn::Sequential> stages, std::shared_ptr<ProcessGroup> group,
                   PipelineOptions options)
    : group_(std::move(group)), options_(options) {
  rank_ = group_ ? group_->rank() : 0;
  size_ = group_ ? group_->world_size() : 1;
  const int V = options_.virtual_stages;
  // Validates the options once, here, rather than at the first step.
  schedule_ops(options_.schedule, size_, rank_, options_.micro_batches, V);
  if (V > 1 && size_ == 1) {
    throw UsageError(
        "Pipeline: virtual_stages=" + std::to_string(V) +
        " on a pipeline of one rank; interleaving needs at least 2 ranks (use virtual_stages=1)");
  }
  const int n = static_cast<int>(stages.size());
  if (n == size_ * V) {
    for (int c = 0; c < V; ++c) local_.push_back(stages[c * size_ + rank_]);
  } else if (n == V) {
    local_ = std::move(stages);
  } else {
    throw UsageError("Pipeline: got " + std::to_string(n) + " stages for " + std::to_string(size_) +
                     " ranks x " + std::to_string(V) + " virtual stages; pass all " +
                     std::to_string(size_ * V) + " stages (split_sequential(model, " +
                     std::to_string(size_ * V) + ")) or this rank's " + std::to_string(V));
  }
  if (options_.data_parallel) {
    const auto& dp = options_.data_parallel->group;
    if (!dp) {
      throw UsageError(
          "Pipeline: options.data_parallel has no group; set data_parallel->group to the "
          "data-parallel "
          "group (e.g. mesh.group(\"dp\")), or construct the Pipeline from a DeviceMesh with a "
          "\"dp\" dimension");
    }
    // Every replica wraps its chunks in the same order, so DDP's construction-time checks and
    // broadcasts (collectives on the dp group) line up.
    if (dp->world_size() > 1) {
      for (auto& chunk : local_) {
        ddp_.push_back(std::make_unique<DistributedDataParallel<torch::nn::Sequential>>(
            chunk, *options_.data_parallel));
      }
    }
  }
}

namespace {
PipelineOptions with_mesh_dp(PipelineOptions o, const DeviceMesh& mesh) {
  if (o.data_parallel && !o.data_parallel->group) o.data_parallel->group = mesh.group("dp");
  return o;
}
}  // namespace

Pipeline::Pipeline(std::vector<torch::nn::Sequential> stages, const DeviceMesh& mesh,
                   PipelineOptions options)
    : Pipeline(std::move(stages), mesh.group("pp"), with_mesh_dp(std::move(options), mesh)) {}

std::vector<torch::Tensor> Pipeline::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& s : local_) {
    for (auto& p : s->parameters()) out.push_back(p);
  }
  return out;
}

torch::Tensor Pipeline::train_step(const torch::Tensor& inputs, const torch::Tensor& targets,
                                   const LossFn& loss_fn) {
  const int P = size_, p = rank_, M = options_.micro_batches, V = options_.virtual_stages;
  const int S = P * V;  // global stages
  if (inputs.dim() == 0 || inputs.size(0) % M != 0) {
    throw UsageError("Pipeline::train_step: batch size " +
                     std::to_string(inputs.dim() ? inputs.size(0) : 0) +
                     " is not divisible by micro_batches=" + std::to_string(M));
  }
  std::vector<torch::Tensor> in_mb = inputs.chunk(M, 0);
  std::vector<torch::Tensor> tgt_mb;
  if (targets.defined() && targets.dim() > 0) tgt_mb = targets.chunk(M, 0);

  struct Live {
    torch::Tensor input;   // what the chunk received (a leaf that collects its gradient)
    torch::Tensor output;  // the chunk's output, or the scaled loss on the last stage
  };
  std::map<std::pair<int, int>, Live> live;  // (chunk, micro-batch)
  sent_works_.clear();
  sent_keep_.clear();
  trace_.clear();
  peak_live_ = 0;
  torch::Tensor loss_sum;
  pending_.clear();

  const int prev = (p - 1 + P) % P, next = (p + 1) % P;
  const std::vector<PipelineOp> ops = schedule_ops(options_.schedule, P, p, M, V);
  // The message op i receives (its input activation or its output's gradient), or -1.
  auto receive_of = [&](const PipelineOp& op) {
    const int s = op.chunk * P + p;
    if (op.kind == PipelineOp::kForward)
      return s == 0 ? -1 : message_key(op.micro_batch, s, S, false);
    return s == S - 1 ? -1 : message_key(op.micro_batch, s, S, true);
  };
  size_t posted = 0;  // ops whose receives are posted

  for (size_t i = 0; i < ops.size(); ++i) {
    const PipelineOp& op = ops[i];
    for (; posted < ops.size() && posted <= i + kRecvLookahead; ++posted) {
      const int key = receive_of(ops[posted]);
      if (key >= 0) post_receive(ops[posted].kind == PipelineOp::kForward ? prev : next, key);
    }
    const int s = op.chunk * P + p;  // this op's global stage
    trace_.push_back(op);
    if (op.kind == PipelineOp::kForward) {
      Live l;
      if (s == 0) {
        l.input = in_mb[op.micro_batch];
      } else {
        l.input = take_receive(receive_of(op));
        if (l.input.is_floating_point()) l.input.requires_grad_(true);
      }
      torch::Tensor out =
          ddp_.empty() ? local_[op.chunk]->forward(l.input) : ddp_[op.chunk]->forward(l.input);
      if (s == S - 1) {
        if (tgt_mb.empty()) throw UsageError("Pipeline::train_step: the last stage needs targets");
        torch::Tensor loss = loss_fn(out, tgt_mb[op.micro_batch]);
        loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
        // Scaled so the accumulated gradient is that of the mean over micro-batches.
        l.output = loss / M;
      } else {
        send_message(out, next, message_key(op.micro_batch, s + 1, S, false));
        l.output = out;
      }
      live[{op.chunk, op.micro_batch}] = std::move(l);
      peak_live_ = std::max(peak_live_, static_cast<int>(live.size()));
    } else {
      auto it = live.find({op.chunk, op.micro_batch});
      TORCH_INTERNAL_ASSERT(it != live.end(),
                            "backward before forward in the pipeline schedule: ", to_string(op));
      Live l = std::move(it->second);
      live.erase(it);
      // Data parallel: only the chunk's last backward (micro-batches run in order) averages
      // the gradients accumulated over all M; the others accumulate locally.
      if (!ddp_.empty()) ddp_[op.chunk]->reducer().set_sync(op.micro_batch == M - 1);
      if (s == S - 1) {
        l.output.backward();
      } else {
        torch::Tensor grad = take_receive(receive_of(op));
        torch::autograd::backward({l.output}, {grad});
      }
      if (s > 0) {
        torch::Tensor g = l.input.grad();
        if (!g.defined()) g = torch::zeros_like(l.input);
        send_message(g, prev, message_key(op.micro_batch, s - 1, S, true));
      }
    }
  }
  for (auto& w : sent_works_) w.wait();
  sent_works_.clear();
  sent_keep_.clear();
  if (p == P - 1 && loss_sum.defined()) return loss_sum / M;
  return {};
}

void all_reduce_gradients(const std::vector<torch::Tensor>& params,
                          const std::shared_ptr<ProcessGroup>& group) {
  if (!group || group->world_size() == 1 || params.empty()) return;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad().reshape({-1}));
  }
  torch::Tensor flat = torch::cat(grads);
  AllReduceOptions o;
  o.group = group;
  o.op = ReduceOp::kAvg;
  all_reduce(flat, o);
  int64_t offset = 0;
  for (const auto& p : params) {
    const int64_t n = p.numel();
    p.grad().copy_(flat.narrow(0, offset, n).view_as(p));
    offset += n;
  }
}

}  // namespace dtrain
