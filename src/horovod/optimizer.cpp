// hvd::DistributedOptimizer: a gradient hook per parameter submits its named allreduce as soon
// as backward produced it; the background thread fuses and reduces; step() waits.

#include <set>

#include "dtrain/error.h"
#include "dtrain/horovod.h"
#include "parallel/grad_hooks.h"

namespace dtrain::hvd {

namespace {

std::vector<std::pair<std::string, torch::Tensor>> to_vector(
    const torch::OrderedDict<std::string, torch::Tensor>& d) {
  std::vector<std::pair<std::string, torch::Tensor>> v;
  for (const auto& item : d) v.emplace_back(item.key(), item.value());
  return v;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(
    torch::optim::Optimizer& optimizer,
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    DistributedOptimizerOptions options)
    : DistributedOptimizer(optimizer, to_vector(named_parameters), options) {}

DistributedOptimizer::DistributedOptimizer(
    torch::optim::Optimizer& optimizer,
    const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
    DistributedOptimizerOptions options)
    : optimizer_(optimizer), options_(options) {
  if (!is_initialized()) {
    throw UsageError(
        "hvd::DistributedOptimizer: hvd is not initialized; call dtrain::hvd::init() first");
  }
  if (options_.backward_passes_per_step < 1) {
    throw UsageError("hvd::DistributedOptimizer: backward_passes_per_step must be >= 1, got " +
                     std::to_string(options_.backward_passes_per_step));
  }
  if (options_.op == ReduceOp::Adasum) {
    const int n = size();
    if (n & (n - 1)) {
      throw UsageError(
          "hvd::DistributedOptimizer: op Adasum runs on a power-of-2 number of ranks only, as "
          "Horovod's; this job has " +
          std::to_string(n) + " ranks (use hvd::Average, or 1, 2, 4, 8... ranks)");
    }
    if (options_.gradient_predivide_factor != 1.0) {
      throw UsageError(
          "hvd::DistributedOptimizer: gradient_predivide_factor must be 1 with op Adasum (as in "
          "Horovod)");
    }
  } else if (options_.op != ReduceOp::Average && options_.op != ReduceOp::Sum) {
    throw UsageError("hvd::DistributedOptimizer: op must be hvd::Average, hvd::Sum or hvd::Adasum");
  }
  if (!(options_.gradient_predivide_factor > 0)) {
    throw UsageError("hvd::DistributedOptimizer: gradient_predivide_factor must be > 0, got " +
                     std::to_string(options_.gradient_predivide_factor));
  }
  if (options_.gradient_predivide_factor != 1.0 && options_.op != ReduceOp::Average) {
    throw UsageError(
        "hvd::DistributedOptimizer: gradient_predivide_factor only applies with op hvd::Average");
  }
  std::set<std::string> seen;
  for (const auto& [name, p] : named_parameters) {
    if (!seen.insert(name).second) {
      throw UsageError("hvd::DistributedOptimizer: parameter name '" + name +
                       "' appears twice in named_parameters; names must be unique (they pair "
                       "requests across ranks)");
    }
    if (!p.requires_grad()) continue;
    names_.push_back(name);
    params_.push_back(p);
  }
  // Parameters the optimizer updates but named_parameters lacks would step unreduced.
  std::set<const void*> named;
  for (const auto& p : params_) named.insert(p.unsafeGetTensorImpl());
  for (const auto& group : optimizer_.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.requires_grad() && !named.count(p.unsafeGetTensorImpl())) {
        throw UsageError(
            "hvd::DistributedOptimizer: the optimizer holds a parameter of shape " +
            c10::str(p.sizes()) +
            " that named_parameters does not name; pass model->named_parameters() of the model the "
            "optimizer trains");
      }
    }
  }
  passes_left_.assign(params_.size(), options_.backward_passes_per_step);
  handles_.assign(params_.size(), -1);
  // Adasum combines parameter deltas after the local step (in synchronize()): no gradient hooks.
  if (options_.op != ReduceOp::Adasum) install_hooks();
}

DistributedOptimizer::~DistributedOptimizer() {
  dtrain::detail::remove_grad_hooks(hooks_);
  // Reductions still in flight write into gradients that outlive us: let them finish.
  for (auto h : handles_) {
    if (h < 0) continue;
    try {
      hvd::synchronize(h);
    } catch (...) {
      // A destructor must not throw; the failure already reached whoever else waits.
    }
  }
}

void DistributedOptimizer::install_hooks() {
  // The accumulator's post hook runs once .grad holds this pass's sum, which is what
  // Horovod's hook on the accumulator sees too (a tensor hook would see the pass alone).
  dtrain::detail::add_grad_ready_hooks(
      params_, names_, [this](size_t i) { on_gradient(i); }, hooks_);
}

void DistributedOptimizer::on_gradient(size_t i) {
  if (handles_[i] >= 0) {
    throw UsageError("hvd::DistributedOptimizer: the gradient of '" + names_[i] +
                     "' was computed more than " + "backward_passes_per_step (" +
                     std::to_string(options_.backward_passes_per_step) +
                     ") times before step(); call step() (or synchronize()) after every " +
                     std::to_string(options_.backward_passes_per_step) +
                     " backward pass(es), or raise backward_passes_per_step");
  }
  if (--passes_left_[i] == 0) submit(i);
}

void DistributedOptimizer::submit(size_t i) {
  torch::Tensor& p = params_[i];
  if (!p.grad().defined())
    p.mutable_grad() = torch::zeros_like(p);  // a parameter backward did not reach
  AllreduceOptions o;
  o.name = "DistributedOptimizer.allreduce." + names_[i];
  o.op = options_.op;
  o.compression = options_.compression;
  if (options_.op == ReduceOp::Average && options_.gradient_predivide_factor != 1.0) {
    // Divide by f before the sum, by size/f after it: the same average, split for range.
    o.prescale_factor = 1.0 / options_.gradient_predivide_factor;
    o.postscale_factor = options_.gradient_predivide_factor;
  }
  torch::Tensor grad = p.grad();
  handles_[i] = allreduce_async_(grad, o);
}

void DistributedOptimizer::adasum_synchronize() {
  // Horovod's Adasum optimizer: every rank steps its own optimizer (its own state, e.g.
  // momentum) on its own gradients; the parameter deltas are combined with Adasum; every rank
  // then holds start + adasum(delta_0, ..., delta_{n-1}).
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> start;
  for (auto& p : params_) start.push_back(p.detach().clone());
  optimizer_.step();
  std::vector<torch::Tensor> deltas;
  std::vector<Handle> handles;
  for (size_t i = 0; i < params_.size(); ++i) {
    deltas.push_back(params_[i].detach() - start[i]);
    AllreduceOptions o;
    o.name = "DistributedOptimizer.adasum." + names_[i];
    o.op = ReduceOp::Adasum;
    o.compression = options_.compression;
    handles.push_back(allreduce_async_(deltas.back(), o));
  }
  std::exception_ptr first_error;
  for (size_t i = 0; i < params_.size(); ++i) {
    try {
      torch::Tensor combined = hvd::synchronize(handles[i]);
      params_[i].detach().copy_(start[i] + combined);
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

void DistributedOptimizer::synchronize() {
  if (options_.op == ReduceOp::Adasum) {
    adasum_synchronize();
    synchronized_ = true;
    return;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (handles_[i] < 0) submit(i);
  }
  std::exception_ptr first_error;
  for (size_t i = 0; i < params_.size(); ++i) {
    try {
      hvd::synchronize(handles_[i]);
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
    handles_[i] = -1;
    passes_left_[i] = options_.backward_passes_per_step;
  }
  if (first_error) std::rethrow_exception(first_error);
  synchronized_ = true;
}

void DistributedOptimizer::step() {
  if (options_.op == ReduceOp::Adasum) {
    // The local step is part of the Adasum synchronization (as in Horovod).
    if (!(skip_ && synchronized_)) synchronize();
    synchronized_ = false;
    return;
  }
  if (!(skip_ && synchronized_)) synchronize();
  optimizer_.step();
  synchronized_ = false;
}

void DistributedOptimizer::zero_grad() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (handles_[i] >= 0) {
      throw UsageError(
          "hvd::DistributedOptimizer::zero_grad() was called after backward but before step() or "
          "synchronize(): the gradient of '" +
          names_[i] + "' is being reduced; call step() first");
    }
  }
  optimizer_.zero_grad();
}

}  // namespace dtrain::hvd
