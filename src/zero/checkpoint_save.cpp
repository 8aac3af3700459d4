// ZeRO checkpoints in DeepSpeed's layout, written atomically, loadable at another world size.
// The layout, DeepSpeed's and dtrain's:
//   DIR/latest                                       the tag, e.g. "global_step100"
//   DIR/TAG/mp_rank_00_model_states.pt               rank 0: the module (full), steps, scheduler
//                                                    (stage 3: zero_pp_rank_<r>_mp_rank_00_
//                                                    model_states.pt per rank, rank 0's whole)
//   DIR/TAG/zero_pp_rank_<r>_mp_rank_00_optim_states.pt   rank r: its part of the fp32 master
//                                                    parameters and of the optimizer state
// Files are torch.save zips of dicts (src/zero/pickle.h): Python's torch.load reads them with
// weights_only=True, and DeepSpeed's zero_to_fp32 reads them (the model file carries
// DeepSpeed's param_shapes, buffer_names and shared_params; each optimizer file its
// single_partition_of_fp32_groups at stages 1-2, fp32_flat_groups at stage 3). At stages 0-2
// rank r's optimizer file holds the elements [r*P, min((r+1)*P, numel)) of the flat (unpadded)
// parameter order (stages 1-2: the padded partition, as DeepSpeed's); at stage 3 DeepSpeed's
// per-parameter pieces (zero/stage3_layout.h). A load (at any world size) opens the files
// without reading them whole and reads into each rank only the elements it holds now
// (load_own_part). DeepSpeed's own files of stages 1-3 are read so too when they hold the
// engine's parameters (in any order: each placed by name) and one parameter group
// (why_not_streamed); the others, stage 0's and a client optimizer's state are read whole.
// DeepSpeed's own checkpoints of stages 1-3 are read too (consolidated_state_dict, and
// load_checkpoint for the parameters, steps, scheduler and optimizer state).
//
// This file: the engine's state out (save_checkpoint, save_16bit_model, and the DeepSpeed keys
// of the model and optimizer files); checkpoint_load.cpp reads it back.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "dtrain/checkpoint.h"
#include "dtrain/zero.h"
#include "zero/checkpoint_files.h"
#include "zero/client_state.h"
#include "zero/engine_impl.h"
#include "zero/pickle.h"
#include "zero/stage3_fetch.h"
#include "zero/stage3_layout.h"
#include "zero/torch_schedulers.h"

namespace dtrain::zero::detail {

using namespace ckpt;

IValue EngineImpl::model_state(bool build) {
  torch::NoGradGuard ng;
  const int64_t bytes_before = bytes_this_step_;
  // Stage 3 gathers the module (collective), then releases it again.
  const bool was_gathered = gathered_;
  if (policy_.parameters() && !gathered_) gather_parameters();
  IValue out;
  if (build) out = model_dict(true);
  if (policy_.parameters() && !was_gathered) release_parameters();
  bytes_this_step_ = bytes_before;
  return out;
}

IValue EngineImpl::model_dict(bool parameters) {
  torch::NoGradGuard ng;
  auto d = new_dict();
  c10::Dict<std::string, torch::Tensor> module_dict;
  for (auto& item : module_.named_parameters(true))
    module_dict.insert(item.key(), parameters ? item.value().detach().clone()
                                              : torch::empty({0}, item.value().options()));
  for (auto& item : module_.named_buffers(true))
    if (item.value().defined()) module_dict.insert(item.key(), item.value().detach().clone());
  d.insert("module", module_dict);
  // DeepSpeed's buffer_names: the module's buffers (libtorch's are all persistent), which its
  // zero_to_fp32 takes from the module as saved.
  c10::List<std::string> buffer_names;
  for (auto& item : module_.named_buffers(true))
    if (item.value().defined()) buffer_names.push_back(item.key());
  d.insert("buffer_names", buffer_names);
  c10::List<std::string> names;
  c10::List<c10::List<int64_t>> shapes;
  for (size_t i = 0; i < params_.size(); ++i) {
    names.push_back(names_[i]);
    shapes.push_back(c10::List<int64_t>(shapes_[i]));
  }
  d.insert("param_names", names);
  d.insert("param_shapes", shapes);
  d.insert("global_steps", global_steps_);
  d.insert("skipped_steps", skipped_steps_);
  d.insert("global_samples", global_samples_);
  if (config_.scheduler.is_torch()) {  // torch's lr_scheduler.state_dict(), as DeepSpeed saves it
    const auto* client = optimizer_->client();
    const bool betas = client ? dynamic_cast<const torch::optim::SGD*>(client) == nullptr &&
                                    dynamic_cast<const torch::optim::RMSprop*>(client) == nullptr
                              : detail::optimizer_has_betas(config_.optimizer);
    d.insert("lr_scheduler",
             detail::torch_scheduler_state_dict(config_.scheduler, scheduler_, betas));
  } else {
    auto sched = new_dict();
    sched.insert("last_batch_iteration", scheduler_.last_batch_iteration());
    d.insert("lr_scheduler", sched);
  }
  d.insert("loss_scaler", c10::List<double>(scaler_.state()));
  d.insert("dp_world_size", static_cast<int64_t>(world_));
  d.insert("mp_world_size", static_cast<int64_t>(1));
  d.insert("zero_stage", static_cast<int64_t>(config_.zero.stage));
  d.insert("ds_config", config_.raw.dump());
  d.insert("ds_version", std::string("dtrain-zero-2"));
  return d;
}

std::set<std::string> EngineImpl::frozen_names() const {
  const std::set<std::string> own(names_.begin(), names_.end());
  std::set<std::string> out;
  for (const auto& item : module_.named_parameters(true))
    if (!own.count(item.key())) out.insert(item.key());
  return out;
}

PyPtr EngineImpl::deepspeed_model_file_of(const IValue& model,
                                          const SaveCheckpointOptions& opts) const {
  if (!opts.exclude_frozen_parameters)
    return with_client_state(deepspeed_model_file(model, deepspeed_frozen_params()),
                             opts.client_state);
  // DeepSpeed's exclude_frozen_parameters: no frozen parameter in the module, no fragments.
  auto file =
      with_client_state(deepspeed_model_file(model, {py_none(), py_none()}), opts.client_state);
  const auto frozen = frozen_names();
  for (auto& [k, v] : file->dict) {
    if (k->s != "module") continue;
    auto& entries = v->dict;
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [&](const auto& e) { return frozen.count(e.first->s) > 0; }),
                  entries.end());
  }
  return file;
}

std::pair<PyPtr, PyPtr> EngineImpl::deepspeed_frozen_params() const {
  if (config_.zero.stage < 2) return {py_none(), py_none()};
  const auto frozen = frozen_names();
  auto shapes = py_dict(/*ordered=*/true), fragments = py_dict(/*ordered=*/true);
  for (const auto& item : module_.named_parameters(true)) {
    if (!frozen.count(item.key())) continue;
    const torch::Tensor p = item.value().detach();
    py_set(shapes, item.key(), py_size(p.sizes().vec()));
    if (!policy_.parameters()) {
      py_set(fragments, item.key(), py_tensor(p.to(torch::kCPU).contiguous()));
      continue;
    }
    const int64_t n = p.numel(), part = per_parameter_part(n, world_);
    const int64_t from = std::min<int64_t>(n, rank_ * part), len = std::min(part, n - from);
    auto piece = torch::zeros({part}, p.options().device(torch::kCPU));
    if (len > 0) piece.narrow(0, 0, len).copy_(p.reshape({-1}).narrow(0, from, len));
    py_set(fragments, item.key(), py_tensor(piece));
  }
  return {shapes, fragments};
}

// The optimizer class DeepSpeed builds for this config keeps its param group with these keys
// (torch's load_state_dict replaces the group with the saved one, so a key left out would be
// missing at its step); lr and betas are the next step's.
PyPtr EngineImpl::deepspeed_param_group(std::vector<PyPtr> params) const {
  const auto& opt = config_.optimizer;
  const bool adam = opt.type == "Adam" || opt.type == "AdamW";
  const bool torch_adam = adam && opt.torch_adam;
  const bool cpu_adam = adam && !torch_adam && config_.zero.offload_optimizer.enabled();
  const auto [beta1, beta2] = scheduler_.betas();
  auto group = py_dict();
  auto set = [&](const char* key, PyPtr v) { py_set(group, key, std::move(v)); };
  auto adam_keys = [&] {
    set("betas", py_tuple({py_float(beta1), py_float(beta2)}));
    set("eps", py_float(opt.eps));
    set("weight_decay", py_float(opt.weight_decay));
  };
  set("lr", py_float(lr()));
  if (opt.type == "Lion") {  // DeepSpeedCPULion, or FusedLion (which adds "step": 0 to it)
    set("betas", py_tuple({py_float(beta1), py_float(beta2)}));
    set("weight_decay", py_float(opt.weight_decay));
    if (!config_.zero.offload_optimizer.enabled()) set("step", py_int(0));
  } else if (opt.type == "Adagrad" && config_.zero.offload_optimizer.enabled()) {
    // DeepSpeedCPUAdagrad
    set("eps", py_float(opt.eps));
    set("weight_decay", py_float(opt.weight_decay));
    set("amsgrad", py_bool(false));
  } else if (opt.type == "Adagrad") {  // torch.optim.Adagrad
    set("lr_decay", py_float(opt.lr_decay));
    set("eps", py_float(opt.eps));
    set("weight_decay", py_float(opt.weight_decay));
    set("initial_accumulator_value", py_float(opt.initial_accumulator_value));
    set("foreach", py_none());
    set("maximize", py_bool(false));
    set("differentiable", py_bool(false));
    set("fused", py_none());
  } else if (opt.type == "RMSprop") {  // torch.optim.RMSprop
    set("momentum", py_float(scheduler_.cycles_momentum() ? scheduler_.momentum() : opt.momentum));
    set("alpha", py_float(opt.alpha));
    set("eps", py_float(opt.eps));
    set("centered", py_bool(opt.centered));
    set("weight_decay", py_float(opt.weight_decay));
    set("capturable", py_bool(false));
    set("foreach", py_none());
    set("maximize", py_bool(false));
    set("differentiable", py_bool(false));
  } else if (opt.type == "SGD") {  // torch.optim.SGD
    set("momentum", py_float(config_.scheduler.type == "OneCycleLR" && scheduler_.cycles_momentum()
                                 ? scheduler_.momentum()
                                 : opt.momentum));
    set("dampening", py_float(opt.dampening));
    set("weight_decay", py_float(opt.weight_decay));
    set("nesterov", py_bool(opt.nesterov));
    set("maximize", py_bool(false));
    set("foreach", py_none());
    set("differentiable", py_bool(false));
    set("fused", py_none());
  } else if (torch_adam) {  // torch.optim.Adam(W)
    adam_keys();
    set("amsgrad", py_bool(false));
    set("maximize", py_bool(false));
    set("foreach", py_none());
    set("capturable", py_bool(false));
    set("differentiable", py_bool(false));
    set("fused", py_none());
    set("decoupled_weight_decay", py_bool(opt.type == "AdamW" || opt.adam_w_mode));
  } else if (cpu_adam) {  // DeepSpeedCPUAdam
    adam_keys();
    set("bias_correction", py_bool(opt.bias_correction));
    set("amsgrad", py_bool(false));
  } else {  // FusedAdam, FusedLamb
    set("bias_correction", py_bool(opt.bias_correction));
    adam_keys();
    if (opt.type == "Lamb") {
      set("max_grad_norm", py_float(0.0));
      set("max_coeff", py_float(opt.max_coeff));
      set("min_coeff", py_float(opt.min_coeff));
    } else {
      set("step", py_int(0));
    }
  }
  // torch.optim.lr_scheduler's keys in the group (its get_lr() reads them after a load).
  if (config_.scheduler.is_torch())
    for (const auto& [key, value] :
         detail::torch_scheduler_group_values(config_.scheduler, scheduler_))
      set(key.c_str(), py_float(value));
  py_set(group, "params", py_list(std::move(params)));
  return group;
}

// FusedAdam, FusedLamb and the CPU optimizers count steps in a Python int, torch.optim.Adam(W)
// and torch.optim.Adagrad in a float tensor; SGD keeps no step.
PyPtr EngineImpl::deepspeed_param_state(
    const std::vector<std::pair<std::string, torch::Tensor>>& tensors) const {
  const auto& opt = config_.optimizer;
  const bool tensor_step = ((opt.type == "Adam" || opt.type == "AdamW") && opt.torch_adam) ||
                           (opt.type == "Adagrad" && !config_.zero.offload_optimizer.enabled()) ||
                           opt.type == "RMSprop";
  auto state = py_dict();
  if (opt.type != "SGD")
    py_set(
        state, "step",
        tensor_step ? py_tensor(torch::tensor(static_cast<float>(opt_step_))) : py_int(opt_step_));
  for (const auto& [name, t] : tensors) py_set(state, name, py_tensor(t));
  return state;
}

// What DeepSpeed 0.19.8's CreateLossScaler makes (fp16/loss_scaler.py), with this engine's
// values: DynamicLossScaler under fp16 with dynamic scaling, else LossScaler (the static scale,
// 1.0 without fp16). Each with the attributes its __init__ sets, in that order.
PyPtr EngineImpl::deepspeed_loss_scaler() const {
  const auto s = scaler_.state();  // scale, iteration, last overflow iteration, hysteresis
  auto d = py_dict();
  const char* cls = "deepspeed.runtime.fp16.loss_scaler.LossScaler";
  if (config_.fp16.enabled && scaler_.dynamic()) {
    cls = "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler";
    const auto& f = config_.fp16;
    py_set(d, "cur_scale", py_float(s[0]));
    py_set(d, "dynamic", py_bool(true));
    py_set(d, "cur_iter", py_int(static_cast<int64_t>(s[1])));
    py_set(d, "last_overflow_iter", py_int(static_cast<int64_t>(s[2])));
    py_set(d, "scale_factor", py_float(2.0));
    py_set(d, "scale_window", py_int(f.loss_scale_window));
    py_set(d, "min_scale", py_float(f.min_loss_scale));
    py_set(d, "delayed_shift", py_int(f.hysteresis));
    py_set(d, "cur_hysteresis", py_int(static_cast<int64_t>(s[3])));
    py_set(d, "consecutive_hysteresis", py_bool(f.consecutive_hysteresis));
    py_set(d, "raise_error_at_min_scale", py_bool(true));
    py_set(d, "dtype", py_global("torch.float16"));
  } else {
    py_set(d, "cur_scale", py_float(config_.fp16.enabled ? s[0] : 1.0));
    py_set(d, "dynamic", py_bool(false));
  }
  return py_object(cls, d);
}

// The base optimizer's state_dict over `params` with `states`, and the keys both of DeepSpeed's
// ZeRO optimizers write beside it into `o`. The state is there now: dtrain's own copy of it
// ("state") goes from `o` (its reader takes it from the base optimizer's), so the file holds it
// once.
PyPtr EngineImpl::deepspeed_base_optimizer(const PyPtr& o, PyPtr states, std::vector<PyPtr> params,
                                           bool loss_scaler) const {
  auto base = py_dict();
  py_set(base, "state", std::move(states));
  py_set(base, "param_groups", py_list({deepspeed_param_group(std::move(params))}));
  o->dict.erase(std::remove_if(o->dict.begin(), o->dict.end(),
                               [](const auto& e) { return e.first->s == "state"; }),
                o->dict.end());
  if (loss_scaler) py_set(o, "loss_scaler", deepspeed_loss_scaler());
  py_set(o, "dynamic_loss_scale", py_bool(scaler_.dynamic()));
  py_set(o, "overflow", py_bool(false));
  return base;
}

// DeepSpeed's own keys of a stage 1/2 optimizer file (stage_1_and_2.py's state_dict), so that
// DeepSpeed's engine resumes this checkpoint as its own: the base optimizer's state_dict as the
// optimizer class DeepSpeed builds for this config keeps it (its param group restores the
// learning rate and betas of the next step), the fp32 partition, the version its loader checks.
// Its loss scaler object only when asked for: without it DeepSpeed keeps the scaler it was built
// with (its loader asks for the key with a default), and the files stay loadable by
// torch.load(weights_only=True). `o`: this rank's optimizer_state_dict.
void EngineImpl::add_deepspeed_optimizer_keys(const PyPtr& o, bool loss_scaler) const {
  // The state of the one flat parameter (this rank's padded partition).
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  const auto names = optimizer_->state_names();
  const auto& state = optimizer_->state();
  for (size_t k = 0; k < state.size(); ++k)
    tensors.emplace_back(names[k], state[k].to(torch::kCPU, master_dtype_));
  auto states = py_dict();
  states->dict.push_back({py_int(0), deepspeed_param_state(tensors)});
  auto base = deepspeed_base_optimizer(o, states, {py_int(0)}, loss_scaler);
  py_set(o, "clip_grad", py_float(config_.gradient_clipping));
  py_set(o, "base_optimizer_state", base);
  // The last rank's partition holds the padding (DeepSpeed's groups_padding).
  py_set(o, "group_paddings", py_list({py_int(rank_ == world_ - 1 ? padded_ - numel_ : 0)}));
  py_set(o, "ds_version", py_str(kDeepSpeedVersion));
}

std::vector<size_t> EngineImpl::stage3_sub_groups() const {
  std::vector<size_t> first = {0};
  int64_t acc = 0;
  for (size_t i = 0; i < numels_.size(); ++i) {
    acc += per_parameter_part(numels_[i], world_);
    if (acc >= config_.zero.sub_group_size || i + 1 == numels_.size()) {
      first.push_back(i + 1);
      acc = 0;
    }
  }
  return first;
}

// Stage 3: DeepSpeed cuts each rank's per-parameter pieces into sub-groups
// (stage3_sub_groups), keeps one fp32 flat tensor per sub-group (fp32_flat_groups) and its
// base optimizer holds one parameter per sub-group. `o` holds the master as one flat group and
// dtrain's "state" in the per-parameter layout (optim_dict(true)); both are cut the same way,
// and the state moves into the base optimizer's state_dict, which dtrain's reader takes it from.
void EngineImpl::add_deepspeed_stage3_keys(const PyPtr& o, bool loss_scaler) const {
  std::vector<int64_t> cuts = {0};  // sub-group boundaries in the per-parameter flat group
  const std::vector<size_t> sub_groups = stage3_sub_groups();
  for (size_t g = 1; g < sub_groups.size(); ++g) {
    int64_t at = cuts.back();
    for (size_t i = sub_groups[g - 1]; i < sub_groups[g]; ++i)
      at += per_parameter_part(numels_[i], world_);
    cuts.push_back(at);
  }
  auto cut = [&](const torch::Tensor& flat) {
    std::vector<torch::Tensor> out;
    for (size_t g = 0; g + 1 < cuts.size(); ++g)
      out.push_back(flat.narrow(0, cuts[g], cuts[g + 1] - cuts[g]));
    return out;
  };
  PyPtr flat_groups, state;
  for (auto& [k, v] : o->dict) {
    if (k->s == "fp32_flat_groups") flat_groups = v;
    if (k->s == "state") state = v;
  }
  if (!flat_groups || flat_groups->items.size() != 1 || !state)
    throw InternalError("zero save_checkpoint: stage 3's optimizer dict is not optim_dict's");
  std::vector<PyPtr> groups;
  for (auto& t : cut(flat_groups->items[0]->tensor)) groups.push_back(py_tensor(t));
  flat_groups->items = groups;
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> per_group(cuts.size() - 1);
  for (const auto& [name, t] : state->dict) {
    auto pieces = cut(t->tensor);
    for (size_t g = 0; g < pieces.size(); ++g) per_group[g].emplace_back(name->s, pieces[g]);
  }
  auto states = py_dict();
  std::vector<PyPtr> params;
  for (size_t g = 0; g < per_group.size(); ++g) {
    states->dict.push_back({py_int(static_cast<int64_t>(g)), deepspeed_param_state(per_group[g])});
    params.push_back(py_int(static_cast<int64_t>(g)));
  }
  py_set(o, "optimizer_state_dict",
         deepspeed_base_optimizer(o, states, std::move(params), loss_scaler));
}

// Stage 0 in fp32: DeepSpeed steps its basic optimizer (FusedAdam, DeepSpeedCPUAdam with
// offload_optimizer, torch.optim's, ...) on the module's parameters, and saves its state_dict as
// the model file's "optimizer": each parameter's state (its slice of the flat state here) keyed
// by its index in the one param group.
PyPtr EngineImpl::deepspeed_stage0_optimizer() const {
  const auto names = optimizer_->state_names();
  const auto& state = optimizer_->state();
  auto states = py_dict();
  std::vector<PyPtr> params;
  for (size_t i = 0; i < numels_.size(); ++i) {
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    for (size_t k = 0; k < state.size(); ++k)
      tensors.emplace_back(names[k], state[k]
                                         .narrow(0, offsets_[i], numels_[i])
                                         .view(shapes_[i])
                                         .to(torch::kCPU, master_dtype_, false, true));
    const auto index = static_cast<int64_t>(i);
    states->dict.push_back({py_int(index), deepspeed_param_state(tensors)});
    params.push_back(py_int(index));
  }
  auto o = py_dict();
  py_set(o, "state", states);
  py_set(o, "param_groups", py_list({deepspeed_param_group(std::move(params))}));
  return o;
}

// DeepSpeed 0.19.8 wraps the basic optimizer at stage 0 under fp16 or bf16
// (engine._configure_fp16_optimizer): FusedAdam in FP16_Optimizer (fused_optimizer.py), anything
// else - its CPU optimizers with offload_optimizer, torch.optim's, FusedLion - in
// FP16_UnfusedOptimizer (unfused_optimizer.py). Their state_dicts as they write them: the loss
// scale keys (FP16_Optimizer only with fp16's grad scaling), the basic optimizer's state_dict,
// and the fp32 master.
PyPtr EngineImpl::deepspeed_stage0_wrapper() const {
  const auto& opt = config_.optimizer;
  const bool fused = (opt.type == "Adam" || opt.type == "AdamW") && !opt.torch_adam &&
                     !config_.zero.offload_optimizer.enabled();
  const bool fp16 = config_.fp16.enabled;
  const auto s = scaler_.state();  // scale, iteration, last overflow iteration, hysteresis
  auto o = py_dict();
  if (fp16 || !fused) {
    const bool dynamic = fp16 && scaler_.dynamic();
    py_set(o, "dynamic_loss_scale", py_bool(dynamic));
    py_set(o, "cur_scale", py_float(fp16 ? s[0] : 1.0));
    // The wrapper counts every step() (skipped ones too); dtrain's scaler does under fp16.
    py_set(o, "cur_iter", py_int(fp16 ? static_cast<int64_t>(s[1]) : global_steps_));
    if (dynamic) {
      py_set(o, "last_overflow_iter", py_int(static_cast<int64_t>(s[2])));
      py_set(o, "scale_factor", py_float(2.0));
      py_set(o, "scale_window", py_int(config_.fp16.loss_scale_window));
    }
  }
  const torch::Tensor w = update_target().to(torch::kCPU, master_dtype_, false, true);
  if (fused) {
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    const auto names = optimizer_->state_names();
    const auto& state = optimizer_->state();
    for (size_t k = 0; k < state.size(); ++k)
      tensors.emplace_back(
          names[k], state[k].narrow(0, 0, numel_).to(torch::kCPU, master_dtype_, false, true));
    auto states = py_dict();
    states->dict.push_back({py_int(0), deepspeed_param_state(tensors)});
    auto base = py_dict();
    py_set(base, "state", states);
    py_set(base, "param_groups", py_list({deepspeed_param_group({py_int(0)})}));
    py_set(o, "optimizer_state_dict", base);
    py_set(o, "fp32_groups_flat", py_list({py_tensor(w.narrow(0, 0, numel_))}));
    py_set(o, "clip_grad", py_float(config_.gradient_clipping));
  } else {
    py_set(o, "optimizer_state_dict", deepspeed_stage0_optimizer());
    std::vector<PyPtr> params;
    for (size_t i = 0; i < numels_.size(); ++i)
      params.push_back(py_tensor(w.narrow(0, offsets_[i], numels_[i]).view(shapes_[i])));
    py_set(o, "fp32_groups", py_list({py_list(std::move(params))}));
  }
  return o;
}

IValue EngineImpl::optim_state() { return optim_dict(false); }

IValue EngineImpl::optim_dict(bool deepspeed_stage3) {
  torch::NoGradGuard ng;
  torch::Tensor w = update_target();
  const int64_t begin = std::min<int64_t>(rank_ * part_, numel_),
                end = std::min<int64_t>((rank_ + 1) * part_, numel_);
  const int64_t local = policy_.optimizer() ? 0 : begin;  // where [begin, end) lies in w
  auto slice = [&](const torch::Tensor& t) {
    if (deepspeed_stage3)  // t is this rank's (padded) partition
      return to_per_parameter(group_, t.to(torch::kCPU, master_dtype_), numels_);
    return t.narrow(0, local, end - begin).to(torch::kCPU, master_dtype_, false, true);
  };
  auto o = new_dict();
  o.insert("zero_stage", static_cast<int64_t>(config_.zero.stage));
  o.insert("partition_count", static_cast<int64_t>(world_));
  o.insert("rank", static_cast<int64_t>(rank_));
  o.insert("numel", numel_);
  o.insert("begin", begin);
  o.insert("end", end);
  if (policy_.deepspeed_stage_1_and_2()) {
    // DeepSpeed's key: the padded partition (zero_to_fp32 concatenates them by rank).
    c10::List<torch::Tensor> groups;
    groups.push_back(w.narrow(0, 0, part_).to(torch::kCPU, master_dtype_, false, true));
    o.insert("single_partition_of_fp32_groups", groups);
  } else if (deepspeed_stage3) {
    // DeepSpeed's stage 3 key: every parameter's piece on this rank (zero_to_fp32 reads them).
    c10::List<torch::Tensor> groups;
    groups.push_back(slice(w));
    o.insert("fp32_flat_groups", groups);
  } else {
    o.insert("fp32_flat", slice(w));
  }
  auto st = new_dict();
  const auto names = optimizer_->state_names();
  const auto& state = optimizer_->state();
  for (size_t k = 0; k < state.size(); ++k) st.insert(names[k], slice(state[k]));
  o.insert("state", st);
  o.insert("step", opt_step_);
  o.insert("type", optimizer_->type());
  // Opaque state (the client optimizer's torch::optim archive), as bytes: keyed to this partition.
  if (optimizer_->opaque()) o.insert("client_optimizer", optimizer_->save_opaque());
  auto d = new_dict();
  d.insert("optimizer_state_dict", o);
  return d;
}

// What is wrong with this rank's save arguments, or "".
static std::string save_problem(const std::string& tag, const SaveCheckpointOptions& opts) {
  if (tag.empty() || tag.find('/') != std::string::npos)
    return "tag must be a non-empty name without '/', got '" + tag + "'";
  if (!opts.client_state.is_object())
    return "client_state must be a JSON object ({key: value}), got " +
           std::string(opts.client_state.type_name());
  for (auto it = opts.client_state.begin(); it != opts.client_state.end(); ++it)
    if (own_key(it.key()))
      return "client_state key '" + it.key() +
             "' is one the checkpoint itself keeps (DeepSpeed's or dtrain's); name yours "
             "otherwise";
  return "";
}

void EngineImpl::save_checkpoint(const std::string& dir_s, const std::string& tag,
                                 const SaveCheckpointOptions& opts) {
  // Every rank learns every rank's tag and problem, so that all refuse together (one rank's
  // error must not leave the others waiting in the save's barriers). One tag for all: the
  // files of one save are one directory (DeepSpeed checks this too: checkpoint.tag_validation).
  {
    CollectiveOptions o;
    o.group = group_;
    // Each rank's "<tag length>:<tag><problem>".
    const auto all =
        all_gather_object(std::to_string(tag.size()) + ':' + tag + save_problem(tag, opts), o);
    for (size_t r = 0; r < all.size(); ++r) {
      const auto colon = all[r].find(':');
      const size_t n = std::stoul(all[r].substr(0, colon));
      const std::string their_tag = all[r].substr(colon + 1, n),
                        problem = all[r].substr(colon + 1 + n);
      if (!problem.empty())
        throw UsageError("zero save_checkpoint: " +
                         (all.size() > 1 ? "rank " + std::to_string(r) + ": " : std::string()) +
                         problem);
      if (their_tag != tag)
        throw UsageError("zero save_checkpoint: the ranks save under different tags (rank " +
                         std::to_string(rank_) + ": '" + tag + "', rank " + std::to_string(r) +
                         ": '" + their_tag +
                         "'); every rank must pass the same tag (leave it out for "
                         "global_step<N>), as DeepSpeed's checkpoint.tag_validation asks");
    }
  }
  const fs::path dir(dir_s), tmp = dir / ("." + tag + ".tmp"), final_dir = dir / tag;
  if (rank_ == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    fs::remove_all(tmp, ec);
    if (!fs::create_directories(tmp, ec) && ec)
      throw Error("zero save_checkpoint: cannot create " + tmp.string() + ": " + ec.message());
  }
  group_->barrier();
  if (policy_.parameters()) {
    // DeepSpeed's stage 3: a model file per rank with empty parameters (nothing is gathered: the
    // parameters are in the optimizer files' fp32 groups), the master in DeepSpeed's
    // per-parameter layout.
    const IValue model = model_dict(false);
    save_file(tmp / stage3_model_file(rank_), *deepspeed_model_file_of(model, opts));
    auto optim = detail::from_ivalue(optim_dict(true));
    if (!optimizer_->opaque())
      for (auto& [key, value] : optim->dict)
        if (key->s == "optimizer_state_dict")
          add_deepspeed_stage3_keys(value, opts.deepspeed_loss_scaler);
    save_file(tmp / optim_file(rank_), *optim);
  } else {
    // Rank 0: the module.
    const IValue model = model_state(rank_ == 0);
    if (rank_ == 0) {
      auto file = deepspeed_model_file_of(model, opts);
      // Stage 0: DeepSpeed's own layout of the optimizer state as well (its engine's
      // load_checkpoint reads it; dtrain reads its optimizer files below): the basic
      // optimizer's state_dict in fp32, its fp16/bf16 wrapper's under mixed precision.
      if (!policy_.optimizer() && !optimizer_->opaque())
        py_set(file, "optimizer",
               mixed_ ? deepspeed_stage0_wrapper() : deepspeed_stage0_optimizer());
      save_file(tmp / kModelFile, *file);
    }
    // Every rank: its slice of the master and the optimizer state (and, but for a client
    // optimizer's opaque state, DeepSpeed's keys for its engine's load_checkpoint).
    auto optim = detail::from_ivalue(optim_dict(false));
    if (policy_.deepspeed_stage_1_and_2() && !optimizer_->opaque())
      for (auto& [key, value] : optim->dict)
        if (key->s == "optimizer_state_dict")
          add_deepspeed_optimizer_keys(value, opts.deepspeed_loss_scaler);
    save_file(tmp / optim_file(rank_), *optim);
  }
  sync_dir(tmp);
  group_->barrier();
  if (rank_ == 0) {
    std::error_code ec;
    const fs::path old = dir / ("." + tag + ".old");
    fs::remove_all(old, ec);
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fs::remove_all(old, ec);
    if (opts.save_latest) {
      std::string t = tag;
      write_file_synced(dir / "latest.tmp", std::vector<char>(t.begin(), t.end()));
      fs::rename(dir / "latest.tmp", dir / "latest");
    }
    sync_dir(dir);
  }
  group_->barrier();
}

bool EngineImpl::save_16bit_model(const std::string& dir_s, const std::string& filename,
                                  bool exclude_frozen_parameters) {
  const fs::path dir(dir_s), path = dir / filename;
  if (filename.empty() || filename.find('/') != std::string::npos)
    throw UsageError("zero save_16bit_model: filename must be a name without '/', got '" +
                     filename + "'");
  if (policy_.parameters() && !config_.zero.stage3_gather_16bit_weights_on_model_save) {
    if (rank_ == 0)
      std::fprintf(stderr,
                   "dtrain zero: did not save the model %s: at stage 3 that needs "
                   "zero_optimization.stage3_gather_16bit_weights_on_model_save (DeepSpeed's "
                   "rule); set it, or consolidate a checkpoint with `dtrain zero to-fp32`\n",
                   path.c_str());
    return false;
  }
  torch::NoGradGuard ng;
  const int64_t bytes_before = bytes_this_step_;
  const bool was_gathered = gathered_;
  if (policy_.parameters() && !gathered_) gather_parameters();  // collective
  std::string error;
  if (rank_ == 0) {
    // torch's state_dict order (dtrain::state_dict's), on the CPU.
    torch::OrderedDict<std::string, torch::Tensor> sd;
    // DeepSpeed's exclude_frozen_parameters: requires_grad false.
    const auto frozen = exclude_frozen_parameters ? frozen_names() : std::set<std::string>();
    for (const auto& item : dtrain::state_dict(module_))
      if (!frozen.count(item.key())) sd.insert(item.key(), item.value().to(torch::kCPU));
    try {
      fs::create_directories(dir);
      save_state_dict(sd, path.string());
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (policy_.parameters() && !was_gathered) release_parameters();
  bytes_this_step_ = bytes_before;
  // Every rank returns once the file is there, or with rank 0's error.
  BroadcastOptions b;
  b.group = group_;
  error = broadcast_object(error, b);
  if (!error.empty())
    throw Error("zero save_16bit_model: cannot write " + path.string() + ": " + error);
  return true;
}

}  // namespace dtrain::zero::detail
