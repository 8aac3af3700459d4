// SyncBatchNorm: the math of torch.nn.modules._functions.SyncBatchNorm on CPU tensors.
//
// PyTorch's CUDA kernels (batch_norm_stats, batch_norm_gather_stats_with_counts, ...) have no
// CPU implementation in 1.13, so the same quantities are computed here with ATen CPU ops:
//   forward:  every rank contributes [sum x, sum x^2, count] per channel (one all_reduce);
//             mean = S1/n, var = S2/n - mean^2 (biased, for normalising), running_var gets
//             var * n/(n-1) (unbiased), exactly as batch_norm_gather_stats_with_counts does.
//   backward: every rank contributes [sum dy, sum dy*(x-mean)] per channel (one all_reduce);
//             dx = (dy - mean(dy) - (x-mean) * invstd^2 * mean(dy*(x-mean))) * invstd * weight,
//             as batch_norm_backward_elemt does. The weight/bias gradients stay local: DDP
//             all-reduces them like any other parameter gradient.
//
// Precision and speed. Nothing of the activations' size is converted to float64 (a float64
// copy of every activation, and float64 arithmetic over it, costs ~20x BatchNorm2d's whole
// step): the full-size passes run in the input's dtype, fused where ATen has a kernel for it,
// and only the per-channel reductions are combined in float64. S2/n - mean^2 would cancel
// catastrophically if S2 were a plain float32 sum of x^2 with |mean| >> std, so each rank
// first reduces around its own local mean m (a local two-pass: m = sum x / n, then sum (x-m)
// and sum (x-m)^2, whose terms do not cancel) and only then forms sum x = n m + sum (x-m) and
// sum x^2 = sum (x-m)^2 + 2 m sum (x-m) + n m^2 in float64. That is Chan et al.'s pairwise
// combination of per-rank (mean, M2), written as sums so that one all_reduce still carries
// everything (no extra collective for a global mean first); what cancels then cancels in
// float64 only.
#include "dtrain/sync_batch_norm.h"

#include <torch/csrc/autograd/custom_function.h>

#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "dtrain/error.h"

namespace dtrain {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::string shape_str(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

// Every dimension but the channel one (1): the per-channel statistics reduce over these.
std::vector<int64_t> reduce_dims(int64_t dim) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < dim; ++d) dims.push_back(d);
  return dims;
}

// Shape that broadcasts a per-channel (C) tensor against an input of rank `dim`.
std::vector<int64_t> channel_shape(int64_t channels, int64_t dim) {
  std::vector<int64_t> shape(static_cast<size_t>(dim), 1);
  shape[1] = channels;
  return shape;
}

// Sums `t` in place over the group. Called on the c10d group directly (not dtrain::all_reduce)
// so SyncBatchNorm depends only on the c10d interface; failures become dtrain's typed errors.
void all_reduce_sum(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, torch::Tensor& t,
                    const char* what) {
  std::vector<torch::Tensor> tensors{t};
  try {
    pg->allreduce(tensors)->wait();
  } catch (const std::exception& e) {
    std::string msg = std::string("SyncBatchNorm: the all_reduce of the ") + what +
                      " failed on rank " + std::to_string(pg->getRank()) + " of " +
                      std::to_string(pg->getSize()) +
                      " (every rank must run the same SyncBatchNorm forward/backward in the same "
                      "order): " +
                      e.what();
    if (std::string(e.what()).find("imed out") != std::string::npos) throw TimeoutError(msg);
    throw NetworkError(msg);
  }
}

// This rank's [sum x, sum x^2, count] per channel, as one float64 tensor of 2C+1 values (see
// the top of the file): full-size passes in the input's dtype around the local mean, combined
// in float64. Three cheap passes and one temporary (x - m, squared in place).
torch::Tensor local_moments(const torch::Tensor& input, const std::vector<int64_t>& dims,
                            const std::vector<int64_t>& cshape) {
  const int64_t channels = input.size(1);
  const double n = static_cast<double>(input.numel() / channels);
  const auto f64 = input.options().dtype(torch::kDouble);    // on the input's device (CPU or GPU)
  if (n == 0) return torch::zeros({2 * channels + 1}, f64);  // An empty rank adds nothing.
  const torch::Tensor m = input.sum(dims) / n;  // Input dtype: the shift the next passes use.
  torch::Tensor centred = input - m.view(cshape);
  const torch::Tensor sum_c = centred.sum(dims).to(torch::kDouble);             // sum (x-m): ~0
  const torch::Tensor sum_c2 = centred.square_().sum(dims).to(torch::kDouble);  // sum (x-m)^2
  const torch::Tensor m64 = m.to(torch::kDouble);
  return torch::cat(
      {m64 * n + sum_c, sum_c2 + 2 * m64 * sum_c + m64.square() * n, torch::full({1}, n, f64)});
}

// What the forward needs besides the differentiable inputs. Passed to Function::apply as a
// non-tensor argument, so autograd does not track the running statistics.
struct SyncConfig {
  torch::Tensor running_mean;  // Undefined: running statistics are not tracked.
  torch::Tensor running_var;
  double eps;
  double exponential_average_factor;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input_arg,
                               const c10::optional<torch::Tensor>& weight,
                               const c10::optional<torch::Tensor>& bias, const SyncConfig& config) {
    const torch::Tensor input = input_arg.contiguous();
    const int64_t channels = input.size(1);
    const auto dims = reduce_dims(input.dim());
    const auto cshape = channel_shape(channels, input.dim());

    // [sum, sum of squares, count] in one float64 tensor, so one all_reduce carries all three.
    // Unlike PyTorch's (mean, invstd, count) all_gather, sums add up correctly with unequal
    // counts.
    torch::Tensor combined = local_moments(input, dims, cshape);
    all_reduce_sum(config.group, combined, "batch statistics (sum, sum of squares, count)");

    const double count = combined[2 * channels].item<double>();
    if (count <= 1) {
      // Every rank sees the same global count, so every rank throws here: nobody is left
      // waiting in a collective.
      throw UsageError(
          "SyncBatchNorm: expected more than 1 value per channel across the group when "
          "training, got " +
          std::to_string(static_cast<int64_t>(count)) + " (this rank's input has shape " +
          shape_str(input) + ")");
    }
    const torch::Tensor mean = combined.narrow(0, 0, channels) / count;
    const torch::Tensor var =
        (combined.narrow(0, channels, channels) / count - mean.square()).clamp_min(0);
    const torch::Tensor invstd = (var + config.eps).rsqrt();

    if (config.running_mean.defined()) {
      const double m = config.exponential_average_factor;
      const torch::Tensor unbiased = var * (count / (count - 1));
      config.running_mean.copy_(config.running_mean.to(torch::kDouble) * (1 - m) + mean * m);
      config.running_var.copy_(config.running_var.to(torch::kDouble) * (1 - m) + unbiased * m);
    }

    // y = x * alpha + beta per channel, with alpha and beta formed in float64 and applied in
    // one vectorised pass by ATen's inference-mode batch_norm kernel: given running mean 0,
    // running var 1 and eps 0 it computes exactly x * weight + bias, here x * alpha + beta.
    torch::Tensor alpha = invstd;
    if (weight) alpha = alpha * weight->to(torch::kDouble);
    torch::Tensor beta = -mean * alpha;
    if (bias) beta = beta + bias->to(torch::kDouble);
    const auto opts = input.options();
    torch::Tensor output =
        torch::batch_norm(input, alpha.to(opts), beta.to(opts), torch::zeros({channels}, opts),
                          torch::ones({channels}, opts), /*training=*/false, /*momentum=*/0.0,
                          /*eps=*/0.0, /*cudnn_enabled=*/false);

    variable_list to_save{input, mean, invstd};
    if (weight) to_save.push_back(*weight);
    ctx->save_for_backward(std::move(to_save));
    ctx->saved_data["count"] = count;
    ctx->saved_data["has_weight"] = weight.has_value();
    ctx->saved_data["has_bias"] = bias.has_value();
    // c10d::ProcessGroup is a CustomClassHolder: a capsule keeps it alive until backward.
    ctx->saved_data["group"] = c10::IValue::make_capsule(config.group);
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& input = saved[0];
    const torch::Tensor& mean = saved[1];
    const torch::Tensor& invstd = saved[2];
    const bool has_weight = ctx->saved_data["has_weight"].toBool();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const torch::Tensor weight = has_weight ? saved[3] : torch::Tensor();
    const double count = ctx->saved_data["count"].toDouble();
    auto group = c10::static_intrusive_pointer_cast<c10d::ProcessGroup>(
        ctx->saved_data["group"].toCapsule());

    // Autograd edges exist only for the tensors actually passed: input, then weight and bias
    // when present.
    const bool needs_input = ctx->needs_input_grad(0);
    const bool needs_weight = has_weight && ctx->needs_input_grad(1);
    const bool needs_bias = has_bias && ctx->needs_input_grad(has_weight ? 2 : 1);

    const int64_t channels = input.size(1);
    const auto dims = reduce_dims(input.dim());
    const auto cshape = channel_shape(channels, input.dim());
    const auto opts = input.options();
    const torch::Tensor dy = grad_outputs[0].to(opts).contiguous();
    // The full-size passes centre x on the mean rounded to the input's dtype, mean_x; their
    // per-channel results are corrected in float64 for the rounding, delta = mean_x - mean,
    // which would otherwise be amplified by |mean| / std (sum dy*(x-mean) =
    // sum dy*(x-mean_x) + delta * sum dy).
    const torch::Tensor mean_x = mean.to(opts);
    const torch::Tensor delta = mean_x.to(torch::kDouble) - mean;
    torch::Tensor sum_dy, sum_dy_xmu;  // float64
    if (input.numel() == 0) {
      sum_dy = torch::zeros({channels}, input.options().dtype(torch::kDouble));
      sum_dy_xmu = torch::zeros({channels}, input.options().dtype(torch::kDouble));
    } else {
      // One fused pass over x and dy, no temporaries: ATen's training-mode BatchNorm backward
      // kernel asked only for grad_weight = sum(dy * (x - save_mean)) * save_invstd and
      // grad_bias = sum(dy), with save_invstd = 1. The weight (ones) changes neither, but
      // CUDA's kernel sizes grad_weight from it ("tensor does not have a device" without).
      const auto ones = torch::ones({channels}, opts);
      const auto sums =
          torch::native_batch_norm_backward(dy, input, /*weight=*/ones,
                                            /*running_mean=*/{},
                                            /*running_var=*/{}, /*save_mean=*/mean_x,
                                            /*save_invstd=*/ones,
                                            /*train=*/true, /*eps=*/0.0, {false, true, true});
      sum_dy = std::get<2>(sums).to(torch::kDouble);
      sum_dy_xmu = std::get<1>(sums).to(torch::kDouble) + delta * sum_dy;
    }

    torch::Tensor grad_input, grad_weight, grad_bias;
    // Local sums: the gradient of this rank's share of the loss, summed across ranks by DDP.
    if (needs_weight) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    if (needs_bias)
      grad_bias = sum_dy.to(weight.defined() ? weight.scalar_type() : input.scalar_type());

    if (needs_input) {
      torch::Tensor combined = torch::cat({sum_dy, sum_dy_xmu});
      all_reduce_sum(group, combined, "gradient sums (sum dy, sum dy*(x-mean))");
      const torch::Tensor mean_dy = combined.narrow(0, 0, channels) / count;
      const torch::Tensor mean_dy_xmu = combined.narrow(0, channels, channels) / count;
      torch::Tensor scale = invstd;
      if (has_weight) scale = scale * weight.to(torch::kDouble);
      const torch::Tensor k = invstd.square() * mean_dy_xmu;
      // (dy - (x - mean_x) * k - (mean_dy + delta*k)) * scale, in one full-size temporary
      // updated in place (the per-channel factors formed in float64). x - mean_x is formed
      // before any product and the three terms are summed before scaling, so a large |mean|
      // or |mean(dy)| does not cancel as it would in the expanded form x*a + dy*b + c.
      grad_input = input - mean_x.view(cshape);
      grad_input.mul_((-k).to(opts).view(cshape))
          .add_(dy)
          .sub_((mean_dy + delta * k).to(opts).view(cshape))
          .mul_(scale.to(opts).view(cshape));
    }
    // One entry per forward argument; the last is the non-tensor SyncConfig.
    return {grad_input, grad_weight, grad_bias, torch::Tensor()};
  }
};

// The group a training forward synchronises over: the configured one, else the default
// group, else none (then SyncBatchNorm is plain BatchNorm).
std::shared_ptr<ProcessGroup> resolve_group(const std::shared_ptr<ProcessGroup>& configured) {
  if (configured) return configured;
  try {
    return default_group();
  } catch (const UsageError&) {
    return nullptr;
  }
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const SyncBatchNormOptions& options_) : options(options_) {
  if (options.num_features < 1) {
    throw UsageError("SyncBatchNorm: num_features must be >= 1, got " +
                     std::to_string(options.num_features));
  }
  reset();
}

void SyncBatchNormImpl::reset() {
  // Registered exactly as torch::nn::BatchNorm registers them (names, dtypes, undefined
  // placeholders when disabled), so state dicts and optimizers treat both the same.
  const int64_t c = options.num_features;
  if (options.affine) {
    weight = register_parameter("weight", torch::ones({c}));
    bias = register_parameter("bias", torch::zeros({c}));
  } else {
    weight = register_parameter("weight", torch::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked =
        register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
  } else {
    running_mean = register_buffer("running_mean", torch::Tensor());
    running_var = register_buffer("running_var", torch::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", torch::Tensor());
  }
}

void SyncBatchNormImpl::reset_running_stats() {
  if (options.track_running_stats) {
    torch::NoGradGuard no_grad;
    running_mean.zero_();
    running_var.fill_(1);
    num_batches_tracked.zero_();
  }
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (options.affine) {
    torch::NoGradGuard no_grad;
    weight.fill_(1);
    bias.zero_();
  }
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  if (input.dim() < 2 || input.dim() > 4) {
    throw UsageError(
        "SyncBatchNorm: expected an input of shape (N, C), (N, C, L) or (N, C, H, W), got " +
        std::to_string(input.dim()) + "-D input of shape " + shape_str(input));
  }
  if (input.size(1) != options.num_features) {
    throw UsageError("SyncBatchNorm: expected " + std::to_string(options.num_features) +
                     " channels (dim 1), got input of shape " + shape_str(input));
  }

  // Same bookkeeping as torch::nn::BatchNorm's forward, so both count batches identically.
  double exponential_average_factor = options.momentum.value_or(0.0);
  if (is_training() && options.track_running_stats && num_batches_tracked.defined()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
    if (!options.momentum) exponential_average_factor = 1.0 / num_batches_tracked.item<double>();
  }

  if (is_training()) {
    auto group = resolve_group(options.group);
    if (group && group->world_size() > 1) {
      SyncConfig config{running_mean, running_var, options.eps, exponential_average_factor,
                        group->c10d()};
      auto opt = [](const torch::Tensor& t) {
        return t.defined() ? c10::optional<torch::Tensor>(t) : c10::nullopt;
      };
      return SyncBatchNormFunction::apply(input, opt(weight), opt(bias), config);
    }
  }
  // Nothing to synchronise (eval mode, or a group of one): exactly BatchNorm. In eval mode
  // without running statistics this normalises with the local batch's statistics, as
  // torch.nn.SyncBatchNorm does.
  namespace F = torch::nn::functional;
  return F::batch_norm(input, running_mean, running_var,
                       F::BatchNormFuncOptions()
                           .weight(weight)
                           .bias(bias)
                           .training(is_training() || !options.track_running_stats)
                           .momentum(exponential_average_factor)
                           .eps(options.eps));
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "dtrain::SyncBatchNorm(" << options.num_features << ", eps=" << options.eps
         << ", momentum=";
  if (options.momentum) {
    stream << *options.momentum;
  } else {
    stream << "None";
  }
  stream << ", affine=" << std::boolalpha << options.affine
         << ", track_running_stats=" << options.track_running_stats << ")";
}

// ---------------------------------------------------------------------------------------
// convert_sync_batchnorm

namespace {

bool is_container(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::SequentialImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::ModuleListImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&m) != nullptr;
}

bool is_convertible_bn(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) != nullptr;
}

std::string join_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// Throws before anything is modified, so a failed conversion leaves the model as it was.
void check_convertible(const torch::nn::Module& module, const std::string& path) {
  if (dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module) != nullptr) {
    throw UsageError("convert_sync_batchnorm: the BatchNorm3d at '" +
                     (path.empty() ? "<root>" : path) +
                     "' is not supported; dtrain::SyncBatchNorm takes inputs of rank 2 to 4 "
                     "(BatchNorm1d and BatchNorm2d)");
  }
  const bool container = is_container(module);
  for (const auto& child : module.named_children()) {
    const std::string child_path = join_path(path, child.key());
    if (!container && is_convertible_bn(*child.value())) {
      // The parent's forward calls its own member (a ModuleHolder field), which cannot be
      // re-pointed from outside; replacing the registered child would leave forward using
      // the old, unsynchronised BatchNorm.
      throw UsageError(
          "convert_sync_batchnorm: the BatchNorm at '" + child_path +
          "' is a member of the custom module " + module.name() +
          ", which C++ cannot swap from outside; construct dtrain::SyncBatchNorm there instead "
          "(it has the same parameters and buffers), or hold it in an nn::Sequential, "
          "nn::ModuleList or nn::ModuleDict");
    }
    check_convertible(*child.value(), child_path);
  }
}

template <typename BatchNormImpl>
SyncBatchNorm make_sync(const BatchNormImpl& bn, const std::shared_ptr<ProcessGroup>& group) {
  const auto& o = bn.options;
  SyncBatchNormOptions options(o.num_features());
  options.eps = o.eps();
  options.momentum = o.momentum() ? std::optional<double>(*o.momentum()) : std::nullopt;
  options.affine = o.affine();
  options.track_running_stats = o.track_running_stats();
  options.group = group;
  SyncBatchNorm sync(options);
  sync->train(bn.is_training());
  // Copies (not aliases) of the BatchNorm's tensors, keeping their dtype, device and
  // requires_grad; set_data keeps the registered parameter/buffer objects in place.
  torch::NoGradGuard no_grad;
  auto copy = [](torch::Tensor& dst, const torch::Tensor& src) {
    if (dst.defined() && src.defined()) dst.set_data(src.detach().clone());
  };
  copy(sync->weight, bn.weight);
  copy(sync->bias, bn.bias);
  copy(sync->running_mean, bn.running_mean);
  copy(sync->running_var, bn.running_var);
  copy(sync->num_batches_tracked, bn.num_batches_tracked);
  if (bn.weight.defined()) sync->weight.set_requires_grad(bn.weight.requires_grad());
  if (bn.bias.defined()) sync->bias.set_requires_grad(bn.bias.requires_grad());
  return sync;
}

// Old BatchNorm -> its replacement, so a BatchNorm registered in two places stays shared.
using Replacements = std::unordered_map<const torch::nn::Module*, SyncBatchNorm>;

// nullptr when `module` is not a BatchNorm1d/2d.
std::shared_ptr<SyncBatchNormImpl> replacement_for(const std::shared_ptr<torch::nn::Module>& module,
                                                   const std::shared_ptr<ProcessGroup>& group,
                                                   Replacements& done) {
  if (!is_convertible_bn(*module)) return nullptr;
  auto it = done.find(module.get());
  if (it != done.end()) return it->second.ptr();
  SyncBatchNorm sync = nullptr;
  if (auto bn1 = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(module)) {
    sync = make_sync(*bn1, group);
  } else {
    sync = make_sync(*std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(module), group);
  }
  done.emplace(module.get(), sync);
  return sync.ptr();
}

// Replaces the BatchNorms held by containers in place (the container objects stay the same,
// so a custom module's Sequential member sees the change) and recurses everywhere else.
void convert_in_place(torch::nn::Module& module, const std::shared_ptr<ProcessGroup>& group,
                      Replacements& done) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&module)) {
    // Sequential runs its AnyModule list, not its registered children: replace both.
    const auto names = seq->named_children().keys();
    auto it = seq->begin();
    for (size_t i = 0; i < names.size(); ++i, ++it) {
      if (auto sync = replacement_for(it->ptr(), group, done)) {
        *it = torch::nn::AnyModule(sync);
        seq->replace_module(names[i], sync);
      }
    }
  } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&module)) {
    auto it = list->begin();
    for (size_t i = 0; i < list->size(); ++i, ++it) {
      if (auto sync = replacement_for(*it, group, done)) {
        *it = sync;
        list->replace_module(std::to_string(i), sync);
      }
    }
  } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&module)) {
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> updates;
    for (const auto& item : *dict) {
      if (auto sync = replacement_for(item.value(), group, done))
        updates.emplace_back(item.key(), sync);
    }
    dict->update(updates);  // Overwrites existing keys in place, keeping their order.
  }
  for (const auto& child : module.children()) {
    if (dynamic_cast<SyncBatchNormImpl*>(child.get()) == nullptr)
      convert_in_place(*child, group, done);
  }
}

}  // namespace

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          std::shared_ptr<ProcessGroup> group) {
  if (!module) throw UsageError("convert_sync_batchnorm: module is null");
  check_convertible(*module, "");
  Replacements done;
  if (auto sync = replacement_for(module, group, done)) return sync;
  convert_in_place(*module, group, done);
  return module;
}

torch::nn::Sequential convert_sync_batchnorm(torch::nn::Sequential module,
                                             std::shared_ptr<ProcessGroup> group) {
  if (module.is_empty()) throw UsageError("convert_sync_batchnorm: the Sequential is null");
  convert_sync_batchnorm(std::static_pointer_cast<torch::nn::Module>(module.ptr()),
                         std::move(group));
  return module;
}

std::shared_ptr<torch::nn::SequentialImpl> convert_sync_batchnorm(
    std::shared_ptr<torch::nn::SequentialImpl> module, std::shared_ptr<ProcessGroup> group) {
  if (!module) throw UsageError("convert_sync_batchnorm: module is null");
  convert_sync_batchnorm(std::static_pointer_cast<torch::nn::Module>(module), std::move(group));
  return module;
}

}  // namespace dtrain
