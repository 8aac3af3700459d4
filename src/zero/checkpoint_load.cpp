// A ZeRO engine's load_checkpoint: dtrain's checkpoints and DeepSpeed's (the layout is in
// checkpoint_save.cpp), at any world size, each rank reading only its own part where it can
// (load_own_part); the module alone (load_module_only), or only the parameters both have
// (load_module_strict = false).
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "dtrain/checkpoint.h"
#include "dtrain/zero.h"
#include "zero/checkpoint_files.h"
#include "zero/client_state.h"
#include "zero/deepspeed_checkpoint.h"
#include "zero/engine_impl.h"
#include "zero/pickle.h"
#include "zero/saved_optimizer.h"
#include "zero/stage3_fetch.h"
#include "zero/stage3_layout.h"
#include "zero/torch_schedulers.h"

namespace dtrain::zero::detail {

using namespace ckpt;

std::string EngineImpl::load_checkpoint(const std::string& dir_s, const std::string& tag_in,
                                        const LoadCheckpointOptions& given) {
  LoadCheckpointOptions opts = given;
  if (opts.load_module_only) opts.load_optimizer_states = opts.load_lr_scheduler_states = false;
  const fs::path dir(dir_s);
  std::string tag = resolve_tag(dir, tag_in);
  if (tag.empty()) return "";
  const fs::path ckpt = dir / tag;
  fs::path model_path = ckpt / kModelFile;
  if (!fs::exists(model_path) && fs::exists(ckpt / stage3_model_file(0)))
    model_path = ckpt / stage3_model_file(0);  // DeepSpeed's stage 3
  if (!fs::exists(model_path))
    throw UsageError("zero load_checkpoint: " + (ckpt / kModelFile).string() + " does not exist");
  // The model file is read once: its pickle here, its tensors where they are needed.
  TorchFile model_file(model_path.string());
  if (model_file.value()->kind != PyValue::Kind::Dict)
    throw CheckpointError(model_path.string() + ": holds a " + model_file.value()->describe() +
                          ", not a checkpoint's dict");
  // DeepSpeed's load_module_strict: the saved module's keys against the model's.
  if (const std::string differ = module_keys_differ(*model_file.value());
      !differ.empty() && (opts.load_module_strict ||
                          !only_frozen_keys_differ(*model_file.value(), model_path.string()))) {
    // (Where only frozen parameters differ and the load is not strict, it goes on below: the
    // frozen parameters the file lacks keep their values, as under DeepSpeed's non-strict load.)
    const std::string what = "zero load_checkpoint: " + model_path.string() +
                             " does not hold the model's parameters (" + differ + ")";
    if (opts.load_module_strict)
      throw UsageError(what +
                       "; to load the parameters both have, pass load_module_strict = false "
                       "with load_module_only = true (DeepSpeed's load_module_strict=False)");
    if (!opts.load_module_only)
      throw UsageError(what +
                       ": its optimizer state has no place in this model's (DeepSpeed fails "
                       "there too); pass load_module_only = true to load the module only");
    load_module_subset(model_file, model_path.string());
    load_frozen_fragments(*model_file.value(), model_path.string());
    client_state_ = client_state_of(*model_file.value());
    return tag;
  }
  const PyValue* version = model_file.value()->get("ds_version");
  const bool ours =
      version && version->kind == PyValue::Kind::Str && version->s.rfind("dtrain", 0) == 0;
  std::string whole_because;  // why DeepSpeed's files are read whole; "": in parts
  if (!ours)
    whole_because = optimizer_->opaque()
                        ? "the engine's optimizer is a client optimizer, whose state is read whole"
                        : why_not_streamed(ckpt, *model_file.value(), model_path, names_, numels_,
                                           optimizer_->state_names(), config_.optimizer.type);
  if (!optimizer_->opaque() && (ours || whole_because.empty())) {
    load_own_part(model_file, ckpt.string(), opts, model_path.string(), /*deepspeed=*/!ours);
    load_frozen_fragments(*model_file.value(), model_path.string());
    client_state_ = client_state_of(*model_file.value());
    return tag;
  }
  // At stages 1-3 that costs each rank the whole checkpoint's memory, where a rank's part was
  // asked for: said once, from rank 0 (stage 0's files hold the whole state on every rank).
  if (!ours && whole_because != kStageZero && rank_ == 0)
    std::cerr << "dtrain zero: note: load_checkpoint: " << ckpt.string()
              << " is read whole on every rank, not each rank its part: " << whole_because << "\n";
  // DeepSpeed's files, and a client optimizer's opaque state (kept whole per partition).
  const auto file = model_file.load_all();
  auto d = detail::to_ivalue(*file).toGenericDict();
  std::vector<c10::impl::GenericDict> optims;
  if (!ours) {
    auto [model, ds_optims] =
        from_deepspeed(dir, tag, d, *file, model_path, names_, numels_, config_.optimizer.type,
                       optimizer_->state_names(), opts.load_optimizer_states);
    load_state(model, ds_optims, opts, model_path.string());
    load_frozen_fragments(*file, model_path.string());
    client_state_ = client_state_of(*file);
    return tag;
  }
  const int saved_world = static_cast<int>(get(d, "dp_world_size", model_path).toInt());
  // A stage-3 model file's parameters are empty (DeepSpeed's layout): they come from the fp32
  // master of the optimizer files, which are read then whatever the options.
  // (Judged by a parameter that has elements: an empty one is empty in every layout.)
  const auto sized = std::find_if(numels_.begin(), numels_.end(), [](int64_t n) { return n > 0; });
  const bool empty_params =
      sized != numels_.end() &&
      module_parameter_is_empty(d, names_[static_cast<size_t>(sized - numels_.begin())],
                                model_path);
  if (opts.load_optimizer_states || empty_params) {
    for (int r = 0; r < saved_world; ++r) optims.push_back(load_dict(ckpt / optim_file(r)));
  }
  if (empty_params) {
    const auto f = full_optim(
        optims, [&](int r) { return ckpt / optim_file(r); }, numels_);
    if (f.master.numel() != numel_)
      throw Error("zero load_checkpoint: the fp32 master in " + ckpt.string() + " holds " +
                  std::to_string(f.master.numel()) + " parameters, the model has " +
                  std::to_string(numel_));
    auto module_dict = get(d, "module", model_path).toGenericDict();
    for (size_t i = 0; i < names_.size(); ++i)
      module_dict.insert_or_assign(names_[i],
                                   f.master.narrow(0, offsets_[i], numels_[i]).view(shapes_[i]));
    if (!opts.load_optimizer_states) optims.clear();
  }
  load_state(d, optims, opts, model_path.string());
  load_frozen_fragments(*file, model_path.string());
  client_state_ = client_state_of(*file);
  return tag;
}

void EngineImpl::load_opaque_state(const std::vector<c10::impl::GenericDict>& optims,
                                   const std::string& saved_type, int saved_world,
                                   const std::string& where) {
  if (!optimizer_->opaque())
    throw Error("zero load_checkpoint: " + where +
                " holds the state of a client optimizer (InitOptions::optimizer); "
                "initialize with the same optimizer to load it, or load with load_optimizer_states "
                "= false");
  if (saved_type != kClientOptimizerType)
    throw Error(
        "zero load_checkpoint: " + where + " holds the config optimizer " + saved_type +
        "'s state, but this engine steps a client optimizer (InitOptions::optimizer); load with "
        "load_optimizer_states = false to start its state afresh");
  if (saved_world != world_)
    throw Error("zero load_checkpoint: " + where + " was saved by " + std::to_string(saved_world) +
                " ranks with a client optimizer, whose state is opaque and kept per partition; "
                "load it on " +
                std::to_string(saved_world) + " ranks (this run has " + std::to_string(world_) +
                "), or with load_optimizer_states = false");
  auto o = get(optims[static_cast<size_t>(rank_)], "optimizer_state_dict", where).toGenericDict();
  optimizer_->load_opaque(get(o, "client_optimizer", where).toTensor());
}

void EngineImpl::load_state(const c10::impl::GenericDict& d,
                            const std::vector<c10::impl::GenericDict>& optims,
                            const LoadCheckpointOptions& opts, const std::string& where) {
  const fs::path model_path(where);
  torch::NoGradGuard ng;
  auto module_dict = get(d, "module", model_path).toGenericDict();
  // Parameters: the full flat from the module's values.
  auto full = torch::zeros({padded_}, torch::TensorOptions().dtype(master_dtype_));
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = module_dict.find(names_[i]);
    if (it == module_dict.end())
      throw Error("zero load_checkpoint: " + model_path.string() + " has no parameter '" +
                  names_[i] + "'");
    auto t = it->value().toTensor();
    if (t.sizes().vec() != shapes_[i])
      throw Error("zero load_checkpoint: parameter '" + names_[i] + "' has another shape in " +
                  model_path.string());
    full.narrow(0, offsets_[i], numels_[i]).copy_(t.reshape({-1}));
  }
  load_buffers(module_dict);
  auto place = [&](const torch::Tensor& full_flat) {
    if (!policy_.parameters()) {
      flat_params_.copy_(full_flat);
      return;
    }
    param_part_.copy_(own_slice(full_flat));
    if (gathered_) release_parameters();  // gathered copies of the old values are stale
    if (fetch_) fetch_->release_all();
  };
  place(full);
  if (opts.load_optimizer_states) {
    const int saved_world = static_cast<int>(get(d, "dp_world_size", model_path).toInt());
    if (static_cast<int>(optims.size()) != saved_world)
      throw Error("zero load_checkpoint: " + where + " was saved by " +
                  std::to_string(saved_world) + " ranks but holds " +
                  std::to_string(optims.size()) + " optimizer partitions");
    // Named as the files of a checkpoint directory, else by partition.
    auto f = full_optim(
        optims,
        [&](int r) {
          return model_path.filename() == kModelFile ||
                         model_path.filename() == stage3_model_file(0)
                     ? model_path.parent_path() / optim_file(r)
                     : fs::path(where + " (optimizer partition " + std::to_string(r) + ")");
        },
        numels_);
    if (f.master.numel() != numel_)
      throw Error("zero load_checkpoint: the checkpoint's optimizer state covers " +
                  std::to_string(f.master.numel()) + " parameters, the model has " +
                  std::to_string(numel_));
    auto pad = [&](const torch::Tensor& t) {
      auto p = torch::zeros({padded_}, t.options());
      p.narrow(0, 0, numel_).copy_(t);
      return p;
    };
    auto mine = [&](const torch::Tensor& t) { return policy_.mine(pad(t), rank_, part_); };
    if (master_.defined()) master_.copy_(mine(f.master));
    const std::string saved_type =
        get(get(optims[0], "optimizer_state_dict", model_path).toGenericDict(), "type", model_path)
            .toStringRef();
    if (optimizer_->opaque() || saved_type == kClientOptimizerType)
      load_opaque_state(optims, saved_type, saved_world, where);
    auto& state = optimizer_->state();
    check_state_count(f.state_names, optimizer_->state_names());
    for (size_t k = 0; k < state.size(); ++k) state[k].copy_(mine(f.state[k]));
    opt_step_ = f.step;
  } else if (master_.defined()) {
    master_.copy_(policy_.mine(full, rank_, part_));
  }
  load_counters(d, opts, where);
}

std::string EngineImpl::module_keys_differ(const PyValue& model) const {
  const PyValue* module = model.get("module");
  if (!module || module->kind != PyValue::Kind::Dict) return "";  // said where it is read
  std::set<std::string> saved, known;
  for (const auto& [k, v] : module->dict)
    if (k->kind == PyValue::Kind::Str) saved.insert(k->s);
  // Every parameter, frozen ones (requires_grad false, not the engine's) too; a missing buffer
  // may be a non-persistent one, never saved (torch's load_state_dict).
  std::string missing, unexpected;
  for (const auto& p : module_.named_parameters(true)) {
    known.insert(p.key());
    if (!saved.count(p.key())) missing += (missing.empty() ? "" : ", ") + p.key();
  }
  for (const auto& b : module_.named_buffers(true)) known.insert(b.key());
  for (const auto& n : saved)
    if (!known.count(n)) unexpected += (unexpected.empty() ? "" : ", ") + n;
  if (missing.empty() && unexpected.empty()) return "";
  return "missing: " + (missing.empty() ? std::string("none") : missing) +
         "; unexpected: " + (unexpected.empty() ? std::string("none") : unexpected);
}

bool EngineImpl::only_frozen_keys_differ(const PyValue& model, const std::string& where) const {
  const PyValue* module = model.get("module");
  if (!module || module->kind != PyValue::Kind::Dict) return false;
  std::set<std::string> saved_trainable;
  for (const auto& g : saved_parameters(model, where))
    for (const auto& [name, shape] : g) saved_trainable.insert(name);
  const std::set<std::string> own(names_.begin(), names_.end());
  if (saved_trainable != own) return false;
  for (const auto& n : names_)
    if (!module->get(n)) return false;
  return true;
}

void EngineImpl::load_module_subset(TorchFile& model, const std::string& where) {
  torch::NoGradGuard ng;
  const PyValue& module = *model.value()->get("module");
  // A stage-3 checkpoint's module holds empty placeholders: the values then come from its fp32
  // master, which every rank reads whole, as `dtrain zero to-fp32` does. (DeepSpeed 0.19.8
  // loads none of them there.)
  bool placeholders = false;
  for (size_t i = 0; i < names_.size(); ++i) {
    const PyValue* t = module.get(names_[i]);
    placeholders = placeholders || (t && t->kind == PyValue::Kind::Tensor &&
                                    t->tensor.numel() == 0 && numels_[i] > 0);
  }
  torch::OrderedDict<std::string, torch::Tensor> master;
  if (placeholders) master = consolidated(*load_file(where), where, fs::path(where).parent_path());
  // Checked whole before anything is written, so that a bad file leaves the engine as it was.
  struct Found {
    size_t i;
    const PyValue* saved;  // in the module (read when written), or
    torch::Tensor value;   // from the master
  };
  std::vector<Found> found;
  for (size_t i = 0; i < names_.size(); ++i) {
    Found f{i, nullptr, {}};
    if (placeholders) {
      const torch::Tensor* t = master.find(names_[i]);
      if (!t) continue;
      f.value = *t;
    } else {
      f.saved = module.get(names_[i]);
      if (!f.saved) continue;
      if (f.saved->kind != PyValue::Kind::Tensor)
        throw CheckpointError(where + ": '" + names_[i] + "' is a " + f.saved->describe() +
                              ", not a tensor");
    }
    const auto sizes = f.saved ? f.saved->tensor.sizes().vec() : f.value.sizes().vec();
    if (sizes != shapes_[i])
      throw UsageError("zero load_checkpoint: parameter '" + names_[i] + "' has another shape in " +
                       where + " (torch's load_state_dict refuses it with strict=False too)");
    found.push_back(std::move(f));
  }
  const int64_t first = rank_ * part_, last = first + part_;
  for (auto& f : found) {
    const torch::Tensor value = (f.saved ? model.load(*f.saved) : f.value).reshape({-1});
    if (!policy_.parameters()) {
      flat_params_.narrow(0, offsets_[f.i], numels_[f.i]).copy_(value);
      continue;
    }
    // Stage 3: this rank's partition's part of the parameter.
    const int64_t from = std::max(offsets_[f.i], first),
                  to = std::min(offsets_[f.i] + numels_[f.i], last);
    if (from < to)
      param_part_.narrow(0, from - first, to - from)
          .copy_(value.narrow(0, from - offsets_[f.i], to - from));
  }
  if (policy_.parameters()) {
    if (gathered_) release_parameters();  // gathered copies of the old values are stale
    if (fetch_) fetch_->release_all();
  }
  load_buffers(model, module);
  // DeepSpeed's refresh_fp32_params: the master from the (16-bit) parameters.
  if (master_.defined())
    master_.copy_(policy_.parameters()
                      ? param_part_
                      : policy_.mine(flat_params_.to(master_dtype_), rank_, part_));
  // As after any load: the steps and loss scale stay (load_module_only), the gradients go.
  clear_gradients();
}

void EngineImpl::clear_gradients() {
  if (flat_grads_.defined()) flat_grads_.zero_();
  if (grad_acc_.defined()) grad_acc_.zero_();
  if (grad_part_.defined()) grad_part_.zero_();
}

void EngineImpl::load_buffers(const c10::impl::GenericDict& module_dict) {
  torch::NoGradGuard ng;
  for (auto& item : module_.named_buffers(true)) {
    auto it = module_dict.find(item.key());
    if (it != module_dict.end() && item.value().defined())
      item.value().detach().copy_(it->value().toTensor());
  }
  // Frozen parameters (not the engine's), as torch's load_state_dict loads them; not where the
  // file holds an empty placeholder (DeepSpeed's stage-3 layout).
  for (auto& item : module_.named_parameters(true)) {
    if (item.value().requires_grad()) continue;
    auto it = module_dict.find(item.key());
    if (it == module_dict.end() || !it->value().isTensor()) continue;
    const auto t = it->value().toTensor();
    if (t.sizes() == item.value().sizes()) item.value().detach().copy_(t);
  }
}

void EngineImpl::load_buffers(TorchFile& model, const PyValue& module) {
  torch::NoGradGuard ng;
  for (auto& item : module_.named_buffers(true)) {
    const PyValue* t = module.get(item.key());
    if (t && t->kind == PyValue::Kind::Tensor && item.value().defined())
      item.value().detach().copy_(model.load(*t));
  }
  for (auto& item : module_.named_parameters(true)) {
    if (item.value().requires_grad()) continue;
    const PyValue* t = module.get(item.key());
    if (t && t->kind == PyValue::Kind::Tensor && t->tensor.sizes() == item.value().sizes())
      item.value().detach().copy_(model.load(*t));
  }
}

void EngineImpl::load_frozen_fragments(const PyValue& model, const std::string& where) {
  torch::NoGradGuard ng;
  const PyValue* module = model.get("module");
  if (!module || module->kind != PyValue::Kind::Dict) return;
  const auto frozen = frozen_names();
  std::set<std::string> placeholders;  // frozen parameters the module holds empty
  for (const auto& item : module_.named_parameters(true)) {
    if (!frozen.count(item.key()) || item.value().numel() == 0) continue;
    const PyValue* t = module->get(item.key());
    if (t && t->kind == PyValue::Kind::Tensor && t->tensor.numel() == 0)
      placeholders.insert(item.key());
  }
  if (placeholders.empty()) return;
  const auto saved = frozen_params(model, where, placeholders);
  for (auto& item : module_.named_parameters(true)) {
    if (!placeholders.count(item.key())) continue;
    const auto it = saved.find(item.key());
    if (it == saved.end()) {
      // dtrain's stage-3 checkpoints before 2026-12-01 kept no frozen values.
      if (rank_ == 0)
        std::cerr << "dtrain zero: note: load_checkpoint: " << where
                  << " holds no values for the frozen parameter '" << item.key()
                  << "' (no frozen_param_fragments); it keeps the model's\n";
      continue;
    }
    if (it->second.sizes() != item.value().sizes())
      throw UsageError("zero load_checkpoint: the frozen parameter '" + item.key() +
                       "' has another shape in " + where);
    item.value().detach().copy_(it->second);
  }
}

void EngineImpl::load_own_part(TorchFile& model, const std::string& ckpt_s,
                               const LoadCheckpointOptions& opts, const std::string& where,
                               bool deepspeed) {
  torch::NoGradGuard ng;
  const fs::path ckpt(ckpt_s), model_path(where);
  const PyValue& d = *model.value();
  const int saved_world =
      static_cast<int>(field(d, "dp_world_size", model_path).as_int(where + ": dp_world_size"));
  const PyValue& module = field(d, "module", model_path);
  // A stage-3 model file's parameters are empty (DeepSpeed's layout): they come from the fp32
  // master of the optimizer files, which are read then whatever the options. (Judged by a
  // parameter that has elements: an empty one is empty in every layout.)
  const auto sized = std::find_if(numels_.begin(), numels_.end(), [](int64_t n) { return n > 0; });
  const PyValue* first = sized == numels_.end()
                             ? nullptr
                             : module.get(names_[static_cast<size_t>(sized - numels_.begin())]);
  const bool empty_params =
      first && first->kind == PyValue::Kind::Tensor && first->tensor.numel() == 0;
  // The parameters from the optimizer files' fp32 master: DeepSpeed's stage 3 (empty in the
  // module), and DeepSpeed's files of any stage (the module may be 16-bit).
  const bool from_master = empty_params || deepspeed;
  std::vector<fs::path> files;
  if (deepspeed)
    files = optim_files(ckpt, saved_world);
  else
    for (int r = 0; r < saved_world; ++r) files.push_back(ckpt / optim_file(r));
  const auto int_field = [&](const char* key) {
    const PyValue* v = d.get(key);
    return v && v->kind == PyValue::Kind::Int ? v->i : int64_t{0};
  };
  const int64_t applied = int_field("global_steps") - int_field("skipped_steps");
  // Where each saved parameter lies in the engine's flat order: the files hold them in the
  // order of the module that saved them (param_shapes), which may be another than this
  // engine's (for DeepSpeed's files why_not_streamed checked they are the same parameters; a
  // file of dtrain's that is not is refused below by the same checks as before).
  SavedOrder saved{numels_, offsets_};
  if (auto order = saved_order(d, model_path, names_, offsets_, numels_))
    saved = std::move(*order);
  else if (deepspeed)
    throw InternalError("zero load_checkpoint: " + where + ": parameters not placed");
  // The module's parameters as a vector of the flat order (checked before anything is read).
  Segments module_v;
  std::vector<Span> module_spans;
  if (!from_master) {
    int64_t at = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      const PyValue* t = module.get(names_[i]);
      if (!t || t->kind != PyValue::Kind::Tensor)
        throw Error("zero load_checkpoint: " + where + " has no parameter '" + names_[i] + "'");
      if (t->tensor.sizes().vec() != shapes_[i])
        throw Error("zero load_checkpoint: parameter '" + names_[i] + "' has another shape in " +
                    where);
      module_v.parts.push_back({t, numels_[i]});
      module_spans.push_back({offsets_[i], offsets_[i] + numels_[i], at});
      at += numels_[i];
    }
  }
  const bool optimizer = opts.load_optimizer_states;
  // Read into this rank's parts first, so that a file found bad leaves the engine as it was
  // (the parameters of stages 0-2, every rank's whole, are read in place after them).
  const auto cpu = torch::TensorOptions().device(torch::kCPU);
  const int64_t own = rank_ * part_, upd = policy_.update_offset(rank_, part_);
  torch::Tensor part, master;
  std::vector<torch::Tensor> states;
  if (policy_.parameters()) part = torch::zeros({part_}, cpu.dtype(model_dtype_));
  if (master_.defined()) master = torch::zeros({master_.numel()}, cpu.dtype(master_dtype_));
  if (optimizer)
    for (const auto& s : optimizer_->state())
      states.push_back(torch::zeros({s.numel()}, cpu.dtype(s.scalar_type())));
  // What the module holds (not at stage 3, whose parameters are the master's).
  if (part.defined() && !from_master) read_overlap(model, module_v, module_spans, own, part);
  if (master.defined() && !optimizer && !from_master)
    read_overlap(model, module_v, module_spans, upd, master);
  // What the optimizer files hold: every saved rank's elements of this rank's parts (the
  // padding beyond the parameters stays zero).
  std::vector<std::string> names;
  int64_t step = 0;
  if (optimizer || from_master) {
    for_each_saved_part(files, saved, numel_, applied, [&](int r, const SavedPart& p) {
      if (optimizer && r == 0) {
        if (p.type == kClientOptimizerType)
          load_opaque_state({}, p.type, saved_world, where);  // refuses: no client optimizer
        // DeepSpeed's files hold the state under the optimizer's names (Adagrad's perhaps
        // under DeepSpeedCPUAdagrad's), in torch's order.
        if (deepspeed)
          for (const auto& n : optimizer_->state_names())
            names.push_back(
                deepspeed_state_name(n, config_.optimizer.type, [&](const std::string& m) {
                  return std::any_of(p.state.begin(), p.state.end(),
                                     [&](const auto& e) { return e.first == m; });
                }));
        else
          for (const auto& e : p.state) names.push_back(e.first);
        check_state_count(names, optimizer_->state_names());
      }
      if (part.defined() && from_master) read_overlap(*p.file, p.master, p.spans, own, part);
      if (master.defined() && (optimizer || from_master))
        read_overlap(*p.file, p.master, p.spans, upd, master);
      if (optimizer) {
        const auto ordered = p.state_in(names);
        for (size_t k = 0; k < states.size(); ++k)
          read_overlap(*p.file, *ordered[k], p.spans, upd, states[k]);
      }
      step = p.step;
    });
  }
  if (policy_.parameters()) {
    param_part_.copy_(part);
    part = torch::Tensor();
    if (gathered_) release_parameters();  // gathered copies of the old values are stale
    if (fetch_) fetch_->release_all();
  } else {
    const auto params = flat_params_.narrow(0, 0, numel_);
    flat_params_.narrow(0, numel_, padded_ - numel_).zero_();
    if (from_master)  // a stage-3 or DeepSpeed checkpoint into stages 0-2: the whole master
      for_each_saved_part(files, saved, numel_, applied, [&](int, const SavedPart& p) {
        read_overlap(*p.file, p.master, p.spans, 0, params);
      });
    else
      read_overlap(model, module_v, module_spans, 0, params);
  }
  load_buffers(model, module);
  if (master_.defined()) master_.copy_(master);
  master = torch::Tensor();
  if (optimizer) {
    auto& state = optimizer_->state();
    for (size_t k = 0; k < state.size(); ++k) {
      state[k].copy_(states[k]);
      states[k] = torch::Tensor();
    }
    opt_step_ = step;
  }
  load_counters(detail::to_ivalue(d).toGenericDict(), opts, where);
}

void EngineImpl::load_counters(const c10::impl::GenericDict& d, const LoadCheckpointOptions& opts,
                               const std::string& where) {
  const fs::path model_path(where);
  // DeepSpeed writes lr_scheduler None without a scheduler, and keeps no loss scaler here.
  // torch.optim.lr_scheduler's state: its state_dict() (torch_schedulers.h).
  if (opts.load_lr_scheduler_states && d.contains("lr_scheduler") &&
      d.at("lr_scheduler").isGenericDict() && config_.scheduler.is_torch()) {
    auto s = get(d, "lr_scheduler", model_path).toGenericDict();
    detail::load_torch_scheduler_state(s, config_.scheduler, scheduler_, model_path.string());
  }
  if (opts.load_lr_scheduler_states && d.contains("lr_scheduler") &&
      d.at("lr_scheduler").isGenericDict() && !config_.scheduler.is_torch()) {
    auto s = get(d, "lr_scheduler", model_path).toGenericDict();
    int64_t last = get(s, "last_batch_iteration", model_path).toInt();
    // dtrain before DeepSpeed's step counting saved the number of steps taken.
    auto v = d.find("ds_version");
    if (v != d.end() && v->value().isString() && v->value().toStringRef() == "dtrain-zero-1")
      --last;
    scheduler_.set_last_batch_iteration(last);
  }
  // load_module_only (DeepSpeed's): the steps and loss scale stay as they are.
  if (!opts.load_module_only) {
    if (d.contains("loss_scaler") && d.at("loss_scaler").isDoubleList()) {
      auto ls = d.at("loss_scaler").toDoubleList();
      std::vector<double> st(ls.begin(), ls.end());
      // A hysteresis of -1 (DeepSpeed's stage-0 wrappers keep none): the engine's own.
      if (st.size() == 4 && st[3] < 0) st[3] = scaler_.state()[3];
      scaler_.set_state(st);
    }
    global_steps_ = get(d, "global_steps", model_path).toInt();
    skipped_steps_ = get(d, "skipped_steps", model_path).toInt();
    // DeepSpeed's default for a file without it; the micro-step counter stays, as DeepSpeed's.
    const bool samples = d.contains("global_samples") && d.at("global_samples").isInt();
    global_samples_ =
        samples ? d.at("global_samples").toInt() : global_steps_ * config_.train_batch_size;
  }
  clear_gradients();
}

}  // namespace dtrain::zero::detail
