#include "dtrain/ddp.h"

#include <torch/csrc/autograd/engine.h>

#include <map>
#include <sstream>

#include "comm/backend.h"
#include "dtrain/error.h"
#include "dtrain/timeline.h"
#include "parallel/grad_hooks.h"

namespace dtrain {

namespace {

std::string describe(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes() << " " << t.dtype();
  return s.str();
}

// Packs tensors of one dtype into flat chunks of at most `cap_bytes`, broadcasts each chunk
// from rank 0, and copies the result back: a few large collectives instead of one per tensor.
void broadcast_coalesced(ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                         int64_t cap_bytes) {
  std::vector<torch::Tensor> chunk;
  int64_t bytes = 0;
  auto flush = [&]() {
    if (chunk.empty()) return;
    std::vector<torch::Tensor> flat_views;
    for (auto& t : chunk) flat_views.push_back(t.detach().reshape({-1}));
    torch::Tensor flat = torch::cat(flat_views);
    BroadcastOptions o;
    o.group = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    broadcast(flat, o);
    int64_t offset = 0;
    torch::NoGradGuard no_grad;
    for (auto& t : chunk) {
      t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
    chunk.clear();
    bytes = 0;
  };
  for (auto dtype :
       {torch::kFloat32, torch::kFloat64, torch::kFloat16, torch::kBFloat16, torch::kInt64,
        torch::kInt32, torch::kUInt8, torch::kInt8, torch::kInt16, torch::kBool}) {
    for (const auto& t : tensors) {
      if (t.scalar_type() != dtype || t.numel() == 0) continue;
      chunk.push_back(t);
      bytes += t.numel() * static_cast<int64_t>(t.element_size());
      if (bytes >= cap_bytes) flush();
    }
    flush();
  }
}

std::shared_ptr<ProcessGroup> non_owning(ProcessGroup& g) {
  return std::shared_ptr<ProcessGroup>(&g, [](ProcessGroup*) {});
}

Work compress_hook(ProcessGroup& group, GradBucket& bucket, torch::ScalarType wire) {
  torch::Tensor compressed = bucket.buffer.to(wire).div_(group.world_size());
  AllReduceOptions o;
  o.group = non_owning(group);
  torch::Tensor buffer = bucket.buffer;
  // The Work keeps `compressed` alive in its finish step and decompresses into the bucket.
  Work w = all_reduce_async(compressed, o);
  return std::move(w).then([compressed, buffer]() mutable { buffer.copy_(compressed); });
}

}  // namespace

CommHook allreduce_hook() {
  return [](ProcessGroup& group, GradBucket& bucket) {
    // kAvg: the shared-memory backend divides while it reduces; on Gloo it is a sum and a
    // division when the Work is waited for (the same passes as dividing first).
    AllReduceOptions o;
    o.group = non_owning(group);
    o.op = ReduceOp::kAvg;
    return all_reduce_async(bucket.buffer, o);
  };
}

CommHook fp16_compress_hook() {
  return [](ProcessGroup& group, GradBucket& bucket) {
    return compress_hook(group, bucket, torch::kHalf);
  };
}

CommHook bf16_compress_hook() {
  // Gloo has no bfloat16 (nor int16) support, so the bf16 payloads travel as raw 16-bit words in an
  // all_gather and every rank sums them in float32 itself: half the bytes of a float32
  // all-reduce at 2 ranks ((N-1)/2 of the bucket per rank in general, so best for small N).
  return [](ProcessGroup& group, GradBucket& bucket) {
    const int world = group.world_size();
    torch::Tensor bits =
        bucket.buffer.to(torch::kBFloat16).view(torch::kHalf);  // a byte-copying carrier
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (int r = 0; r < world; ++r) outputs[0].push_back(torch::empty_like(bits));
    std::vector<torch::Tensor> inputs{bits};
    auto work = group.c10d()->allgather(outputs, inputs);
    torch::Tensor buffer = bucket.buffer;
    return Work(
        work, std::chrono::milliseconds(0), "bf16_compress_hook all_gather",
        [outputs, inputs, buffer, world]() mutable {
          buffer.zero_();
          for (auto& part : outputs[0])
            buffer.add_(part.view(torch::kBFloat16).to(buffer.scalar_type()));
          buffer.div_(world);
        },
        group.c10d());
  };
}

namespace detail {

Reducer::Reducer(torch::nn::Module& module, DDPOptions options)
    : module_(module), options_(std::move(options)) {
  group_ = options_.group ? options_.group : default_group();
  if (!options_.comm_hook) options_.comm_hook = allreduce_hook();
  if (options_.bucket_cap_mb <= 0 || options_.first_bucket_mb <= 0) {
    throw UsageError(
        "DistributedDataParallel: bucket_cap_mb and first_bucket_mb must be positive, got " +
        std::to_string(options_.bucket_cap_mb) + " and " +
        std::to_string(options_.first_bucket_mb));
  }
  for (auto& item : module_.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    param_names_.push_back(item.key());
    params_.push_back(item.value());
  }
  for (auto& b : module_.buffers(/*recurse=*/true)) buffers_.push_back(b);
  check_parameters_match();
  std::vector<torch::Tensor> state = module_.parameters(true);
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  broadcast_state(state);
  build_buckets();
  install_hooks();
}

Reducer::~Reducer() { detail::remove_grad_hooks(hooks_); }

void Reducer::check_parameters_match() {
  // One line per parameter; every rank compares its list with everyone's.
  std::ostringstream sig;
  for (size_t i = 0; i < params_.size(); ++i)
    sig << param_names_[i] << " " << describe(params_[i]) << "\n";
  CollectiveOptions o;
  o.group = group_;
  std::vector<std::string> all = all_gather_object(sig.str(), o);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    std::istringstream a(all[0]), b(all[r]);
    std::string la, lb;
    while (true) {
      bool ga = static_cast<bool>(std::getline(a, la));
      bool gb = static_cast<bool>(std::getline(b, lb));
      if (!ga && !gb) break;
      if (!ga) la = "(nothing)";
      if (!gb) lb = "(nothing)";
      if (la != lb) {
        throw UsageError(
            "DistributedDataParallel: the model differs across ranks: rank 0 has parameter '" + la +
            "' where rank " + std::to_string(r) + " has '" + lb +
            "'; every rank must build the same model");
      }
    }
  }
}

void Reducer::broadcast_state(const std::vector<torch::Tensor>& tensors) {
  broadcast_coalesced(*group_, tensors, static_cast<int64_t>(options_.bucket_cap_mb * 1024 * 1024));
}

void Reducer::build_buckets() {
  // Reverse registration order: backward produces the last layers' gradients first.
  const int64_t first_cap = static_cast<int64_t>(options_.first_bucket_mb * 1024 * 1024);
  const int64_t cap = static_cast<int64_t>(options_.bucket_cap_mb * 1024 * 1024);
  location_.assign(params_.size(), {0, 0});
  auto close = [&](Bucket& b) {
    int64_t numel = 0;
    for (size_t i : b.params) {
      b.offsets.push_back(numel);
      numel += params_[i].numel();
    }
    const auto& first = params_[b.params.front()];
    // A CPU bucket lives where the group's backend reduces it without copying (the
    // shared-memory backend's pool), when it can.
    b.buffer =
        first.device().is_cpu()
            ? comm::empty_for_collectives(group_->backends(), {numel}, first.scalar_type()).zero_()
            : torch::zeros({numel}, first.options().requires_grad(false));
    buckets_.push_back(std::move(b));
  };
  std::map<torch::ScalarType, std::pair<Bucket, int64_t>> current;
  for (size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k];
    auto& [bucket, bytes] = current[p.scalar_type()];
    bucket.params.push_back(k);
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
    if (bytes >= (buckets_.empty() ? first_cap : cap)) {
      close(bucket);
      bucket = Bucket{};
      bytes = 0;
    }
  }
  for (auto& [dtype, open_bucket] : current) {
    if (!open_bucket.first.params.empty()) close(open_bucket.first);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t s = 0; s < buckets_[b].params.size(); ++s)
      location_[buckets_[b].params[s]] = {b, s};
  }
  ready_.assign(params_.size(), false);
  if (options_.gradient_as_bucket_view) {
    // Gradients that exist already move into the buckets now (as PyTorch's reducer does).
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].grad().defined()) continue;
      auto view = bucket_view(i);
      view.copy_(params_[i].grad());
      params_[i].mutable_grad() = view;
    }
  }
}

torch::Tensor Reducer::bucket_view(size_t i) const {
  const auto [b, s] = location_[i];
  const torch::Tensor& buffer = buckets_[b].buffer;
  const torch::Tensor& p = params_[i];
  std::vector<int64_t> strides(static_cast<size_t>(p.dim()), 1);
  for (int64_t d = p.dim() - 1; d > 0; --d)
    strides[static_cast<size_t>(d - 1)] = strides[static_cast<size_t>(d)] * p.size(d);
  // An alias made with set_, not narrow(): autograd must not see a view, since optimizers'
  // zero_grad() detaches gradients in place, which autograd refuses for views.
  return torch::empty({0}, buffer.options())
      .set_(buffer.storage(), buffer.storage_offset() + buckets_[b].offsets[s], p.sizes(), strides);
}

bool Reducer::grad_is_bucket_view(size_t i) const {
  const torch::Tensor& g = params_[i].grad();
  if (!g.defined()) return false;
  const auto [b, s] = location_[i];
  const torch::Tensor& buffer = buckets_[b].buffer;
  return g.is_alias_of(buffer) && g.is_contiguous() && g.sizes() == params_[i].sizes() &&
         g.storage_offset() == buffer.storage_offset() + buckets_[b].offsets[s];
}

void Reducer::install_hooks() {
  detail::add_grad_ready_hooks(
      params_, param_names_, [this](size_t i) { mark_ready(i); }, hooks_);
}

void Reducer::before_forward() {
  if (options_.broadcast_buffers && !buffers_.empty() && group_->world_size() > 1) {
    timeline::Span span("ddp broadcast buffers", "comm");  // timeline hook
    broadcast_state(buffers_);
  }
}

void Reducer::mark_ready(size_t i) {
  if (!sync_enabled_) return;
  if (!callback_queued_) {
    // The first gradient of this backward: arrange to finish the reduction when it ends.
    callback_queued_ = true;
    next_bucket_ = 0;
    for (auto& b : buckets_) {
      b.pending = b.params.size();
      b.launched = false;
    }
    std::fill(ready_.begin(), ready_.end(), false);
    torch::autograd::Engine::get_default_engine().queue_callback([this]() { finalize(); });
  }
  if (ready_[i]) return;  // a parameter used twice: its accumulator fires once per backward
  ready_[i] = true;
  auto [b, s] = location_[i];
  Bucket& bucket = buckets_[b];
  if (!options_.gradient_as_bucket_view || !grad_is_bucket_view(i)) {
    const torch::Tensor& grad = params_[i].grad();
    auto view = bucket.buffer.narrow(0, bucket.offsets[s], params_[i].numel());
    if (grad.defined()) {
      view.copy_(grad.reshape({-1}));
    } else {
      view.zero_();
    }
    // From the next backward on, the gradient accumulates in the bucket itself.
    if (options_.gradient_as_bucket_view) params_[i].mutable_grad() = bucket_view(i);
  }
  --bucket.pending;
  launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  // Strictly in bucket order, so every rank issues the same sequence of collectives.
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    launch(buckets_[next_bucket_], next_bucket_);
    ++next_bucket_;
  }
}

void Reducer::launch(Bucket& bucket, size_t index) {
  GradBucket gb;
  gb.index = static_cast<int>(index);
  gb.buffer = bucket.buffer;
  for (size_t i : bucket.params) gb.parameters.push_back(params_[i]);
  gb.is_last = index + 1 == buckets_.size();
  timeline::Span span("ddp bucket all_reduce launch", "comm",
                      static_cast<int64_t>(bucket.buffer.nbytes()),  // timeline hook
                      static_cast<int64_t>(index));
  bucket.work = options_.comm_hook(*group_, gb);
  bucket.launched = true;
}

void Reducer::finalize() {
  callback_queued_ = false;
  // Parameters whose gradient never arrived did not take part in this forward.
  std::vector<std::string> unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (!options_.find_unused_parameters) {
      unused.push_back(param_names_[i]);
      continue;
    }
    auto [b, s] = location_[i];
    buckets_[b].buffer.narrow(0, buckets_[b].offsets[s], params_[i].numel()).zero_();
    ready_[i] = true;
    --buckets_[b].pending;
  }
  if (!unused.empty()) {
    std::string names;
    for (size_t k = 0; k < unused.size() && k < 10; ++k) names += (k ? ", " : "") + unused[k];
    if (unused.size() > 10) names += ", ...";
    // Other ranks may be waiting in a collective for our buckets; they time out with a
    // message of their own. This rank says why.
    throw UsageError("DistributedDataParallel: " + std::to_string(unused.size()) +
                     " parameter(s) received no gradient in this backward: " + names +
                     ". Pass find_unused_parameters = true if some parameters are legitimately "
                     "unused in some iterations");
  }
  launch_ready_buckets();
  DTRAIN_ASSERT(next_bucket_ == buckets_.size(),
                "every bucket must be launched at the end of backward");
  for (size_t b = 0; b < buckets_.size(); ++b) {
    timeline::Span span("ddp bucket wait", "comm",
                        static_cast<int64_t>(buckets_[b].buffer.nbytes()),  // timeline hook
                        static_cast<int64_t>(b));
    buckets_[b].work.wait();
  }
  timeline::Span span("ddp copy gradients", "compute");  // timeline hook
  torch::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    for (size_t s = 0; s < bucket.params.size(); ++s) {
      const size_t i = bucket.params[s];
      if (options_.gradient_as_bucket_view) {
        if (!grad_is_bucket_view(i)) params_[i].mutable_grad() = bucket_view(i);
        continue;
      }
      torch::Tensor& p = params_[i];
      auto averaged = bucket.buffer.narrow(0, bucket.offsets[s], p.numel()).view_as(p);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(averaged);
      } else {
        p.mutable_grad() = averaged.clone();
      }
    }
  }
}

std::vector<std::vector<size_t>> Reducer::bucket_parameter_indices() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

}  // namespace detail

}  // namespace dtrain
