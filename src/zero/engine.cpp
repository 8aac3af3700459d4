// The ZeRO engine: flat partitioned buffers, gradient reduction by stage, the optimizer step.
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_map>

#include "dtrain/collectives.h"
#include "dtrain/zero.h"
#include "zero/stage3_fetch.h"

namespace dtrain::zero {
namespace detail {
namespace {

int64_t nbytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// Gloo moves no bfloat16: send its bits as float16 (a gather only copies them).
torch::Tensor wire(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? t.view(torch::kHalf) : t;
}
torch::Tensor unwire(const torch::Tensor& t, torch::Dtype d) {
  return d == torch::kBFloat16 ? t.view(torch::kBFloat16) : t;
}

std::string describe_tensor(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.scalar_type() << " on " << t.device();
  return s.str();
}

}  // namespace

EngineCore::EngineCore(torch::nn::Module& module, Config config, InitOptions options)
    : module_(module),
      config_(std::move(config)),
      group_(std::move(options.group)),
      scaler_(config_.fp16),
      scheduler_(config_.scheduler, config_.optimizer.lr, config_.optimizer.beta1,
                 config_.optimizer.beta2) {
  if (!group_) group_ = default_group();
  rank_ = group_->rank();
  world_ = group_->world_size();
  stage_ = config_.zero.stage;
  if (config_.world_size != world_)
    throw UsageError("zero::initialize: the config was resolved for world size " +
                     std::to_string(config_.world_size) + " but the group has " +
                     std::to_string(world_) + " ranks");
  client_ = std::move(options.optimizer);
  if (client_ && config_.optimizer.given)
    throw UsageError(
        "zero::initialize: an optimizer was given twice, in the config's \"optimizer\" section and "
        "as "
        "InitOptions::optimizer; remove one of them");
  if (!client_ && !config_.optimizer.given)
    throw UsageError(
        "zero::initialize: the config has no \"optimizer\" section; add one, e.g. "
        "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.001}} (Adam, AdamW, SGD or "
        "Lamb), "
        "or pass your own torch::optim optimizer as InitOptions::optimizer");
  if (client_ && client_->param_groups().size() != 1)
    throw UsageError(
        "zero::initialize: InitOptions::optimizer has " +
        std::to_string(client_->param_groups().size()) +
        " parameter groups; ZeRO steps one flat partition of every parameter, so give it one group "
        "(e.g. over module->parameters())");
  if (client_ && !client_->state().empty())
    throw UsageError("zero::initialize: InitOptions::optimizer already holds state for " +
                     std::to_string(client_->state().size()) +
                     " parameters; give a fresh optimizer (load state with load_checkpoint)");
  for (auto& item : module_.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    names_.push_back(item.key());
    params_.push_back(item.value());
  }
  if (params_.empty()) throw UsageError("zero::initialize: the module has no trainable parameters");
  const auto dtype0 = params_[0].scalar_type();
  device_ = params_[0].device();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].scalar_type() != dtype0 || params_[i].device() != device_)
      throw UsageError(
          "zero::initialize: every trainable parameter must have one dtype and device; '" +
          names_[0] + "' is " + describe_tensor(params_[0]) + " but '" + names_[i] + "' is " +
          describe_tensor(params_[i]));
  }
  mixed_ = config_.fp16.enabled || config_.bf16;
  if (mixed_) {
    model_dtype_ = config_.fp16.enabled ? torch::kHalf : torch::kBFloat16;
    master_dtype_ = torch::kFloat32;
  } else {
    if (dtype0 != torch::kFloat32 && dtype0 != torch::kFloat64)
      throw UsageError("zero::initialize: parameters are " + describe_tensor(params_[0]) +
                       "; give float32 (or float64) parameters, and enable fp16 or bf16 in the "
                       "config for 16-bit training");
    model_dtype_ = master_dtype_ = dtype0;
  }
  offload_opt_ = config_.zero.offload_optimizer.enabled();
  offload_param_ = config_.zero.offload_param.enabled();
  for (auto& p : params_) {
    offsets_.push_back(numel_);
    numels_.push_back(p.numel());
    shapes_.push_back(p.sizes().vec());
    numel_ += p.numel();
  }
  padded_ = (numel_ + world_ - 1) / world_ * world_;
  part_ = padded_ / world_;

  // Rank 0's values everywhere (in the master dtype), and its buffers.
  auto dev_opts = torch::TensorOptions().dtype(master_dtype_).device(device_);
  torch::Tensor full = torch::zeros({padded_}, dev_opts);
  {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < params_.size(); ++i)
      full.narrow(0, offsets_[i], numels_[i]).copy_(params_[i].detach().reshape({-1}));
    if (world_ > 1) {
      BroadcastOptions o;
      o.group = group_;
      broadcast(full, o);
      for (auto& b : module_.buffers(true)) {
        if (!b.defined() || b.numel() == 0) continue;
        auto t = b.detach().contiguous();
        broadcast(t, o);
        b.detach().copy_(t);
      }
    }
  }
  const auto state_device = offload_opt_ ? torch::Device(torch::kCPU) : device_;
  if (mixed_ || offload_opt_) {
    master_ = (stage_ == 0 ? full : own_slice(full))
                  .to(state_device, master_dtype_, false, /*copy=*/true);
  }
  if (stage_ < 3) {
    flat_params_ = mixed_ ? full.to(model_dtype_) : full;
    point_params_at(flat_params_);
  } else {
    auto part_device = offload_param_ ? torch::Device(torch::kCPU) : device_;
    param_part_ = own_slice(full).to(part_device, model_dtype_, false, /*copy=*/true);
    // Full-shaped until the hooks are installed: a gradient accumulator records its
    // parameter's shape and dtype when it is created. Released at the end of the constructor.
    point_params_at(full.to(model_dtype_));
    full = torch::Tensor();
  }
  torch::Tensor w = master_.defined() ? master_
                    : stage_ == 0     ? flat_params_
                    : stage_ < 3      ? own_slice(flat_params_)
                                      : param_part_;
  const auto& type = config_.optimizer.type;
  int nstate = client_ ? 0 : type == "SGD" ? (config_.optimizer.momentum > 0 ? 1 : 0) : 2;
  for (int k = 0; k < nstate; ++k) state_.push_back(torch::zeros_like(w));
  if (client_) {
    client_param_ = w;  // one tensor for good: the optimizer keys its state by it
    client_->param_groups()[0].params() = {client_param_};
    scheduler_ = LRScheduler(config_.scheduler, client_->param_groups()[0].options().get_lr(),
                             config_.optimizer.beta1, config_.optimizer.beta2);
  }

  if (stage_ < 2) {
    flat_grads_ =
        torch::zeros({padded_}, torch::TensorOptions().dtype(model_dtype_).device(device_));
    if (stage_ < 3) {
      for (size_t i = 0; i < params_.size(); ++i)
        params_[i].mutable_grad() = flat_grads_.narrow(0, offsets_[i], numels_[i]).view(shapes_[i]);
    }
  } else {
    grad_part_ = torch::zeros(
        {part_},
        torch::TensorOptions().dtype(master_dtype_).device(offload_opt_ ? torch::kCPU : device_));
  }
  // Stage 1 with overlap_comm: the boundary backward reduces flat_grads_'s buckets to their
  // owners in place as they complete (the 16-bit gradients of fp16/bf16 are reduced in fp32
  // at the step instead).
  if (stage_ >= 2 || (stage_ == 1 && config_.zero.overlap_comm && world_ > 1 && !mixed_)) {
    // Buckets over the flat range in reverse registration order (roughly backward's order).
    const int64_t cap = std::max<int64_t>(1, config_.zero.reduce_bucket_size);
    bucket_of_.assign(params_.size(), 0);
    Bucket open;
    int64_t open_elems = 0;
    for (size_t k = params_.size(); k-- > 0;) {
      if (numels_[k] >= cap && !open.params.empty()) {  // a big parameter gets a bucket of its own
        buckets_.push_back(std::move(open));
        open = Bucket();
        open_elems = 0;
      }
      open.params.push_back(k);
      open_elems += numels_[k];
      if (open_elems >= cap) {
        buckets_.push_back(std::move(open));
        open = Bucket();
        open_elems = 0;
      }
    }
    if (!open.params.empty()) buckets_.push_back(std::move(open));
    for (size_t b = 0; b < buckets_.size(); ++b) {
      auto& bk = buckets_[b];
      size_t first = bk.params.back(), last = bk.params.front();
      bk.begin = offsets_[first];
      bk.end = offsets_[last] + numels_[last];
      bk.pending = bk.params.size();
      for (auto i : bk.params) bucket_of_[i] = b;
    }
    ready_.assign(params_.size(), false);
    install_hooks();
  }
  if (stage_ == 3) release_parameters();
}

EngineCore::~EngineCore() {
  for (auto& [node, key] : hooks_) node->del_post_hook(key);
}

void EngineCore::point_params_at(const torch::Tensor& flat) {
  torch::NoGradGuard ng;
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].set_data(flat.narrow(0, offsets_[i], numels_[i]).view(shapes_[i]));
}

void EngineCore::install_hooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    if (!acc)
      throw InternalError("zero: parameter '" + names_[i] + "' has no gradient accumulator");
    auto key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs,
                  const torch::autograd::variable_list&) {
          on_grad_ready(i);
          return outputs;
        }));
    hooks_.emplace_back(std::move(acc), key);
  }
}

void EngineCore::set_units(const std::vector<std::shared_ptr<torch::nn::Module>>& units) {
  if (stage_ != 3) return;
  if (in_backward_)
    throw UsageError("zero: fetch_units() during backward; declare the units before training");
  // Parameter index by identity; each unit's must be contiguous (registration order).
  std::unordered_map<const void*, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i].unsafeGetTensorImpl()] = i;
  std::vector<std::vector<size_t>> lists;
  std::vector<bool> covered(params_.size(), false);
  for (const auto& m : units) {
    if (!m) throw UsageError("zero: fetch_units() got a null module");
    std::vector<size_t> list;
    for (auto& p : m->parameters(/*recurse=*/true)) {
      auto it = index.find(p.unsafeGetTensorImpl());
      if (it == index.end()) continue;  // frozen (requires_grad false): not the engine's
      if (covered[it->second])
        throw UsageError("zero: parameter '" + names_[it->second] +
                         "' is in two fetch units; give each submodule once");
      covered[it->second] = true;
      list.push_back(it->second);
    }
    std::sort(list.begin(), list.end());
    for (size_t k = 1; k < list.size(); ++k)
      if (list[k] != list[k - 1] + 1)
        throw UsageError("zero: the parameters of fetch unit '" + m->name() +
                         "' are not contiguous in the module's registration order ('" +
                         names_[list[k - 1]] + "' then '" + names_[list[k]] +
                         "'); give units that are whole submodules, registered in turn");
    lists.push_back(std::move(list));
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (!covered[i])
      throw UsageError("zero: parameter '" + names_[i] +
                       "' is in no fetch unit; the units must hold every trainable parameter (add "
                       "its submodule)");
  if (gathered_) release_parameters();
  if (fetch_) fetch_->release_all();  // waits for its gathers in flight
  unit_modules_ = units;
  fetch_ = std::make_unique<Stage3Fetch>(*this, std::move(lists));
}

size_t EngineCore::unit_of(const torch::nn::Module& m) const {
  for (size_t u = 0; u < unit_modules_.size(); ++u)
    if (unit_modules_[u].get() == &m) return u;
  throw UsageError("zero: fetch() got module '" + m.name() +
                   "', which is not one of the units given to fetch_units()");
}

void EngineCore::begin_units() {
  if (gathered_) release_parameters();  // a whole-module gather (evaluation, checkpoint) ends here
}

void EngineCore::unit_begin(size_t u) { fetch_->begin_forward(u); }

void EngineCore::unit_end(size_t u, const torch::Tensor* output) { fetch_->end_forward(u, output); }

Stage3Stats EngineCore::stage3_stats() const { return fetch_ ? fetch_->stats() : Stage3Stats{}; }

void EngineCore::set_stage3_trace(std::function<void(const std::string&)> trace) {
  if (fetch_) fetch_->set_trace(std::move(trace));
}

void EngineCore::gather_parameters() {
  if (fetch_) fetch_->release_all();
  auto local = param_part_.to(device_);
  torch::Tensor flat;
  if (world_ > 1) {
    CollectiveOptions o;
    o.group = group_;
    flat = unwire(torch::cat(all_gather(wire(local), o)), model_dtype_);
    count(nbytes(flat) * (world_ - 1) / world_);
  } else {
    flat = local.clone();
  }
  flat_params_ = flat;
  point_params_at(flat_params_);
  gathered_ = true;
}

void EngineCore::release_parameters() {
  torch::NoGradGuard ng;
  auto empty = torch::empty({0}, torch::TensorOptions().dtype(model_dtype_).device(device_));
  for (auto& p : params_) p.set_data(empty);
  flat_params_ = torch::Tensor();
  gathered_ = false;
}

void EngineCore::before_forward() {
  if (stage_ == 3 && !gathered_) gather_parameters();
}

void EngineCore::backward(const torch::Tensor& loss) {
  if (stage_ == 3 && !gathered_ && !fetch_) gather_parameters();
  if (stage_ < 2) {
    // A user's zero_grad() (set_to_none) detaches .grad from the flat buffer: re-point it.
    for (size_t i = 0; i < params_.size(); ++i) {
      auto view = flat_grads_.narrow(0, offsets_[i], numels_[i]).view(shapes_[i]);
      const auto& g = params_[i].grad();
      if (!g.defined() || g.data_ptr() != view.data_ptr()) {
        if (g.defined()) view.copy_(g);
        params_[i].mutable_grad() = view;
      }
    }
  }
  double scale = scaler_.scale() / static_cast<double>(config_.gradient_accumulation_steps);
  reduce_in_backward_ =
      stage_ >= 2 ||
      (!buckets_.empty() && (micro_steps_ + 1) % config_.gradient_accumulation_steps == 0);
  in_backward_ = true;
  try {
    (scale == 1.0 ? loss : loss * scale).backward();
  } catch (...) {
    in_backward_ = false;
    in_flight_.clear();  // a failed backward leaves the step unusable; do not wait on its
                         // reductions later
    throw;
  }
  ++micro_steps_;
  if (reduce_in_backward_) finish_backward();
  in_backward_ = false;
  if (stage_ == 3) {
    if (fetch_) fetch_->end_backward();
    if (gathered_) release_parameters();
  }
}

void EngineCore::on_grad_ready(size_t i) {
  if (!in_backward_ || !reduce_in_backward_ || ready_[i]) return;
  ready_[i] = true;
  --buckets_[bucket_of_[i]].pending;
  launch_ready_buckets();
  if (fetch_) fetch_->on_grad_ready(i);
}

void EngineCore::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0)
    reduce_bucket(buckets_[next_bucket_++]);
}

void EngineCore::reduce_bucket(Bucket& b) {
  torch::NoGradGuard ng;
  if (stage_ == 1) {
    // The bucket's range of flat_grads_ is final: each owner's piece is reduced in place (the
    // other ranks' copies are not read again before the step zeroes them).
    for (int r = 0; r < world_; ++r) {
      int64_t lo = std::max(b.begin, r * part_), hi = std::min(b.end, (r + 1) * part_);
      if (lo >= hi) continue;
      auto seg = flat_grads_.narrow(0, lo, hi - lo);
      ReduceOptions o;
      o.group = group_;
      o.dst = r;
      count(nbytes(seg) * (world_ - 1) / world_);
      in_flight_.push_back({reduce_async(seg, o), seg, 0, false});
    }
    b.launched = true;
    return;
  }
  torch::Tensor staging;
  const auto& g0 = params_[b.params[0]].grad();
  if (b.params.size() == 1 && g0.defined() && g0.is_contiguous() &&
      g0.scalar_type() == master_dtype_) {
    // A parameter that fills a bucket on its own is reduced where autograd put its gradient.
    staging = g0.view({-1});
    params_[b.params[0]].mutable_grad() = torch::Tensor();
  } else {
    // A bucket in flight keeps its own buffer; synchronous ones share one, kept between steps
    // (a fresh buffer each time costs page faults; memory() counts the largest bucket either way).
    const int64_t len = b.end - b.begin;
    const auto opts = torch::TensorOptions().dtype(master_dtype_).device(device_);
    if (config_.zero.overlap_comm && world_ > 1) {
      staging = torch::empty({len}, opts);
    } else {
      if (!staging_.defined() || staging_.numel() < len) staging_ = torch::empty({len}, opts);
      staging = staging_.narrow(0, 0, len);
    }
    for (auto j : b.params) {
      auto view = staging.narrow(0, offsets_[j] - b.begin, numels_[j]);
      const auto& g = params_[j].grad();
      if (g.defined())
        view.copy_(g.reshape({-1}));
      else
        view.zero_();
      params_[j].mutable_grad() = torch::Tensor();  // only this rank's partition is kept
    }
    bucket_peak_bytes_ = std::max(bucket_peak_bytes_, nbytes(staging));
  }
  for (int r = 0; r < world_; ++r) {
    int64_t lo = std::max(b.begin, r * part_), hi = std::min(b.end, (r + 1) * part_);
    if (lo >= hi) continue;
    auto seg = staging.narrow(0, lo - b.begin, hi - lo);
    if (world_ > 1) {
      ReduceOptions o;
      o.group = group_;
      o.dst = r;
      count(nbytes(seg) * (world_ - 1) / world_);
      if (config_.zero.overlap_comm) {
        // Launched now, added at the end of backward: the reduction overlaps the rest of it.
        in_flight_.push_back({reduce_async(seg, o), seg, lo - r * part_, r == rank_});
        continue;
      }
      reduce(seg, o);
    }
    if (r == rank_) grad_part_.narrow(0, lo - r * part_, hi - lo).add_(seg.to(grad_part_.device()));
  }
  b.launched = true;
}

void EngineCore::finish_backward() {
  for (; next_bucket_ < buckets_.size(); ++next_bucket_) reduce_bucket(buckets_[next_bucket_]);
  // In launch order: every rank waits for the same sequence of collectives.
  for (auto& f : in_flight_) {
    f.work.wait();
    if (f.mine)
      grad_part_.narrow(0, f.offset, f.segment.numel()).add_(f.segment.to(grad_part_.device()));
  }
  in_flight_.clear();
  if (stage_ == 1) grads_reduced_ = true;
  next_bucket_ = 0;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
  }
  std::fill(ready_.begin(), ready_.end(), false);
}

bool EngineCore::is_gradient_accumulation_boundary() const {
  return micro_steps_ > 0 && micro_steps_ % config_.gradient_accumulation_steps == 0;
}

double EngineCore::lr() const {
  if (scheduler_.enabled()) return scheduler_.lr();
  return client_ ? client_->param_groups()[0].options().get_lr() : config_.optimizer.lr;
}

void EngineCore::step() {
  if (!is_gradient_accumulation_boundary() ||
      micro_steps_ / config_.gradient_accumulation_steps <= global_steps_)
    return;
  torch::NoGradGuard ng;
  // Stage 3: a forward without backward (evaluation) left the module gathered; the update
  // below changes the partitions, so the next forward must gather again.
  if (stage_ == 3 && gathered_) release_parameters();
  if (fetch_) fetch_->release_all();  // persistent units too: the partitions change
  const auto master_device = offload_opt_ ? torch::Device(torch::kCPU) : device_;
  // 1. This rank's averaged gradients, in the master dtype, where the master lives.
  torch::Tensor g;
  if (stage_ == 0) {
    g = flat_grads_.to(master_dtype_);
    if (world_ > 1) {
      AllReduceOptions o;
      o.group = group_;
      all_reduce(g, o);
      count(nbytes(g) * 2 * (world_ - 1) / world_);
    }
  } else if (stage_ == 1) {
    // Each partition reduced onto its owner (in place unless the gradients are 16-bit);
    // already done when the boundary backward reduced its buckets (overlap_comm).
    auto full = flat_grads_.to(master_dtype_);
    if (!grads_reduced_) reduce_to_owners(full);
    grads_reduced_ = false;
    g = own_slice(full);
  } else {
    g = grad_part_;
  }
  // In place: g is flat_grads_ or grad_part_ (zeroed below) or a copy of them.
  if (g.device() != master_device) g = g.to(master_device);
  g.div_(static_cast<double>(world_));
  if (config_.fp16.enabled) g.div_(scaler_.scale());
  // 2. fp16: an overflow anywhere skips the step (and the scheduler) on every rank.
  if (config_.fp16.enabled) {
    bool local = inject_overflow_ || !torch::isfinite(g).all().item<bool>();
    inject_overflow_ = false;
    auto flag = torch::tensor({local ? 1.0f : 0.0f});
    if (world_ > 1 && stage_ >= 1) {
      AllReduceOptions o;
      o.group = group_;
      o.op = ReduceOp::kMax;
      all_reduce(flag, o);
      count(nbytes(flag) * 2 * (world_ - 1) / world_);
    }
    if (flag.item<float>() > 0) {
      scaler_.update(true);
      ++skipped_steps_;
      ++global_steps_;
      if (flat_grads_.defined()) flat_grads_.zero_();
      if (grad_part_.defined()) grad_part_.zero_();
      bytes_last_step_ = bytes_this_step_;
      bytes_this_step_ = 0;
      return;
    }
  }
  // 3. Clipping by the global norm over every rank's partition.
  if (config_.gradient_clipping > 0) {
    auto sq = g.to(torch::kFloat64).pow(2).sum().reshape({1});
    if (world_ > 1 && stage_ >= 1) {
      AllReduceOptions o;
      o.group = group_;
      all_reduce(sq, o);
      count(nbytes(sq) * 2 * (world_ - 1) / world_);
    }
    last_grad_norm_ = std::sqrt(sq.item<double>());
    double coef = config_.gradient_clipping / (last_grad_norm_ + 1e-6);
    if (coef < 1) g.mul_(coef);
  }
  // 4. The update of this rank's partition.
  torch::Tensor w = master_.defined() ? master_
                    : stage_ == 0     ? flat_params_
                    : stage_ < 3      ? own_slice(flat_params_)
                                      : param_part_;
  ++opt_step_;
  optimizer_step(w, g, lr(), scheduler_.betas());
  if (master_.defined()) {
    auto target = stage_ == 0 ? flat_params_ : stage_ < 3 ? own_slice(flat_params_) : param_part_;
    target.copy_(master_);
  }
  // 5. Everyone's updated partitions back into every rank's parameters (stages 1-2).
  if ((stage_ == 1 || stage_ == 2) && world_ > 1) all_gather_params();
  if (flat_grads_.defined()) flat_grads_.zero_();
  if (grad_part_.defined()) grad_part_.zero_();
  if (config_.fp16.enabled) scaler_.update(false);
  scheduler_.step();
  ++global_steps_;
  bytes_last_step_ = bytes_this_step_;
  bytes_this_step_ = 0;
}

void EngineCore::reduce_to_owners(const torch::Tensor& full) {
  if (world_ == 1) return;
  std::vector<Work> works;
  for (int r = 0; r < world_; ++r) {
    auto seg = full.narrow(0, r * part_, part_);
    ReduceOptions o;
    o.group = group_;
    o.dst = r;
    count(nbytes(seg) * (world_ - 1) / world_);
    works.push_back(reduce_async(seg, o));
  }
  for (auto& w : works) w.wait();
}

void EngineCore::all_gather_params() {
  // In place: every rank's partition into flat_params_ (its own is there already).
  auto flat = wire(flat_params_);
  CollectiveOptions o;
  o.group = group_;
  all_gather_into_tensor(flat, own_slice(flat), o);
  count(nbytes(flat_params_) * (world_ - 1) / world_);
}

void EngineCore::client_step(const torch::Tensor& g, double lr) {
  if (scheduler_.enabled()) client_->param_groups()[0].options().set_lr(lr);
  client_param_.mutable_grad() = g;
  client_->step();
  client_param_.mutable_grad() = torch::Tensor();
}

void EngineCore::optimizer_step(const torch::Tensor& w, const torch::Tensor& g, double lr,
                                std::pair<double, double> betas) {
  if (client_) return client_step(g, lr);
  const auto& o = config_.optimizer;
  const double beta1 = betas.first, beta2 = betas.second;
  if (o.type == "Lamb") return lamb_step(w, g, lr, betas);
  if (o.type == "SGD") {
    auto d = o.weight_decay != 0 ? g.add(w, o.weight_decay) : g;
    if (o.momentum > 0) {
      auto& buf = state_[0];
      if (opt_step_ == 1)
        buf.copy_(d);
      else
        buf.mul_(o.momentum).add_(d, 1 - o.dampening);
      d = o.nesterov ? d.add(buf, o.momentum) : buf;
    }
    w.add_(d, -lr);
    return;
  }
  // Adam / AdamW.
  const bool adamw = o.adam_w_mode;
  // One fused pass (cpu_adam_step) whenever the partition and its state are flat CPU arrays.
  if (w.device().is_cpu() && g.device().is_cpu() && w.is_contiguous() && g.is_contiguous() &&
      g.scalar_type() == w.scalar_type() && state_[0].is_contiguous() &&
      state_[1].is_contiguous()) {
    auto gc = g.contiguous();
    if (w.scalar_type() == torch::kFloat32)
      return cpu_adam_step(w.data_ptr<float>(), gc.data_ptr<float>(), state_[0].data_ptr<float>(),
                           state_[1].data_ptr<float>(), w.numel(), opt_step_, lr, beta1, beta2,
                           o.eps, o.weight_decay, adamw, 0, o.bias_correction);
    if (w.scalar_type() == torch::kFloat64)
      return cpu_adam_step(w.data_ptr<double>(), gc.data_ptr<double>(),
                           state_[0].data_ptr<double>(), state_[1].data_ptr<double>(), w.numel(),
                           opt_step_, lr, beta1, beta2, o.eps, o.weight_decay, adamw, 0,
                           o.bias_correction);
  }
  auto& m = state_[0];
  auto& v = state_[1];
  const double bc1 = o.bias_correction ? 1 - std::pow(beta1, double(opt_step_)) : 1.0,
               bc2 = o.bias_correction ? 1 - std::pow(beta2, double(opt_step_)) : 1.0;
  torch::Tensor grad = g;
  if (o.weight_decay != 0) {
    if (adamw)
      w.mul_(1 - lr * o.weight_decay);
    else
      grad = g.add(w, o.weight_decay);
  }
  m.mul_(beta1).add_(grad, 1 - beta1);
  v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  auto denom = (v.sqrt() / std::sqrt(bc2)).add_(o.eps);
  w.addcdiv_(m, denom, -lr / bc1);
}

void EngineCore::lamb_step(const torch::Tensor& w, const torch::Tensor& g, double lr,
                           std::pair<double, double> betas) {
  const auto& o = config_.optimizer;
  const double beta1 = betas.first, beta2 = betas.second;
  auto& m = state_[0];
  auto& v = state_[1];
  const double bc1 = o.bias_correction ? 1 - std::pow(beta1, double(opt_step_)) : 1.0,
               bc2 = o.bias_correction ? 1 - std::pow(beta2, double(opt_step_)) : 1.0;
  m.mul_(beta1).add_(g, 1 - beta1);
  v.mul_(beta2).addcmul_(g, g, 1 - beta2);
  auto update = (m / bc1) / ((v / bc2).sqrt().add_(o.eps));
  if (o.weight_decay != 0) update.add_(w, o.weight_decay);
  // Trust ratio per parameter: norms over the whole parameter, summed over the ranks that
  // hold pieces of it.
  const int64_t base = stage_ == 0 ? 0 : rank_ * part_;
  const int64_t len = w.numel();
  auto sums = torch::zeros({static_cast<int64_t>(params_.size()), 2}, torch::kFloat64);
  std::vector<std::pair<int64_t, int64_t>> segs(params_.size(), {0, 0});
  for (size_t i = 0; i < params_.size(); ++i) {
    int64_t lo = std::max(offsets_[i], base), hi = std::min(offsets_[i] + numels_[i], base + len);
    if (lo >= hi) continue;
    segs[i] = {lo - base, hi - lo};
    sums[i][0] = w.narrow(0, lo - base, hi - lo).to(torch::kFloat64).pow(2).sum().item<double>();
    sums[i][1] =
        update.narrow(0, lo - base, hi - lo).to(torch::kFloat64).pow(2).sum().item<double>();
  }
  if (world_ > 1 && stage_ >= 1) {
    AllReduceOptions ao;
    ao.group = group_;
    all_reduce(sums, ao);
    count(nbytes(sums) * 2 * (world_ - 1) / world_);
  }
  auto acc = sums.accessor<double, 2>();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (segs[i].second == 0) continue;
    double wn = std::sqrt(acc[i][0]), un = std::sqrt(acc[i][1]);
    double trust = (wn > 0 && un > 0) ? std::clamp(wn / un, o.min_coeff, o.max_coeff) : 1.0;
    w.narrow(0, segs[i].first, segs[i].second)
        .add_(update.narrow(0, segs[i].first, segs[i].second), -lr * trust);
  }
}

MemoryUsage EngineCore::memory() const {
  MemoryUsage m;
  // On a CPU-only run, "device" memory is CPU memory too: report what the module's device holds
  // as device, and what offload moved off it as CPU.
  auto put = [&](int64_t& dev, int64_t& cpu, const torch::Tensor& t, bool offloaded) {
    if (!t.defined()) return;
    (offloaded ? cpu : dev) += nbytes(t);
  };
  if (stage_ < 3)
    put(m.params_device, m.params_cpu, flat_params_, false);
  else {
    put(m.params_device, m.params_cpu, param_part_, offload_param_);
    if (gathered_) put(m.params_device, m.params_cpu, flat_params_, false);
    if (fetch_) m.params_device += fetch_->held_bytes();
  }
  if (stage_ < 2)
    put(m.grads_device, m.grads_cpu, flat_grads_, false);
  else {
    put(m.grads_device, m.grads_cpu, grad_part_, offload_opt_);
    m.grads_device += bucket_peak_bytes_;
  }
  put(m.optimizer_device, m.optimizer_cpu, master_, offload_opt_);
  for (auto& s : state_) put(m.optimizer_device, m.optimizer_cpu, s, offload_opt_);
  return m;
}

}  // namespace detail
}  // namespace dtrain::zero
