// DeepSpeed's ZeRO checkpoints read as dtrain's (deepspeed_checkpoint.h), and the public
// consolidated_state_dict.
#include "zero/deepspeed_checkpoint.h"

#include <algorithm>
#include <sstream>

#include "dtrain/checkpoint.h"
#include "dtrain/error.h"
#include "dtrain/zero.h"
#include "zero/stage3_layout.h"

namespace dtrain::zero::ckpt {
namespace {

using detail::CheckpointError;

// A stage-3 optimizer file's fp32_flat_groups, its sub-groups concatenated: every parameter's
// piece on that rank, in the parameters' order.
torch::Tensor concatenated_groups(const PyValue& osd, const fs::path& file) {
  std::vector<torch::Tensor> subgroups;
  for (const auto& t : need(osd, "fp32_flat_groups", file).items) {
    if (t->kind != PyValue::Kind::Tensor)
      throw CheckpointError(file.string() + ": fp32_flat_groups holds a " + t->describe() +
                            ", not a tensor");
    subgroups.push_back(t->tensor.reshape({-1}));
  }
  return subgroups.empty() ? torch::empty({0}) : torch::cat(subgroups);
}

// The optimizer steps a DeepSpeed file's base optimizer state says were taken: its first
// group's "step" (Adam's; a tensor in torch 2.x), else its param_groups' "step", else (SGD's
// state has none) the steps DeepSpeed applied.
int64_t deepspeed_step(const PyValue& s0, const PyValue& base, const c10::impl::GenericDict& ds,
                       const fs::path& f) {
  const PyValue* step = s0.get("step");
  if (!step)
    step = base.get("param_groups") && !base.get("param_groups")->items.empty()
               ? base.get("param_groups")->items[0]->get("step")
               : nullptr;
  const int64_t applied = (ds.contains("global_steps") ? ds.at("global_steps").toInt() : 0) -
                          (ds.contains("skipped_steps") ? ds.at("skipped_steps").toInt() : 0);
  return !step                                 ? applied
         : step->kind == PyValue::Kind::Tensor ? static_cast<int64_t>(step->tensor.item<double>())
                                               : step->as_int(f.string() + ": step");
}

const PyValue& deepspeed_state(const PyValue& group_state, const std::string& name,
                               const std::string& type, const fs::path& f) {
  const PyValue* t = group_state.get(deepspeed_state_name(
      name, type, [&](const std::string& n) { return group_state.get(n) != nullptr; }));
  if (!t || t->kind != PyValue::Kind::Tensor)
    throw CheckpointError(f.string() + ": DeepSpeed's optimizer state has no '" + name +
                          "' for a " + type + " optimizer (another optimizer type?)");
  return *t;
}

// DeepSpeed's stage-3 optimizer files as dtrain's optimizer dicts (one per saved rank, each
// with its contiguous slice "fp32_flat" of the engine's flat order): each rank's sub-groups
// (fp32_flat_groups and the base optimizer's state per sub-group) concatenated, every
// parameter put together from its pieces on the ranks (DeepSpeed's order: the model file's
// param_shapes), then placed by name in the engine's order.
std::vector<c10::impl::GenericDict> from_deepspeed_stage3(
    const std::vector<fs::path>& files, const PyValue& model, const fs::path& model_path,
    const c10::impl::GenericDict& ds, const std::vector<std::string>& names,
    const std::vector<int64_t>& numels, const std::string& type,
    const std::vector<std::string>& state_names) {
  const int world = static_cast<int>(files.size());
  std::vector<std::string> ds_names;
  std::vector<int64_t> ds_numels;
  for (const auto& g : saved_parameters(model, model_path))
    for (const auto& [name, shape] : g) {
      ds_names.push_back(name);
      ds_numels.push_back(numel_of(shape));
    }
  std::vector<torch::Tensor> masters;
  std::vector<std::vector<torch::Tensor>> states(state_names.size());
  int64_t step = 0;
  for (int r = 0; r < world; ++r) {
    const fs::path& f = files[static_cast<size_t>(r)];
    const auto o = load_file(f);
    const PyValue& osd = need(*o, "optimizer_state_dict", f);
    const PyValue& base = need(osd, "optimizer_state_dict", f);
    const PyValue& state = need(base, "state", f);
    masters.push_back(concatenated_groups(osd, f));
    std::vector<std::vector<torch::Tensor>> per_state(state_names.size());
    for (size_t i = 0; i < need(osd, "fp32_flat_groups", f).items.size(); ++i) {
      const PyValue& si = need(state, std::to_string(i), f);
      for (size_t k = 0; k < state_names.size(); ++k)
        per_state[k].push_back(deepspeed_state(si, state_names[k], type, f).tensor.reshape({-1}));
      if (i == 0) step = deepspeed_step(si, base, ds, f);
    }
    for (size_t k = 0; k < state_names.size(); ++k) states[k].push_back(torch::cat(per_state[k]));
  }
  // DeepSpeed's order -> the engine's, by name.
  std::map<std::string, std::pair<int64_t, int64_t>> where;  // name -> (offset, numel)
  int64_t off = 0;
  for (size_t i = 0; i < ds_names.size(); ++i) {
    where[ds_names[i]] = {off, ds_numels[i]};
    off += ds_numels[i];
  }
  auto reorder = [&](const std::vector<torch::Tensor>& flats) {
    const auto full = detail::from_per_parameter(flats, ds_numels, files[0].string());
    std::vector<torch::Tensor> out;
    for (size_t i = 0; i < names.size(); ++i) {
      auto it = where.find(names[i]);
      if (it == where.end() || it->second.second != numels[i])
        throw CheckpointError(model_path.string() + ": DeepSpeed's checkpoint has " +
                              (it == where.end() ? "no parameter '" + names[i] + "'"
                                                 : "another size for '" + names[i] + "'"));
      out.push_back(full.narrow(0, it->second.first, it->second.second));
    }
    return out.empty() ? torch::empty({0}) : torch::cat(out);
  };
  const auto master = reorder(masters);
  std::vector<torch::Tensor> state_full;
  for (const auto& s : states) state_full.push_back(reorder(s));
  const int64_t numel = master.numel(), P = (numel + world - 1) / world;
  std::vector<c10::impl::GenericDict> optims;
  for (int r = 0; r < world; ++r) {
    const int64_t begin = std::min<int64_t>(r * P, numel),
                  end = std::min<int64_t>((r + 1) * P, numel);
    auto od = new_dict();
    od.insert("fp32_flat", master.narrow(0, begin, end - begin));
    od.insert("begin", begin);
    od.insert("end", end);
    auto st = new_dict();
    for (size_t k = 0; k < state_names.size(); ++k)
      st.insert(state_names[k], state_full[k].narrow(0, begin, end - begin));
    od.insert("state", st);
    od.insert("step", step);
    od.insert("type", type);
    auto file = new_dict();
    file.insert("optimizer_state_dict", od);
    optims.push_back(file);
  }
  return optims;
}

// DeepSpeed's stage 0 (no optimizer files): the module holds the parameters, "optimizer" the
// basic optimizer's state_dict in fp32 training (one state per parameter, keyed by its index in
// the module's order), or under fp16/bf16 its wrapper's (deepspeed_stage0_wrapper):
// FP16_Optimizer's one flat fp32 group ("fp32_groups_flat", the base optimizer's state of that
// one parameter) or FP16_UnfusedOptimizer's fp32 copies per parameter ("fp32_groups"), the
// master taken from there rather than from the 16-bit module. As one dtrain partition of
// everything (dp_world_size 1).
std::pair<c10::impl::GenericDict, std::vector<c10::impl::GenericDict>> from_deepspeed_stage0(
    const c10::impl::GenericDict& ds, const PyValue& ds_value, const fs::path& model_path,
    const std::vector<std::string>& names, const std::string& type,
    const std::vector<std::string>& state_names, bool optimizer) {
  auto model = new_dict();
  const auto module = get(ds, "module", model_path);
  model.insert("module", module);
  for (const char* k : {"global_steps", "skipped_steps", "global_samples", "lr_scheduler"})
    if (ds.contains(k)) model.insert(k, ds.at(k));
  model.insert("dp_world_size", static_cast<int64_t>(1));
  std::vector<c10::impl::GenericDict> optims;
  if (!optimizer) return {model, optims};
  const PyValue* wrapper = ds_value.get("optimizer");
  const PyValue* o = wrapper && wrapper->get("optimizer_state_dict")
                         ? wrapper->get("optimizer_state_dict")
                         : wrapper;
  const PyValue* state = o ? o->get("state") : nullptr;
  const PyValue* flat = o != wrapper ? wrapper->get("fp32_groups_flat") : nullptr;
  const PyValue* copies = o != wrapper ? wrapper->get("fp32_groups") : nullptr;
  const bool known =
      state && state->kind == PyValue::Kind::Dict && o->get("param_groups") &&
      (o == wrapper || (flat && flat->items.size() == 1) || (copies && copies->items.size() == 1));
  if (!known)
    throw CheckpointError(
        model_path.string() + ": DeepSpeed's stage-0 optimizer state " +
        (o != wrapper && (flat || copies) ? "of several parameter groups"
                                          : "in an unknown layout") +
        " is not read by dtrain; load with load_optimizer_states = false (the parameters, steps "
        "and scheduler position load)");
  // The fp16 loss scale the wrapper kept (FP16_Optimizer's _update_scale at stage 0 uses no
  // hysteresis: -1 leaves the engine's own).
  if (o != wrapper) {
    const PyValue* dynamic = wrapper->get("dynamic_loss_scale");
    const PyValue* scale = wrapper->get("cur_scale");
    const PyValue* iter = wrapper->get("cur_iter");
    if (dynamic && scale && iter && scale->kind == PyValue::Kind::Float) {
      const PyValue* last = wrapper->get("last_overflow_iter");
      model.insert(
          "loss_scaler",
          c10::List<double>({scale->f, static_cast<double>(iter->as_int(model_path.string())),
                             last ? static_cast<double>(last->as_int(model_path.string())) : -1.0,
                             -1.0}));
    }
  }
  const auto params = module.toGenericDict();
  // The optimizer holds the parameters in the saving module's order (its state dict's, the
  // model file's "module"), which may be another than this engine's: each goes to its place.
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], i);
  std::vector<size_t> order;  // engine indices, in the saved order
  for (const auto& item : params) {
    const auto it = index.find(item.key().toStringRef());
    if (it != index.end()) order.push_back(it->second);
  }
  for (const auto& name : names)
    if (params.find(name) == params.end())
      throw CheckpointError(model_path.string() + ": has no parameter '" + name + "'");
  std::vector<torch::Tensor> master(names.size());
  std::vector<std::vector<torch::Tensor>> st(state_names.size(),
                                             std::vector<torch::Tensor>(names.size()));
  int64_t step = 0;
  int64_t at = 0;  // where saved parameter j starts in the flat group
  const PyValue* s0 = flat ? state->get("0") : nullptr;
  if (flat && !s0)
    throw CheckpointError(model_path.string() +
                          ": DeepSpeed's FP16_Optimizer state has no state of its flat group");
  if (s0) step = deepspeed_step(*s0, *o, ds, model_path);
  for (size_t j = 0; j < order.size(); ++j) {
    const size_t i = order[j];
    const int64_t n = params.at(names[i]).toTensor().numel();
    auto piece = [&](const torch::Tensor& t, const char* what) {
      const torch::Tensor f = t.reshape({-1});
      if (at + n > f.numel())
        throw CheckpointError(model_path.string() + ": DeepSpeed's " + what + " holds " +
                              std::to_string(f.numel()) +
                              " elements, fewer than the module's parameters");
      return f.narrow(0, at, n).to(torch::kFloat32);
    };
    if (flat) {
      master[i] = piece(flat->items[0]->tensor, "fp32_groups_flat");
      for (size_t k = 0; k < state_names.size(); ++k)
        st[k][i] = piece(deepspeed_state(*s0, state_names[k], type, model_path).tensor,
                         "flat optimizer state");
      at += n;
      continue;
    }
    if (copies) {
      const auto& group = copies->items[0]->items;
      if (j >= group.size() || group[j]->kind != PyValue::Kind::Tensor ||
          group[j]->tensor.numel() != n)
        throw CheckpointError(model_path.string() + ": DeepSpeed's fp32_groups has no copy of '" +
                              names[i] + "' of its size");
      master[i] = group[j]->tensor.to(torch::kFloat32).reshape({-1});
    } else {
      master[i] = params.at(names[i]).toTensor().to(torch::kFloat32).reshape({-1});
    }
    const torch::Tensor& p = master[i];
    const PyValue* s = state->get(std::to_string(j));
    for (size_t k = 0; k < state_names.size(); ++k)
      st[k][i] = s ? deepspeed_state(*s, state_names[k], type, model_path)
                         .tensor.to(torch::kFloat32)
                         .reshape({-1})
                   : torch::zeros_like(p);  // a parameter never stepped
    // FusedLion advances only the last parameter's step: the largest is the optimizer's.
    if (s) step = std::max(step, deepspeed_step(*s, *o, ds, model_path));
  }
  auto od = new_dict();
  od.insert("fp32_flat", torch::cat(master));
  auto sd = new_dict();
  for (size_t k = 0; k < state_names.size(); ++k) sd.insert(state_names[k], torch::cat(st[k]));
  od.insert("state", sd);
  od.insert("begin", static_cast<int64_t>(0));
  od.insert("end", od.at("fp32_flat").toTensor().numel());
  od.insert("step", step);
  od.insert("type", type);
  auto file = new_dict();
  file.insert("optimizer_state_dict", od);
  optims.push_back(file);
  return {model, optims};
}

}  // namespace

std::map<std::string, torch::Tensor> frozen_params(const PyValue& model, const fs::path& model_path,
                                                   const std::set<std::string>& wanted) {
  std::map<std::string, torch::Tensor> out;
  const PyValue* shapes = model.get("frozen_param_shapes");
  if (!shapes || shapes->kind != PyValue::Kind::Dict) return out;
  std::vector<std::pair<std::string, std::vector<int64_t>>> todo;
  for (const auto& [k, v] : shapes->dict) {
    if (!wanted.empty() && !wanted.count(k->s)) continue;
    std::vector<int64_t> shape;
    for (const auto& x : v->items) shape.push_back(x->i);
    todo.emplace_back(k->s, std::move(shape));
  }
  if (todo.empty()) return out;
  const bool stage3 = model_path.filename() == stage3_model_file(0);
  const int world = stage3 ? static_cast<int>(field(model, "dp_world_size", model_path)
                                                  .as_int(model_path.string() + ": dp_world_size"))
                           : 1;
  std::map<std::string, std::vector<torch::Tensor>> pieces;
  for (int r = 0; r < world; ++r) {
    const fs::path path = stage3 ? model_path.parent_path() / stage3_model_file(r) : model_path;
    if (!fs::exists(path))
      throw detail::CheckpointError(path.string() + " does not exist (the checkpoint of " +
                                    std::to_string(world) + " ranks is incomplete)");
    detail::TorchFile f(path.string());
    const PyValue* fragments = f.value()->get("frozen_param_fragments");
    if (!fragments || fragments->kind != PyValue::Kind::Dict)
      throw detail::CheckpointError(path.string() +
                                    ": has frozen_param_shapes but no frozen_param_fragments");
    for (const auto& [name, shape] : todo) {
      const PyValue* t = fragments->get(name);
      if (!t || t->kind != PyValue::Kind::Tensor)
        throw detail::CheckpointError(path.string() +
                                      ": frozen_param_fragments has no tensor for '" + name + "'");
      pieces[name].push_back(f.load(*t).reshape({-1}));
    }
  }
  for (const auto& [name, shape] : todo) {
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    out[name] = detail::from_per_parameter(pieces[name], {n},
                                           model_path.parent_path().string() +
                                               ": frozen_param_fragments of '" + name + "'")
                    .view(shape);
  }
  return out;
}

SavedGroups saved_parameters(const PyValue& model, const fs::path& model_path) {
  SavedGroups groups;
  const PyValue& shapes = need(model, "param_shapes", model_path);
  if (!shapes.items.empty() && shapes.items[0]->kind == PyValue::Kind::Dict) {
    for (const auto& g : shapes.items) {
      groups.emplace_back();
      for (const auto& [k, v] : g->dict) groups.back().push_back({k->s, shape_of(*v)});
    }
  } else {
    const PyValue& names = need(model, "param_names", model_path);
    groups.emplace_back();
    for (size_t i = 0; i < names.items.size() && i < shapes.items.size(); ++i)
      groups.back().push_back({names.items[i]->s, shape_of(*shapes.items[i])});
  }
  return groups;
}

torch::OrderedDict<std::string, torch::Tensor> consolidated(const PyValue& model_file,
                                                            const fs::path& model_path,
                                                            const fs::path& ckpt) {
  const PyValue* model = &model_file;
  const PyValue& module = need(*model, "module", model_path);
  const auto groups = saved_parameters(*model, model_path);
  const int world = static_cast<int>(
      need(*model, "dp_world_size", model_path).as_int(model_path.string() + ": dp_world_size"));
  std::vector<detail::PyPtr> optims;
  const auto files = optim_files(ckpt, world);
  for (const auto& f : files) optims.push_back(load_file(f));
  auto osd = [&](size_t r) -> const PyValue& {
    return need(*optims[r], "optimizer_state_dict", files[r]);
  };
  std::map<std::string, torch::Tensor> params;
  auto group_tensor = [&](size_t r, const std::string& key, size_t g) -> torch::Tensor {
    const PyValue& list = need(osd(r), key, files[r]);
    if (g >= list.items.size() || list.items[g]->kind != PyValue::Kind::Tensor)
      throw CheckpointError(files[r].string() + ": " + key + " has no tensor for group " +
                            std::to_string(g));
    return list.items[g]->tensor.reshape({-1});
  };
  if (osd(0).get("single_partition_of_fp32_groups")) {
    // Stages 1-2: each group's flat fp32 vector is its partitions concatenated by rank.
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<torch::Tensor> parts;
      for (size_t r = 0; r < optims.size(); ++r)
        parts.push_back(group_tensor(r, "single_partition_of_fp32_groups", g));
      auto flat = torch::cat(parts);
      int64_t off = 0;
      for (const auto& [name, shape] : groups[g]) {
        const int64_t n = numel_of(shape);
        if (off + n > flat.numel())
          throw CheckpointError(files[0].string() + ": the fp32 partitions hold " +
                                std::to_string(flat.numel()) + " elements, fewer than the model's");
        params[name] = flat.narrow(0, off, n).view(shape).clone();
        off += n;
      }
    }
  } else if (osd(0).get("fp32_flat_groups")) {
    // Stage 3 (DeepSpeed's layout): each rank's sub-groups concatenated hold every parameter's
    // piece on that rank, in the order of all groups' parameters.
    std::vector<torch::Tensor> flats;
    for (size_t r = 0; r < optims.size(); ++r)
      flats.push_back(concatenated_groups(osd(r), files[r]));
    std::vector<int64_t> numels;
    for (const auto& g : groups)
      for (const auto& [name, shape] : g) numels.push_back(numel_of(shape));
    const auto flat = detail::from_per_parameter(flats, numels, files[0].string());
    int64_t off = 0;
    for (const auto& g : groups)
      for (const auto& [name, shape] : g) {
        const int64_t n = numel_of(shape);
        params[name] = flat.narrow(0, off, n).view(shape).clone();
        off += n;
      }
  } else {
    // dtrain's stage 0 (and its stage 3 before DeepSpeed's layout): each rank's slice of the
    // unpadded flat order.
    std::vector<c10::impl::GenericDict> dicts;
    for (const auto& o : optims) dicts.push_back(detail::to_ivalue(*o).toGenericDict());
    std::vector<int64_t> numels;
    for (const auto& [name, shape] : groups[0]) numels.push_back(numel_of(shape));
    auto f = full_optim(
        dicts, [&](int r) { return files[static_cast<size_t>(r)]; }, numels);
    int64_t off = 0;
    for (const auto& [name, shape] : groups[0]) {
      const int64_t n = numel_of(shape);
      params[name] = f.master.narrow(0, off, n).view(shape).clone();
      off += n;
    }
  }
  torch::OrderedDict<std::string, torch::Tensor> out;
  // The module's order: parameters from the fp32 master, buffers as saved.
  std::set<std::string> buffers;
  if (const PyValue* b = model->get("buffer_names"))
    for (const auto& x : b->items) buffers.insert(x->s);
  // Frozen parameters (not the optimizer's): from frozen_param_fragments, as DeepSpeed's
  // zero_to_fp32 takes them (in their saved dtype); a stage-3 module holds them empty.
  auto frozen = frozen_params(*model, model_path, {});
  for (const auto& [k, v] : module.dict) {
    auto it = params.find(k->s);
    if (it != params.end()) {
      out.insert(k->s, it->second);
      params.erase(it);
    } else if (auto f = frozen.find(k->s); f != frozen.end()) {
      out.insert(k->s, f->second);
    } else if (v->kind == PyValue::Kind::Tensor &&
               (buffers.empty() || buffers.count(k->s) || v->tensor.numel() > 0)) {
      // A buffer, or a frozen parameter saved whole (stages 0-1, where DeepSpeed's zero_to_fp32
      // leaves them out); not a stage-3 placeholder.
      out.insert(k->s, v->tensor.clone());
    }
  }
  for (const auto& g : groups)
    for (const auto& [name, shape] : g)
      if (params.count(name)) out.insert(name, params[name]);
  return out;
}

std::optional<SavedOrder> saved_order(const PyValue& model, const fs::path& model_path,
                                      const std::vector<std::string>& names,
                                      const std::vector<int64_t>& offsets,
                                      const std::vector<int64_t>& numels) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], i);
  SavedOrder order;
  std::vector<bool> seen(names.size(), false);
  try {
    for (const auto& g : saved_parameters(model, model_path))
      for (const auto& [name, shape] : g) {
        const auto it = index.find(name);
        if (it == index.end() || seen[it->second] || numel_of(shape) != numels[it->second])
          return std::nullopt;
        seen[it->second] = true;
        order.numels.push_back(numels[it->second]);
        order.engine_offsets.push_back(offsets.empty() ? 0 : offsets[it->second]);
      }
  } catch (const CheckpointError&) {
    return std::nullopt;
  }
  if (order.numels.size() != names.size()) return std::nullopt;
  return order;
}

std::string why_not_streamed(const fs::path& ckpt, const PyValue& model, const fs::path& model_path,
                             const std::vector<std::string>& names,
                             const std::vector<int64_t>& numels,
                             const std::vector<std::string>& state_names, const std::string& type) {
  const PyValue* world = model.get("dp_world_size");
  if (!world || world->kind != PyValue::Kind::Int || world->i < 1 || !model.get("param_shapes"))
    return "its model file has no dp_world_size or param_shapes";
  if (!fs::exists(ckpt / optim_file(0)) && !fs::exists(ckpt / ("bf16_" + optim_file(0))))
    return kStageZero;
  std::vector<fs::path> files;
  try {  // from_deepspeed says what is wrong or missing
    files = optim_files(ckpt, static_cast<int>(world->i));
  } catch (const CheckpointError& e) {
    return e.what();
  }
  // In any order: each is read where the engine holds it (load_own_part).
  if (!saved_order(model, model_path, names, {}, numels))
    return "its parameters (param_shapes) are not this engine's (names and sizes)";
  const detail::TorchFile first(files[0].string());
  const PyValue* o = first.value()->get("optimizer_state_dict");
  if (!o) return files[0].string() + " has no optimizer_state_dict";
  const PyValue* base = nullptr;
  if (o->get("fp32_flat_groups")) {
    base = o->get("optimizer_state_dict");  // stage 3: a state per sub-group
  } else {
    const PyValue* groups = o->get("single_partition_of_fp32_groups");
    if (!groups || groups->items.size() != 1 || groups->items[0]->kind != PyValue::Kind::Tensor)
      return "it holds more than one parameter group";
    base = o->get("base_optimizer_state");
  }
  const PyValue* state = base ? base->get("state") : nullptr;
  const PyValue* s0 = state && state->kind == PyValue::Kind::Dict ? state->get("0") : nullptr;
  const std::string not_the_optimizers =
      "its optimizer state is not exactly this engine's " + type + "'s";
  if (!s0 || s0->kind != PyValue::Kind::Dict ||
      (!o->get("fp32_flat_groups") && state->dict.size() != 1))
    return not_the_optimizers;
  size_t tensors = 0;
  for (const auto& [k, v] : s0->dict)
    if (v->kind == PyValue::Kind::Tensor && k->s != "step") ++tensors;
  for (const auto& n : state_names) {
    const PyValue* t = s0->get(
        deepspeed_state_name(n, type, [&](const std::string& m) { return s0->get(m) != nullptr; }));
    if (!t || t->kind != PyValue::Kind::Tensor) return not_the_optimizers;
  }
  return tensors == state_names.size() ? "" : not_the_optimizers;
}

std::pair<c10::impl::GenericDict, std::vector<c10::impl::GenericDict>> from_deepspeed(
    const fs::path& dir, const std::string& tag, const c10::impl::GenericDict& ds,
    const PyValue& ds_value, const fs::path& model_path, const std::vector<std::string>& names,
    const std::vector<int64_t>& numels, const std::string& type,
    const std::vector<std::string>& state_names, bool optimizer) {
  if (!fs::exists(dir / tag / optim_file(0)) && !fs::exists(dir / tag / ("bf16_" + optim_file(0))))
    return from_deepspeed_stage0(ds, ds_value, model_path, names, type, state_names, optimizer);
  auto model = new_dict();
  c10::Dict<std::string, torch::Tensor> module;
  for (auto& item : consolidated(ds_value, model_path, dir / tag))
    module.insert(item.key(), item.value());
  model.insert("module", module);
  for (const char* k : {"global_steps", "skipped_steps", "global_samples", "lr_scheduler"})
    if (ds.contains(k)) model.insert(k, ds.at(k));
  const int world = static_cast<int>(get(ds, "dp_world_size", model_path).toInt());
  model.insert("dp_world_size", static_cast<int64_t>(world));
  std::vector<c10::impl::GenericDict> optims;
  if (!optimizer) return {model, optims};
  const auto files = optim_files(dir / tag, world);
  int64_t numel = 0;
  for (int64_t n : numels) numel += n;
  for (int r = 0; r < world; ++r) {
    const fs::path& f = files[static_cast<size_t>(r)];
    const auto o = load_file(f);
    const PyValue& osd = need(*o, "optimizer_state_dict", f);
    if (r == 0 && osd.get("fp32_flat_groups"))
      return {model, from_deepspeed_stage3(files, ds_value, model_path, ds, names, numels, type,
                                           state_names)};
    const PyValue* groups = osd.get("single_partition_of_fp32_groups");
    const PyValue* base = osd.get("base_optimizer_state");
    const PyValue* state = base ? base->get("state") : nullptr;
    const PyValue* s0 = state ? state->get("0") : nullptr;
    if (!groups || groups->items.size() != 1 || !s0)
      throw CheckpointError(f.string() + ": DeepSpeed's optimizer state " +
                            (groups ? "of several parameter groups" : "in an unknown layout") +
                            " is not read by dtrain; load with load_optimizer_states = false (the "
                            "parameters, steps and scheduler position load)");
    const torch::Tensor part = groups->items[0]->tensor.reshape({-1});
    const int64_t P = part.numel(), begin = std::min<int64_t>(r * P, numel),
                  end = std::min<int64_t>((r + 1) * P, numel);
    auto od = new_dict();
    c10::List<torch::Tensor> g;
    g.push_back(part);
    od.insert("single_partition_of_fp32_groups", g);
    od.insert("begin", begin);
    od.insert("end", end);
    auto st = new_dict();
    // The names of the optimizer's own state (partition_optimizer.h) are DeepSpeed's.
    for (const std::string& n : state_names)
      st.insert(n, deepspeed_state(*s0, n, type, f).tensor.reshape({-1}).narrow(0, 0, end - begin));
    od.insert("state", st);
    od.insert("step", deepspeed_step(*s0, *base, ds, f));
    od.insert("type", type);
    auto file = new_dict();
    file.insert("optimizer_state_dict", od);
    optims.push_back(file);
  }
  return {model, optims};
}

}  // namespace dtrain::zero::ckpt

namespace dtrain::zero {

using namespace ckpt;

torch::OrderedDict<std::string, torch::Tensor> consolidated_state_dict(const std::string& dir_s,
                                                                       const std::string& tag_in) {
  const fs::path dir(dir_s);
  std::string tag = resolve_tag(dir, tag_in);
  if (tag.empty())
    throw UsageError("zero to-fp32: " + (dir / "latest").string() +
                     " does not exist; give the tag (global_step<N>)");
  const fs::path ckpt = dir / tag;
  // Stages 0-2 write one model file; DeepSpeed's stage 3 one per rank (rank 0's has the names).
  fs::path model_path = ckpt / kModelFile;
  if (!fs::exists(model_path) && fs::exists(ckpt / stage3_model_file(0)))
    model_path = ckpt / stage3_model_file(0);
  if (!fs::exists(model_path))
    throw UsageError("zero to-fp32: " + (ckpt / kModelFile).string() + " does not exist");
  return consolidated(*load_file(model_path), model_path, ckpt);
}

}  // namespace dtrain::zero
