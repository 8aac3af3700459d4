// The ZeRO engine's training path: flat buffers partitioned as the stage's policy says
// (zero/partitioning.h), gradient buckets and their reduction, the optimizer step.

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>
#include <regex>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "dtrain/collectives.h"
#include "dtrain/zero.h"
#include "zero/autocast.h"
#include "zero/data_types.h"
#include "zero/engine_impl.h"
#include "zero/malloc_policy.h"
#include "zero/overflow_rules.h"
#include "zero/progress_text.h"
#include "zero/stage3_fetch.h"
#include "zero/torch_schedulers.h"

namespace dtrain::zero {
namespace detail {
namespace {

// The loss scaler's settings: at stage 0 as DeepSpeed's FP16_Optimizer keeps them.
Fp16Config scaler_config(const Config& c) {
  Fp16Config f = c.fp16;
  if (c.zero.stage == 0) {  // FP16_Optimizer halves the scale at every overflow
    f.hysteresis = 1;
    f.consecutive_hysteresis = false;
  }
  return f;
}

// The step's reductions over this rank's gradient, a bounded chunk at a time: a float64 copy of
// the whole gradient and of its square (what g.to(kFloat64).pow(2).sum() makes) would be the
// step's largest transient, 4x the fp32 gradient.
constexpr int64_t kReduceChunk = int64_t(1) << 20;

torch::Tensor sum_of_squares(const torch::Tensor& g) {
  auto flat = g.reshape({-1});
  auto acc = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat64).device(g.device()));
  for (int64_t lo = 0; lo < flat.numel(); lo += kReduceChunk)
    acc += flat.narrow(0, lo, std::min(kReduceChunk, flat.numel() - lo))
               .to(torch::kFloat64)
               .pow(2)
               .sum();
  return acc;
}

bool all_finite(const torch::Tensor& g) {
  auto flat = g.reshape({-1});
  for (int64_t lo = 0; lo < flat.numel(); lo += kReduceChunk)
    if (!torch::isfinite(flat.narrow(0, lo, std::min(kReduceChunk, flat.numel() - lo)))
             .all()
             .item<bool>())
      return false;
  return true;
}

// Stages 2 and 3 stage at most this many gradient elements per bucket (16 MiB of fp32), whatever
// reduce_bucket_size says (DeepSpeed's default 5e8 is a whole model of up to 500M parameters:
// a bucket that size keeps every gradient of backward alive at once, plus its copy).
constexpr int64_t kMaxBucketElements = int64_t(1) << 22;

// A DeepSpeed canonical dtype name of the config ("fp16", "bf16", "fp32"); "" is `otherwise`.
torch::ScalarType dtype_named(const std::string& name, torch::ScalarType otherwise) {
  if (name == "fp16") return torch::kHalf;
  if (name == "bf16") return torch::kBFloat16;
  if (name == "fp32") return torch::kFloat32;
  return otherwise;
}

// DeepSpeed 0.19.8's buffers under fp16/bf16 (DeepSpeedEngine._cast_module_mixed_precision):
// the floating ones named by keep_in_fp32_modules in fp32, the others in buffer_dtype when it is
// set; without it they keep their dtype (a BatchNorm's fp32 statistics then meet 16-bit inputs).
void cast_buffers(torch::nn::Module& module, const DataTypesConfig& types) {
  std::optional<std::regex> keep;
  if (!types.keep_in_fp32_modules.empty())
    keep.emplace(keep_in_fp32_regex(types.keep_in_fp32_modules));
  std::optional<torch::ScalarType> to;
  if (!types.buffer_dtype.empty()) to = dtype_named(types.buffer_dtype, torch::kFloat32);
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_buffers(/*recurse=*/true)) {
    auto& b = item.value();
    if (!b.defined() || !b.is_floating_point()) continue;
    if (keep && std::regex_search(item.key(), *keep)) {
      if (b.scalar_type() != torch::kFloat32) b.set_data(b.to(torch::kFloat32));
      continue;
    }
    const auto t = b.scalar_type();
    const bool castable =
        t == torch::kHalf || t == torch::kBFloat16 || t == torch::kFloat32 || t == torch::kFloat64;
    if (to && castable && t != *to) b.set_data(b.to(*to));
  }
}

std::string describe_tensor(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.scalar_type() << " on " << t.device();
  return s.str();
}

}  // namespace

std::unique_ptr<EngineCore> make_engine_core(torch::nn::Module& module, Config config,
                                             InitOptions options) {
  return std::make_unique<EngineImpl>(module, std::move(config), std::move(options));
}

EngineImpl::EngineImpl(torch::nn::Module& module, Config config, InitOptions options)
    : module_(module),
      config_(std::move(config)),
      group_(std::move(options.group)),
      policy_(Partitioning::for_stage(config_.zero.stage)),
      scaler_(scaler_config(config_)),
      scheduler_(config_.scheduler, config_.optimizer.lr, config_.optimizer.beta1,
                 config_.optimizer.beta2) {
  if (!group_) group_ = default_group();
  keep_large_buffers_unmapped();
  rank_ = group_->rank();
  world_ = group_->world_size();
  // What the config says dtrain resolves, ignores or does differently: once, from rank 0.
  if (rank_ == 0)
    for (const auto& note : config_.notes) std::cerr << "dtrain zero: note: " << note << "\n";
  // DeepSpeed's engine prints its resolved config on rank 0 at log level info.
  if (rank_ == 0 && (config_.log_level == "info" || config_.log_level == "debug"))
    std::cout << "dtrain zero: engine configuration\n" << describe(config_, std::nullopt);
  if (config_.world_size != world_)
    throw UsageError("zero::initialize: the config was resolved for world size " +
                     std::to_string(config_.world_size) + " but the group has " +
                     std::to_string(world_) + " ranks");
  auto client = std::move(options.optimizer);
  if (client && config_.optimizer.given)
    throw UsageError(
        "zero::initialize: an optimizer was given twice, in the config's \"optimizer\" section and "
        "as "
        "InitOptions::optimizer; remove one of them");
  if (!client && !config_.optimizer.given)
    throw UsageError(
        "zero::initialize: the config has no \"optimizer\" section; add one, e.g. "
        "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.001}} (Adam, AdamW, SGD, "
        "Lamb or Adagrad), "
        "or pass your own torch::optim optimizer as InitOptions::optimizer");
  if (client && client->param_groups().size() != 1)
    throw UsageError(
        "zero::initialize: InitOptions::optimizer has " +
        std::to_string(client->param_groups().size()) +
        " parameter groups; ZeRO steps one flat partition of every parameter, so give it one group "
        "(e.g. over module->parameters())");
  if (client && !has_only_constructor_state(*client))
    throw UsageError("zero::initialize: InitOptions::optimizer already holds state for " +
                     std::to_string(client->state().size()) +
                     " parameters; give a fresh optimizer (load state with load_checkpoint)");
  for (auto& item : module_.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    names_.push_back(item.key());
    params_.push_back(item.value());
  }
  if (params_.empty()) throw UsageError("zero::initialize: the module has no trainable parameters");
  const auto dtype0 = params_[0].scalar_type();
  device_ = params_[0].device();
  ThroughputTimer::Options timer;
  timer.enabled = config_.throughput_timer;
  timer.synchronized = config_.throughput_timer_synchronized;
  timer.batch_size = config_.train_batch_size;
  timer.steps_per_output = config_.steps_per_print;
  timer.device = device_;
  tput_ = ThroughputTimer(timer);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].scalar_type() != dtype0 || params_[i].device() != device_)
      throw UsageError(
          "zero::initialize: every trainable parameter must have one dtype and device; '" +
          names_[0] + "' is " + describe_tensor(params_[0]) + " but '" + names_[i] + "' is " +
          describe_tensor(params_[i]));
  }
  mixed_ = config_.fp16.enabled || config_.bf16;
  if (mixed_) {
    cast_buffers(module_, config_.data_types);
    model_dtype_ = config_.fp16.enabled ? torch::kHalf : torch::kBFloat16;
    master_dtype_ = torch::kFloat32;
  } else {
    if (dtype0 != torch::kFloat32 && dtype0 != torch::kFloat64)
      throw UsageError("zero::initialize: parameters are " + describe_tensor(params_[0]) +
                       "; give float32 (or float64) parameters, and enable fp16 or bf16 in the "
                       "config for 16-bit training");
    model_dtype_ = master_dtype_ = dtype0;
  }
  // DeepSpeed 0.19.8: gradients are reduced in communication_data_type and accumulated over
  // micro-batches in data_types.grad_accum_dtype, both the model's dtype unless set.
  comm_dtype_ = dtype_named(communication_data_type(config_), model_dtype_);
  accum_dtype_ = dtype_named(config_.data_types.grad_accum_dtype, model_dtype_);
  offload_opt_ = config_.zero.offload_optimizer.enabled();
  skips_nonfinite_ = skips_nonfinite_steps(config_);
  grad_norm_report_ = grad_norm_report(config_);
  offload_param_ = config_.zero.offload_param.enabled();
  const auto& shards = options.partitioned;
  if (shards) check_partitioned(*shards);
  for (size_t i = 0; i < params_.size(); ++i) {
    shapes_.push_back(shards ? shards->shapes[i] : params_[i].sizes().vec());
    int64_t n = 1;
    for (auto d : shapes_.back()) n *= d;
    offsets_.push_back(numel_);
    numels_.push_back(n);
    numel_ += n;
  }
  padded_ = padded_numel(numel_, world_);
  part_ = padded_ / world_;
  if (config_.torch_autocast.enabled && config_.zero.stage > 0) {
    // DeepSpeed's get_param_comm_dtype once torch_autocast is initialized: the parameter's
    // mark, else its dtype (communication_data_type is not read); a mark only with a dtype
    // given (None marks nothing that changes a dtype).
    per_param_comm_ = true;
    comm_dtype_ = model_dtype_;
    if (!config_.torch_autocast.dtype.empty()) {
      autocast_comm_dtype_ = dtype_named(config_.torch_autocast.dtype, torch::kBFloat16);
      const auto marked = lower_precision_safe_parameters(
          module_, config_.torch_autocast.lower_precision_safe_modules);
      for (size_t i = 0; i < params_.size(); ++i) {
        if (!marked.count(params_[i].unsafeGetTensorImpl()) || numels_[i] == 0) continue;
        if (!autocast_ranges_.empty() && autocast_ranges_.back().second == offsets_[i])
          autocast_ranges_.back().second += numels_[i];
        else
          autocast_ranges_.emplace_back(offsets_[i], offsets_[i] + numels_[i]);
      }
    }
  }
  // DeepSpeed 0.19.8 makes its GradScaler for a dtype given as fp16 only (left out, CUDA's
  // default fp16 runs unscaled).
  if (config_.torch_autocast.enabled && config_.torch_autocast.dtype == "fp16")
    amp_scaler_ = std::make_unique<AmpGradScaler>();
  if (shards && shards->partition.numel() != part_)
    throw InternalError("zero: the partitioned construction's shard has " +
                        std::to_string(shards->partition.numel()) + " elements, the layout " +
                        std::to_string(part_));

  // Rank 0's values everywhere (in the master dtype), and its buffers; a partitioned
  // construction's shards are this rank's already (every rank built with the same seed).
  // Stage 3 with offload_param keeps its partition on the host: the flat copy is made there,
  // so the device never holds the model twice (one that fills it once still initialises).
  const bool part_on_host = policy_.parameters() && offload_param_;
  auto full_opts = torch::TensorOptions()
                       .dtype(master_dtype_)
                       .device(part_on_host ? torch::Device(torch::kCPU) : device_);
  torch::Tensor full;
  if (!shards) full = torch::zeros({padded_}, full_opts);
  {
    torch::NoGradGuard ng;
    // Under fp16/bf16 the fp32 master starts from the 16-bit values the model trains with, as
    // DeepSpeed's does (it casts the module first and copies the master from it): the first
    // update then rounds as DeepSpeed's.
    for (size_t i = 0; full.defined() && i < params_.size(); ++i)
      full.narrow(0, offsets_[i], numels_[i])
          .copy_(mixed_ ? params_[i].detach().reshape({-1}).to(model_dtype_)
                        : params_[i].detach().reshape({-1}));
    if (world_ > 1) {
      BroadcastOptions o;
      o.group = group_;
      if (full.defined()) broadcast(full, o);
      for (auto& b : module_.buffers(true)) {
        if (!b.defined() || b.numel() == 0) continue;
        auto t = b.detach().contiguous();
        broadcast(t, o);
        b.detach().copy_(t);
      }
    }
  }
  const auto state_device = offload_opt_ ? torch::Device(torch::kCPU) : device_;
  // This rank's partition: a slice of `full`, or the shard (taken over, not copied, where its
  // dtype and device already are the ones needed).
  torch::Tensor own = shards ? shards->partition.to(device_) : own_slice(full);
  if (shards && mixed_) own = own.to(model_dtype_).to(master_dtype_);
  if (mixed_ || offload_opt_) {
    master_ =
        host_side((policy_.optimizer() ? own : full).to(state_device, master_dtype_, false, true),
                  config_.zero.offload_optimizer);
  }
  if (!policy_.parameters()) {
    flat_params_ = mixed_ ? full.to(model_dtype_) : full;
    point_params_at(flat_params_);
  } else {
    auto part_device = offload_param_ ? torch::Device(torch::kCPU) : device_;
    param_part_ = host_side(own.to(part_device, model_dtype_, false, /*copy=*/!shards),
                            config_.zero.offload_param);
    full = torch::Tensor();
    // Full-shaped until the hooks are installed (a gradient accumulator records its
    // parameter's shape and dtype when it is created), but over one element: released at the
    // end of the constructor.
    torch::NoGradGuard ng;
    auto one = torch::zeros({1}, torch::TensorOptions().dtype(model_dtype_).device(device_));
    for (size_t i = 0; i < params_.size(); ++i) params_[i].set_data(one.expand(shapes_[i]));
  }
  const bool client_given = client != nullptr;
  optimizer_ = make_partition_optimizer(
      detail::optimizer_under_scheduler(config_.optimizer, config_.scheduler), std::move(client),
      update_target(), config_.zero.offload_optimizer.enabled());
  if (client_given) {  // its own rate (and betas) are the schedule's base
    double beta2 = config_.optimizer.beta2;
    const auto& options = optimizer_->client()->param_groups().at(0).options();
    if (auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&options))
      beta2 = std::get<1>(adam->betas());
    else if (auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&options))
      beta2 = std::get<1>(adamw->betas());
    scheduler_ =
        LRScheduler(config_.scheduler, optimizer_->lr(), config_.optimizer.beta1,
                    config_.scheduler.type == "OneCycleLR" ? beta2 : config_.optimizer.beta2);
  }
  // DeepSpeed 0.19.8's stage-0 fp16/bf16 optimizers (FP16_Optimizer, FP16_UnfusedOptimizer)
  // create the optimizer's state with one step on zero gradients, at the optimizer's own rate:
  // its step count then runs one ahead (Adam's bias correction) and weight decay acts once more.
  // The same step here, so that a stage-0 16-bit run updates as DeepSpeed's does.
  if (policy_.deepspeed_zero_gradient_first_step(mixed_)) {
    torch::NoGradGuard ng;
    PartitionOptimizer::StepArgs args;
    args.step = ++opt_step_;
    args.lr = optimizer_->lr();
    args.beta1 = config_.optimizer.beta1;
    args.beta2 = config_.optimizer.beta2;
    args.offsets = &offsets_;
    args.numels = &numels_;
    args.sum_over_ranks = [](torch::Tensor&) {};  // every rank updates everything at stage 0
    optimizer_->step(update_target(), torch::zeros_like(update_target()), args);
    own_params().copy_(master_);
  }

  if (!policy_.gradients()) {
    flat_grads_ =
        torch::zeros({padded_}, torch::TensorOptions().dtype(model_dtype_).device(device_));
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i].mutable_grad() = flat_grads_.narrow(0, offsets_[i], numels_[i]).view(shapes_[i]);
    if (policy_.optimizer() && accum_dtype_ != model_dtype_)
      grad_acc_ = torch::zeros({padded_}, flat_grads_.options().dtype(accum_dtype_));
  } else {
    grad_part_ = host_side(torch::zeros({part_}, torch::TensorOptions()
                                                     .dtype(accum_dtype_)
                                                     .device(offload_opt_ ? torch::kCPU : device_)),
                           config_.zero.offload_optimizer);
  }
  // Gradients reduced during backward as their buckets complete: into grad_part_, or (stage 1
  // with overlap_comm, in the boundary micro-step) in place in flat_grads_ to their owners.
  if (policy_.reduces_in_backward(config_.zero, world_,
                                  /*in_model_dtype=*/!mixed_ && comm_dtype_ == model_dtype_)) {
    make_buckets();
    ::dtrain::detail::add_grad_ready_hooks(
        params_, names_, [this](size_t i) { on_grad_ready(i); }, hooks_);
  }
  if (policy_.parameters()) release_parameters();
  // DeepSpeed's engine logs the line once when it has built its optimizer and scheduler (step 0,
  // whatever steps_per_print says), then every steps_per_print steps.
  report_progress();
}

void EngineImpl::check_partitioned(const PartitionedShards& shards) const {
  if (!policy_.parameters())
    throw UsageError(
        "zero::initialize: the model was built partitioned (build_partitioned) but "
        "zero_optimization.stage is " +
        std::to_string(config_.zero.stage) +
        "; partitioned parameters need stage 3 (set \"stage\": 3, or build the "
        "model whole for stages 0-2)");
  if (shards.world != world_ || shards.rank != rank_)
    throw UsageError("zero::initialize: the model was built partitioned for rank " +
                     std::to_string(shards.rank) + " of " + std::to_string(shards.world) +
                     " but the engine's group makes this rank " + std::to_string(rank_) + " of " +
                     std::to_string(world_) + "; give build_partitioned the engine's group");
  if (shards.shapes.size() != params_.size())
    throw UsageError("zero::initialize: the model was built partitioned with " +
                     std::to_string(shards.shapes.size()) + " trainable parameters but has " +
                     std::to_string(params_.size()) +
                     " now; give initialize the module build_partitioned returned, unchanged");
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].numel() != 0)
      throw UsageError("zero::initialize: parameter '" + names_[i] +
                       "' of the partitioned model holds " + std::to_string(params_[i].numel()) +
                       " elements; give initialize the module build_partitioned returned, "
                       "unchanged");
}

EngineImpl::~EngineImpl() { ::dtrain::detail::remove_grad_hooks(hooks_); }

// Buckets over the flat range in reverse registration order (roughly backward's order).
void EngineImpl::make_buckets() {
  const int64_t cap = std::max<int64_t>(
      1, policy_.gradients() ? std::min(config_.zero.reduce_bucket_size, kMaxBucketElements)
                             : config_.zero.reduce_bucket_size);
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
}

void EngineImpl::point_params_at(const torch::Tensor& flat) {
  torch::NoGradGuard ng;
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].set_data(flat.narrow(0, offsets_[i], numels_[i]).view(shapes_[i]));
}

void EngineImpl::set_units(const std::vector<std::shared_ptr<torch::nn::Module>>& units) {
  if (!policy_.parameters()) return;
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

size_t EngineImpl::unit_of(const torch::nn::Module& m) const {
  for (size_t u = 0; u < unit_modules_.size(); ++u)
    if (unit_modules_[u].get() == &m) return u;
  throw UsageError("zero: fetch() got module '" + m.name() +
                   "', which is not one of the units given to fetch_units()");
}

void EngineImpl::begin_units() {
  tput_.start();  // a forward pass through the units (DeepSpeed's engine.forward)
  if (gathered_) release_parameters();  // a whole-module gather (evaluation, checkpoint) ends here
}

void EngineImpl::unit_begin(size_t u) { fetch_->begin_forward(u); }

void EngineImpl::unit_end(size_t u, const torch::Tensor* output) { fetch_->end_forward(u, output); }

Stage3Stats EngineImpl::stage3_stats() const { return fetch_ ? fetch_->stats() : Stage3Stats{}; }

void EngineImpl::set_stage3_trace(std::function<void(const std::string&)> trace) {
  if (fetch_) fetch_->set_trace(std::move(trace));
}

void EngineImpl::gather_parameters() {
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

void EngineImpl::release_parameters() {
  torch::NoGradGuard ng;
  auto empty = torch::empty({0}, torch::TensorOptions().dtype(model_dtype_).device(device_));
  for (auto& p : params_) p.set_data(empty);
  flat_params_ = torch::Tensor();
  gathered_ = false;
}

void EngineImpl::before_forward() {
  tput_.start();
  if (policy_.parameters() && !gathered_) gather_parameters();
}

bool EngineImpl::forward_autocast(c10::DeviceType* device, c10::ScalarType* dtype) const {
  const auto& a = config_.torch_autocast;
  *device = device_.type();
  if (!a.enabled) return false;
  // "": the device's default (ForwardAutocast asks torch); "fp32" turns torch.autocast off.
  *dtype = dtype_named(a.dtype, c10::ScalarType::Undefined);
  return true;
}

torch::Tensor EngineImpl::backward(const torch::Tensor& loss, const BackwardOptions& options) {
  // DeepSpeed asserts the first; torch's own error for the second names no loss.
  if (!loss.defined() || loss.numel() != 1)
    throw UsageError("zero: backward(loss): the loss must be a tensor of one element (it has " +
                     (loss.defined() ? "shape " + c10::str(loss.sizes()) : std::string("none")) +
                     "); reduce it first (mean or sum), as DeepSpeed's engine requires");
  if (!loss.requires_grad())
    throw UsageError(
        "zero: backward(loss): the loss does not require gradients (detached, or computed "
        "under torch::NoGradGuard / InferenceMode?); compute it from the engine's forward");
  if (policy_.parameters() && !gathered_ && !fetch_) gather_parameters();
  if (!policy_.gradients()) {
    // A user's zero_grad() (set_to_none) detaches .grad from the flat buffer: re-point it, the
    // accumulated gradient dropped as PyTorch drops it (a .grad replaced: copied in).
    torch::NoGradGuard ng;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto view = flat_grads_.narrow(0, offsets_[i], numels_[i]).view(shapes_[i]);
      const auto& g = params_[i].grad();
      if (!g.defined() || g.data_ptr() != view.data_ptr()) {
        if (g.defined())
          view.copy_(g);
        else
          view.zero_();
        params_[i].mutable_grad() = view;
      }
    }
  }
  // With grad_acc_ flat_grads_ holds one micro-batch's gradient (DeepSpeed's BF16_Optimizer
  // clears its 16-bit gradients as each backward starts): .grad shows the last micro-batch's.
  if (grad_acc_.defined()) flat_grads_.zero_();
  // The loss into backward as DeepSpeed computes it: divided by the accumulation steps (what
  // backward returns), then times fp16's loss scale or through fp16 torch_autocast's GradScaler.
  const int64_t gas = options.scale_wrt_gas ? config_.gradient_accumulation_steps : 1;
  const torch::Tensor divided = gas == 1 ? loss : loss / gas;
  torch::Tensor scaled;
  if (amp_scaler_)
    scaled = amp_scaler_->scale(divided);
  else
    scaled = scaler_.scale() == 1.0 ? divided : divided * scaler_.scale();
  // Stages 0-1 reduce at an accumulation boundary (outside no_sync), in backward when buckets
  // overlap it, else in the step.
  reduce_in_backward_ = policy_.gradients() ||
                        (!buckets_.empty() && !no_sync_ && is_gradient_accumulation_boundary());
  if (!config_.managed_gradient_accumulation) ++unmanaged_backwards_;
  in_backward_ = true;
  try {
    scaled.backward({}, options.retain_graph);
  } catch (...) {
    in_backward_ = false;
    in_flight_.clear();  // a failed backward leaves the step unusable; do not wait on its
                         // reductions later
    throw;
  }
  if (grad_acc_.defined()) {  // this micro-batch's 16-bit gradient into the fp32 sum
    torch::NoGradGuard ng;
    grad_acc_.add_(flat_grads_);
  }
  if (reduce_in_backward_) finish_backward();
  in_backward_ = false;
  if (policy_.parameters()) {
    if (fetch_) fetch_->end_backward();
    if (gathered_) release_parameters();
  }
  return divided;
}

void EngineImpl::on_grad_ready(size_t i) {
  if (!in_backward_ || !reduce_in_backward_ || ready_[i]) return;
  ready_[i] = true;
  --buckets_[bucket_of_[i]].pending;
  launch_ready_buckets();
  if (fetch_) fetch_->on_grad_ready(i);
}

void EngineImpl::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0)
    reduce_bucket(buckets_[next_bucket_++]);
}

void EngineImpl::reduce_bucket(Bucket& b) {
  torch::NoGradGuard ng;
  if (!policy_.gradients()) {
    // The bucket's range of flat_grads_ is final: each owner's piece is reduced in place (the
    // other ranks' copies are not read again before the step zeroes them).
    for (int r = 0; r < world_; ++r) {
      int64_t lo = std::max(b.begin, r * part_), hi = std::min(b.end, (r + 1) * part_);
      if (lo >= hi) continue;
      auto seg = flat_grads_.narrow(0, lo, hi - lo);
      prepare_to_reduce(seg, model_dtype_, lo);
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
  prepare_to_reduce(staging, model_dtype_, b.begin);
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
        // Launched now, added once two newer buckets are launched (settle_in_flight) or at the
        // end of backward: the reduction overlaps the rest of backward.
        in_flight_.push_back({reduce_async(seg, o), seg, lo - r * part_, r == rank_,
                              static_cast<size_t>(&b - buckets_.data())});
        continue;
      }
      reduce(seg, o);
      if (r == rank_) round_to_comm_dtype(seg, lo);
    }
    if (r == rank_) grad_part_.narrow(0, lo - r * part_, hi - lo).add_(seg.to(grad_part_.device()));
  }
  b.launched = true;
  if (config_.zero.overlap_comm && world_ > 1) settle_in_flight(&b - buckets_.data());
}

// Without this bound every bucket's staging (for a bucket of one parameter: autograd's
// gradient itself) stayed alive until the end of backward, a whole model's gradients on the
// device at once.
void EngineImpl::settle_in_flight(size_t newest) {
  size_t done = 0;
  while (done < in_flight_.size() && in_flight_[done].bucket + 1 < newest) fold(in_flight_[done++]);
  in_flight_.erase(in_flight_.begin(), in_flight_.begin() + static_cast<std::ptrdiff_t>(done));
}

void EngineImpl::fold(InFlight& f) {
  f.work.wait();
  if (!f.mine) return;
  round_to_comm_dtype(f.segment, rank_ * part_ + f.offset);
  grad_part_.narrow(0, f.offset, f.segment.numel()).add_(f.segment.to(grad_part_.device()));
}

void EngineImpl::round_to_comm_dtype(torch::Tensor& t, int64_t at) const {
  // Nothing to do for the same dtype, or a wider one that holds the values.
  auto narrower = [&](torch::Dtype d) {
    return t.scalar_type() != d && c10::elementSize(d) <= c10::elementSize(t.scalar_type());
  };
  if (narrower(comm_dtype_)) t.copy_(t.to(comm_dtype_));
  if (!per_param_comm_ || autocast_ranges_.empty() || !narrower(autocast_comm_dtype_)) return;
  if (at < 0) throw InternalError("zero: a gradient range without its flat offset");
  const int64_t end = at + t.numel();
  for (const auto& [lo, hi] : autocast_ranges_) {
    const int64_t a = std::max(lo, at), b = std::min(hi, end);
    if (a >= b) continue;
    auto piece = t.narrow(0, a - at, b - a);
    piece.copy_(piece.to(autocast_comm_dtype_));
  }
}

void EngineImpl::prepare_to_reduce(torch::Tensor& t, torch::ScalarType source, int64_t at) const {
  if (source != comm_dtype_ || per_param_comm_) round_to_comm_dtype(t, at);
  if (policy_.optimizer() && world_ > 1) {
    t.div_(static_cast<double>(world_));
    round_to_comm_dtype(t, at);
  }
}

void EngineImpl::finish_backward() {
  for (; next_bucket_ < buckets_.size(); ++next_bucket_) reduce_bucket(buckets_[next_bucket_]);
  // In launch order: every rank waits for the same sequence of collectives.
  for (auto& f : in_flight_) fold(f);
  in_flight_.clear();
  if (!policy_.gradients()) grads_reduced_ = true;
  next_bucket_ = 0;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
  }
  std::fill(ready_.begin(), ready_.end(), false);
}

bool EngineImpl::is_gradient_accumulation_boundary() const {
  if (boundary_override_) return *boundary_override_;
  if (!config_.managed_gradient_accumulation) return running_step_;
  return (micro_steps_ + 1) % config_.gradient_accumulation_steps == 0;
}

void EngineImpl::set_gradient_accumulation_boundary(bool is_boundary) {
  if (!config_.managed_gradient_accumulation)
    throw UsageError(
        "zero: set_gradient_accumulation_boundary() with \"managed_gradient_accumulation\": "
        "false (DeepSpeed 0.19.8 refuses it too): the caller owns the boundary there, each "
        "step() is one; drop the call or the key");
  boundary_override_ = is_boundary;
}

void EngineImpl::set_no_sync(bool on) {
  if (on && policy_.gradients())
    throw UsageError("zero: no_sync() at stage " + std::to_string(config_.zero.stage) +
                     ", whose partitioned gradients are reduced in every backward (DeepSpeed "
                     "0.19.8 refuses it too); accumulate with gradient_accumulation_steps, or "
                     "use stage 0 or 1");
  if (on && no_sync_)
    throw UsageError(
        "zero: no_sync() while another no_sync() guard lives (DeepSpeed refuses re-entry too); "
        "keep one guard");
  no_sync_ = on;
}

void EngineImpl::set_train_batch_size(int64_t train_batch_size) {
  const int64_t per_micro_step = config_.train_micro_batch_size_per_gpu * world_;
  if (train_batch_size <= 0 || train_batch_size % per_micro_step != 0)
    throw UsageError("zero: set_train_batch_size(" + std::to_string(train_batch_size) +
                     "): not a positive multiple of the micro-batch times the data-parallel "
                     "ranks (" +
                     std::to_string(config_.train_micro_batch_size_per_gpu) + " x " +
                     std::to_string(world_) + " = " + std::to_string(per_micro_step) +
                     "), which the accumulation steps must fill (DeepSpeed raises ValueError)");
  config_.train_batch_size = train_batch_size;
  config_.gradient_accumulation_steps = train_batch_size / per_micro_step;
}

void EngineImpl::set_train_micro_batch_size(int64_t micro_batch_size) {
  if (micro_batch_size <= 0)
    throw UsageError("zero: set_train_micro_batch_size(" + std::to_string(micro_batch_size) +
                     "): a micro-batch holds at least one sample");
  config_.train_micro_batch_size_per_gpu = micro_batch_size;
  config_.train_batch_size = micro_batch_size * config_.gradient_accumulation_steps * world_;
}

nlohmann::json EngineImpl::mom() const {
  // The progress line's list, Python's tuples as arrays.
  std::string text = mom_list_text(config_, scheduler_, optimizer_->client());
  for (char& ch : text) {
    if (ch == '(') ch = '[';
    if (ch == ')') ch = ']';
  }
  return nlohmann::json::parse(text);
}

double EngineImpl::lr() const {
  if (scheduler_.enabled()) return scheduler_.lr();
  return optimizer_->lr();
}

torch::Tensor EngineImpl::own_params() const {
  if (policy_.parameters()) return param_part_;
  return policy_.optimizer() ? own_slice(flat_params_) : flat_params_;
}

void EngineImpl::combine_step_scalar(torch::Tensor& t, ReduceOp op) {
  if (world_ == 1 || !policy_.combines_step_scalars()) return;
  AllReduceOptions o;
  o.group = group_;
  o.op = op;
  all_reduce(t, o);
  count(nbytes(t) * 2 * (world_ - 1) / world_);
}

torch::Tensor EngineImpl::averaged_gradient() {
  const auto master_device = offload_opt_ ? torch::Device(torch::kCPU) : device_;
  torch::Tensor g;
  switch (policy_.gradient_path()) {
    case GradientPath::kAllReduce:
      g = flat_grads_.to(master_dtype_);
      prepare_to_reduce(g, model_dtype_);
      if (world_ > 1) {
        AllReduceOptions o;
        o.group = group_;
        all_reduce(g, o);
        count(nbytes(g) * 2 * (world_ - 1) / world_);
        round_to_comm_dtype(g);
      }
      break;
    case GradientPath::kReduceToOwners: {
      // Each partition reduced onto its owner (in place unless the gradients are 16-bit);
      // already done when the boundary backward reduced its buckets (overlap_comm).
      auto full = grad_acc_.defined() ? grad_acc_ : flat_grads_.to(master_dtype_);
      if (!grads_reduced_) {
        prepare_to_reduce(full, grad_acc_.defined() ? accum_dtype_ : model_dtype_, 0);
        reduce_to_owners(full);
      }
      grads_reduced_ = false;
      g = own_slice(full);
      if (world_ > 1) round_to_comm_dtype(g, rank_ * part_);
      break;
    }
    case GradientPath::kPartition:
      g = grad_part_;
      break;
  }
  // In place from here: g is flat_grads_, grad_acc_ or grad_part_ (zeroed after the step) or a
  // copy.
  if (g.device() != master_device || g.scalar_type() != master_dtype_)
    g = g.to(master_device, master_dtype_);
  if (!policy_.optimizer()) g.div_(static_cast<double>(world_));  // stages 1-3: before reducing
  if (config_.fp16.enabled) g.div_(scaler_.scale());
  return g;
}

void EngineImpl::record_overflow() {
  if (config_.zero.stage == 0 && scaler_.dynamic()) {
    // DeepSpeed's FP16_Optimizer._update_scale: max(scale / 2, min_loss_scale) at every
    // overflow - it goes on at the minimum (and a scale that started below it rises to it),
    // where its ZeRO optimizers stop the run (LossScaler::update throws).
    auto s = scaler_.state();  // scale, iteration, last overflow iteration, hysteresis
    s[0] = std::max(s[0] / 2.0, config_.fp16.min_loss_scale);
    s[2] = s[1];
    s[1] += 1;
    scaler_.set_state(s);
    return;
  }
  scaler_.update(true);
}

void EngineImpl::step() {
  if (no_sync_)
    throw UsageError(
        "zero: step() inside no_sync() (DeepSpeed refuses it too): end the guard's scope "
        "first; the backward after it, at an accumulation boundary, reduces the gradients the "
        "guarded ones accumulated");
  // DeepSpeed's step(): the model step at a boundary (with managed_gradient_accumulation
  // false, every step() is one), then its throughput timer, whose line (rank 0, at the log
  // levels that show the progress line) follows the progress line; then the micro-step counter.
  step_applied_ = false;
  running_step_ = true;
  const bool boundary = is_gradient_accumulation_boundary();
  try {
    if (boundary) take_model_step();
  } catch (...) {
    running_step_ = false;
    throw;
  }
  running_step_ = false;
  const std::string line = tput_.stop(boundary, rank_ == 0);
  if (!line.empty() && (config_.log_level == "info" || config_.log_level == "debug"))
    std::cout << line << std::endl;
  ++micro_steps_;
}

void EngineImpl::take_model_step() {
  torch::NoGradGuard ng;
  // Stage 3: a forward without backward (evaluation) left the module gathered; the update
  // below changes the partitions, so the next forward must gather again.
  if (policy_.parameters() && gathered_) release_parameters();
  if (fetch_) fetch_->release_all();  // persistent units too: the partitions change
  // 1. This rank's averaged gradients, in the master dtype, where the master lives.
  torch::Tensor g = averaged_gradient();
  // 2. An inf or NaN anywhere (fp16's overflow; other dtypes where DeepSpeed checks them too)
  // skips the step, and the scheduler, on every rank. Outside fp16 with clipping the global
  // norm shows it (DeepSpeed's ZeRO optimizers check that norm): no collective of its own.
  const bool clip = config_.gradient_clipping > 0;
  std::optional<double> sq_norm;  // the squared global norm, once combined over the ranks
  auto global_sq_norm = [&] {
    if (!sq_norm) {
      auto sq = sum_of_squares(g);
      if (inject_overflow_) sq.fill_(INFINITY);  // the test hook, as an inf on this rank
      combine_step_scalar(sq, ReduceOp::kSum);
      sq_norm = sq.item<double>();
    }
    return *sq_norm;
  };
  if (skips_nonfinite_) {
    bool skip = false;
    // With the norm taken anyway (clipping, or DeepSpeed's get_global_grad_norm), it shows an
    // inf or NaN: no collective of its own (every rank takes the same path).
    if ((clip || grad_norm_report_ != GradNormReport::kNone) && !config_.fp16.enabled) {
      skip = !std::isfinite(global_sq_norm());
    } else {
      bool local = inject_overflow_ || !all_finite(g);
      auto flag = torch::tensor({local ? 1.0f : 0.0f});
      combine_step_scalar(flag, ReduceOp::kMax);
      skip = flag.item<float>() > 0;
    }
    inject_overflow_ = false;
    if (skip) {
      if (config_.fp16.enabled) record_overflow();
      last_grad_norm_ = INFINITY;  // as DeepSpeed's global norm after an overflow
      if (grad_norm_report_ != GradNormReport::kNone) global_grad_norm_ = INFINITY;
      ++skipped_steps_;
      finish_model_step();
      return;
    }
  }
  // DeepSpeed's get_global_grad_norm(): the norm before clipping (g holds the gradients divided
  // by fp16's loss scale; under fp16 torch_autocast at stages 1-3 still the GradScaler's).
  const double scale_before = scaler_.scale();
  std::optional<double> norm;
  if (grad_norm_report_ != GradNormReport::kNone) {
    norm = std::sqrt(global_sq_norm());
    if (!std::isfinite(*norm)) norm = INFINITY;  // DeepSpeed's norms make NaN inf too
  }
  // fp16 torch_autocast: the GradScaler's unscale. DeepSpeed's stage-0 engine unscales before
  // it clips; its ZeRO optimizers clip by the norm of the still-scaled gradients (their own loss
  // scale is 1), then the GradScaler unscales in its step.
  bool amp_unscaled = false, amp_found_inf = false;
  auto amp_unscale = [&] {
    amp_found_inf = amp_scaler_->unscale(g);
    amp_unscaled = true;
  };
  // 3. Clipping by the global norm over every rank's partition.
  if (clip) {
    if (amp_scaler_ && config_.zero.stage == 0) amp_unscale();
    last_grad_norm_ = std::sqrt(global_sq_norm());
    double coef = config_.gradient_clipping / (last_grad_norm_ + 1e-6);
    if (coef < 1) g.mul_(coef);
  }
  const bool by_sub_group = amp_scaler_ && config_.zero.stage == 3;
  if (by_sub_group)
    amp_found_inf = amp_unscale_by_sub_group(g, policy_.update_offset(rank_, part_));
  else if (amp_scaler_ && !amp_unscaled)
    amp_unscale();
  // 4. The update of this rank's partition; under the GradScaler not with an inf in this rank's
  // gradients. Its found_inf covers what the optimizer holds, so at stages 1-2 (with
  // compute_grad_norm false: no norm skipped the step) a rank skips alone, as in DeepSpeed;
  // Lamb's norms take every rank, so there the ranks skip together. The scheduler steps either
  // way, and the step is not counted as skipped (DeepSpeed's engine sees no overflow).
  if (amp_scaler_ && optimizer_->type() == "Lamb") {
    auto flag = torch::tensor({amp_found_inf ? 1.0f : 0.0f});
    combine_step_scalar(flag, ReduceOp::kMax);
    amp_found_inf = flag.item<float>() > 0;
  }
  if (!amp_found_inf) update_partition(g);
  if (amp_scaler_ && !by_sub_group) amp_scaler_->update(amp_found_inf);
  // 5. Everyone's updated partitions back into every rank's parameters.
  if (policy_.gathers_after_step() && world_ > 1) all_gather_params();
  if (config_.fp16.enabled) scaler_.update(false);
  step_applied_ = true;
  switch (grad_norm_report_) {
    case GradNormReport::kNone:
      global_grad_norm_ = std::nullopt;
      break;
    case GradNormReport::kUnscaled:
      global_grad_norm_ = norm;
      break;
    case GradNormReport::kScaled:
      global_grad_norm_ = *norm * scale_before;
      break;
    case GradNormReport::kAfterUpdate:
      global_grad_norm_ = *norm * scale_before / scaler_.scale();
      break;
  }
  scheduler_.step();
  finish_model_step();
}

void EngineImpl::finish_model_step() {
  if (flat_grads_.defined()) flat_grads_.zero_();
  if (grad_acc_.defined()) grad_acc_.zero_();
  if (grad_part_.defined()) grad_part_.zero_();
  ++global_steps_;
  // DeepSpeed's: the train batch; a caller-owned boundary counts the micro-batches taken.
  const int64_t micro_batches = config_.managed_gradient_accumulation
                                    ? config_.gradient_accumulation_steps
                                    : std::exchange(unmanaged_backwards_, 0);
  global_samples_ += config_.train_batch_size / config_.gradient_accumulation_steps * micro_batches;
  report_progress();
  bytes_last_step_ = bytes_this_step_;
  bytes_this_step_ = 0;
}

bool EngineImpl::amp_unscale_by_sub_group(torch::Tensor& g, int64_t base) {
  const std::vector<size_t> groups = stage3_sub_groups();
  bool found_inf = false;
  for (size_t k = 1; k < groups.size(); ++k) {
    const int64_t lo = std::max(offsets_[groups[k - 1]], base);
    const int64_t hi =
        std::min(groups[k] < offsets_.size() ? offsets_[groups[k]] : numel_, base + g.numel());
    bool inf = false;
    if (lo < hi) {
      auto piece = g.narrow(0, lo - base, hi - lo);
      inf = amp_scaler_->unscale(piece);
    }
    found_inf = found_inf || inf;
    amp_scaler_->update(inf);
  }
  return found_inf;
}

void EngineImpl::update_partition(const torch::Tensor& g) {
  ++opt_step_;
  PartitionOptimizer::StepArgs args;
  args.step = opt_step_;
  args.lr = lr();
  std::tie(args.beta1, args.beta2) = scheduler_.betas();
  args.scheduled = scheduler_.enabled();
  args.cycled_betas = optimizer_->client() && cycles_client_betas(config_, *optimizer_->client());
  // torch's OneCycleLR sets "momentum" on an optimizer without betas (SGD, RMSprop).
  if (config_.scheduler.type == "OneCycleLR" && scheduler_.cycles_momentum())
    args.momentum = scheduler_.momentum();
  args.offsets = &offsets_;
  args.numels = &numels_;
  args.base = policy_.update_offset(rank_, part_);
  args.sum_over_ranks = [this](torch::Tensor& t) { combine_step_scalar(t, ReduceOp::kSum); };
  optimizer_->step(update_target(), g, args);
  if (master_.defined()) own_params().copy_(master_);
}

void EngineImpl::report_progress() const {
  if (rank_ != 0 || (config_.log_level != "info" && config_.log_level != "debug")) return;
  const torch::optim::Optimizer* client = optimizer_->client();
  const std::string line = progress_line(config_, global_steps_, skipped_steps_,
                                         lr_list_text(config_, scheduler_, lr(), client != nullptr),
                                         mom_list_text(config_, scheduler_, client));
  if (!line.empty()) std::cout << line << std::endl;
}

void EngineImpl::reduce_to_owners(const torch::Tensor& full) {
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

void EngineImpl::all_gather_params() {
  // In place: every rank's partition into flat_params_ (its own is there already).
  auto flat = wire(flat_params_);
  CollectiveOptions o;
  o.group = group_;
  all_gather_into_tensor(flat, own_slice(flat), o);
  count(nbytes(flat_params_) * (world_ - 1) / world_);
}

MemoryUsage EngineImpl::memory() const {
  MemoryUsage m;
  // On a CPU-only run, "device" memory is CPU memory too: report what the module's device holds
  // as device, and what offload moved off it as CPU.
  auto put = [&](int64_t& dev, int64_t& cpu, const torch::Tensor& t, bool offloaded) {
    if (!t.defined()) return;
    (offloaded ? cpu : dev) += nbytes(t);
  };
  if (!policy_.parameters())
    put(m.params_device, m.params_cpu, flat_params_, false);
  else {
    put(m.params_device, m.params_cpu, param_part_, offload_param_);
    if (gathered_) put(m.params_device, m.params_cpu, flat_params_, false);
    if (fetch_) m.params_device += fetch_->held_bytes();
  }
  if (!policy_.gradients()) {
    put(m.grads_device, m.grads_cpu, flat_grads_, false);
    put(m.grads_device, m.grads_cpu, grad_acc_, false);
  } else {
    put(m.grads_device, m.grads_cpu, grad_part_, offload_opt_);
    m.grads_device += bucket_peak_bytes_;
  }
  put(m.optimizer_device, m.optimizer_cpu, master_, offload_opt_);
  for (auto& s : optimizer_->state()) put(m.optimizer_device, m.optimizer_cpu, s, offload_opt_);
  return m;
}

}  // namespace detail
}  // namespace dtrain::zero
