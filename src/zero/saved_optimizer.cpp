// Reading the optimizer files of a ZeRO checkpoint (saved_optimizer.h).
#include "zero/saved_optimizer.h"

#include <algorithm>

#include "dtrain/error.h"
#include "zero/stage3_layout.h"

namespace dtrain::zero::ckpt {
namespace {

// A stage-3 file's state as its base optimizer keeps it (one parameter per sub-group, keyed 0,
// 1, ...): each named tensor with its sub-groups concatenated, the rank's per-parameter pieces.
std::vector<std::pair<std::string, torch::Tensor>> stage3_state(const c10::impl::GenericDict& d,
                                                                const fs::path& path) {
  const auto base = get(d, "optimizer_state_dict", path);
  if (!base.isGenericDict())
    throw detail::CheckpointError(path.string() + ": optimizer_state_dict is not a dict");
  const auto states = get(base.toGenericDict(), "state", path);
  if (!states.isGenericDict())
    throw detail::CheckpointError(path.string() + ": optimizer_state_dict has no state");
  const auto by_group = states.toGenericDict();
  std::vector<std::string> names;
  std::vector<std::vector<torch::Tensor>> pieces;
  for (int64_t g = 0; g < static_cast<int64_t>(by_group.size()); ++g) {
    const std::string key = std::to_string(g);
    if (!by_group.contains(key) || !by_group.at(key).isGenericDict())
      throw detail::CheckpointError(path.string() + ": the optimizer state has no sub-group " +
                                    key);
    size_t k = 0;
    for (const auto& e : by_group.at(key).toGenericDict()) {
      if (e.key().toStringRef() == "step" || !e.value().isTensor()) continue;
      if (g == 0) {
        names.push_back(e.key().toStringRef());
        pieces.emplace_back();
      }
      if (k >= names.size() || names[k] != e.key().toStringRef())
        throw detail::CheckpointError(path.string() + ": sub-group " + key +
                                      " holds other optimizer state than sub-group 0");
      pieces[k++].push_back(e.value().toTensor().reshape({-1}));
    }
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t k = 0; k < names.size(); ++k) out.emplace_back(names[k], torch::cat(pieces[k]));
  return out;
}

// A rank's optimizer state tensors by name, in its optimizer's order: dtrain's "state" (the
// rank's elements), or in a stage 1/2 file that holds DeepSpeed's base_optimizer_state instead,
// that optimizer's one parameter's tensors (the padded partition, cut to the rank's elements).
std::vector<std::pair<std::string, torch::Tensor>> rank_state(const c10::impl::GenericDict& d,
                                                              const fs::path& path) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (!d.contains("state") && d.contains("fp32_flat_groups") && d.contains("optimizer_state_dict"))
    return stage3_state(d, path);
  if (d.contains("state") || !d.contains("base_optimizer_state")) {
    for (const auto& e : get(d, "state", path).toGenericDict())
      out.emplace_back(e.key().toStringRef(), e.value().toTensor());
    return out;
  }
  const int64_t n = get(d, "end", path).toInt() - get(d, "begin", path).toInt();
  const auto base = get(d, "base_optimizer_state", path);
  if (!base.isGenericDict())
    throw detail::CheckpointError(path.string() + ": base_optimizer_state is not a dict");
  const auto states = get(base.toGenericDict(), "state", path);
  if (!states.isGenericDict() || states.toGenericDict().size() > 1)
    throw detail::CheckpointError(path.string() +
                                  ": base_optimizer_state has no single parameter's state");
  for (const auto& p : states.toGenericDict())
    for (const auto& e : p.value().toGenericDict())
      if (e.key().toStringRef() != "step" && e.value().isTensor())
        out.emplace_back(e.key().toStringRef(), e.value().toTensor().reshape({-1}).narrow(0, 0, n));
  return out;
}

// `st`'s tensors in the order of `names` (rank 0's file's), each required.
std::vector<torch::Tensor> state_in_order(
    const std::vector<std::pair<std::string, torch::Tensor>>& st,
    const std::vector<std::string>& names, const fs::path& path) {
  std::vector<torch::Tensor> out;
  for (const auto& name : names) {
    auto it = std::find_if(st.begin(), st.end(), [&](const auto& e) { return e.first == name; });
    if (it == st.end())
      throw detail::CheckpointError(path.string() + ": has no optimizer state '" + name +
                                    "' (rank 0's file has it)");
    out.push_back(it->second);
  }
  return out;
}

// Adagrad's one state tensor: torch.optim.Adagrad's "sum", or its CPU Adagrad's "exp_avg_sq"
// (offload_optimizer). Either loads into the other: the same running sum of squares.
bool adagrad_state(const std::vector<std::string>& names) {
  return names.size() == 1 && (names[0] == "sum" || names[0] == "exp_avg_sq");
}

// A contiguous slice's `n` first elements of each of a dict's tensors, in its order.
void add_state(SavedPart& p, const PyValue& dict, int64_t n) {
  for (const auto& [k, v] : dict.dict) {
    if (k->kind != PyValue::Kind::Str || k->s == "step" || v->kind != PyValue::Kind::Tensor)
      continue;
    p.state.push_back({k->s, Segments{{{v.get(), n < 0 ? v->tensor.numel() : n}}}});
  }
}

int64_t base_optimizer_step(const detail::TorchFile& f, const PyValue* base, int64_t applied) {
  const PyValue* state = base ? base->get("state") : nullptr;
  const PyValue* s0 = state ? state->get("0") : nullptr;
  const PyValue* step = s0 ? s0->get("step") : nullptr;
  const PyValue* groups = base ? base->get("param_groups") : nullptr;
  if (!step && groups && !groups->items.empty()) step = groups->items[0]->get("step");
  if (!step) return applied;
  return step->kind == PyValue::Kind::Tensor ? static_cast<int64_t>(f.load(*step).item<double>())
                                             : step->as_int(f.path() + ": step");
}

// Opens rank r's file of the layouts optim_dict writes (and rank_state reads) and DeepSpeed's:
// stage 0's fp32_flat, stage 1-2's single_partition_of_fp32_groups (its state dtrain's "state"
// or the base optimizer's one parameter), stage 3's fp32_flat_groups (its state dtrain's
// "state" or the base optimizer's per sub-group).
SavedPart open_saved_part(const fs::path& path, const SavedRank& at) {
  if (!fs::exists(path))
    throw UsageError("zero checkpoint: cannot read " + path.string() +
                     " (no such checkpoint file)");
  SavedPart p;
  p.path = path;
  p.file = std::make_unique<detail::TorchFile>(path.string());
  const PyValue& root = *p.file->value();
  if (root.kind != PyValue::Kind::Dict)
    throw detail::CheckpointError(path.string() + ": holds a " + root.describe() +
                                  ", not a checkpoint's dict");
  const PyValue& o = field(root, "optimizer_state_dict", path);
  if (const PyValue* t = o.get("type"); t && t->kind == PyValue::Kind::Str) p.type = t->s;
  if (const PyValue* step = o.get("step"))
    p.step = step->as_int(path.string() + ": step");
  else  // DeepSpeed's
    p.step = base_optimizer_step(
        *p.file, o.get(o.get("fp32_flat_groups") ? "optimizer_state_dict" : "base_optimizer_state"),
        at.applied_steps);
  if (const PyValue* groups = o.get("fp32_flat_groups")) {
    p.per_parameter = true;
    for (const auto& t : groups->items) {
      if (t->kind != PyValue::Kind::Tensor)
        throw detail::CheckpointError(path.string() + ": fp32_flat_groups holds a " +
                                      t->describe() + ", not a tensor");
      p.master.parts.push_back({t.get(), t->tensor.numel()});
    }
    if (const PyValue* st = o.get("state")) {
      add_state(p, *st, -1);
      return p;
    }
    // The base optimizer's state: one parameter per sub-group, keyed 0, 1, ...
    const PyValue& base = field(o, "optimizer_state_dict", path);
    const PyValue& by_group = field(base, "state", path);
    for (size_t g = 0; g < by_group.dict.size(); ++g) {
      const PyValue* sub = by_group.get(std::to_string(g));
      if (!sub || sub->kind != PyValue::Kind::Dict)
        throw detail::CheckpointError(path.string() + ": the optimizer state has no sub-group " +
                                      std::to_string(g));
      size_t k = 0;
      for (const auto& [name, v] : sub->dict) {
        if (name->s == "step" || v->kind != PyValue::Kind::Tensor) continue;
        if (g == 0) p.state.push_back({name->s, {}});
        if (k >= p.state.size() || p.state[k].first != name->s)
          throw detail::CheckpointError(path.string() + ": sub-group " + std::to_string(g) +
                                        " holds other optimizer state than sub-group 0");
        p.state[k++].second.parts.push_back({v.get(), v->tensor.numel()});
      }
    }
    return p;
  }
  if (o.get("fp32_flat")) {
    const PyValue* t = tensor_field(o, "fp32_flat", path);
    p.length = t->tensor.numel();
    p.master.parts.push_back({t, p.length});
    add_state(p, field(o, "state", path), -1);
    return p;
  }
  // Stages 1-2: the padded partition; the rank's elements are [begin, end).
  const PyValue& groups = field(o, "single_partition_of_fp32_groups", path);
  if (groups.items.empty() || groups.items[0]->kind != PyValue::Kind::Tensor)
    throw detail::CheckpointError(path.string() +
                                  ": single_partition_of_fp32_groups holds no "
                                  "tensor");
  if (o.get("begin")) {
    p.length = field(o, "end", path).as_int("end") - field(o, "begin", path).as_int("begin");
  } else {  // DeepSpeed's: partitions of P, the padding on the last
    const int64_t P = groups.items[0]->tensor.numel();
    p.length = std::min(at.numel, (at.rank + 1) * P) - std::min(at.numel, at.rank * P);
  }
  p.master.parts.push_back({groups.items[0].get(), p.length});
  if (const PyValue* st = o.get("state")) {
    add_state(p, *st, p.length);
  } else {
    const PyValue& base = field(o, "base_optimizer_state", path);
    const PyValue& states = field(base, "state", path);
    if (states.kind != PyValue::Kind::Dict || states.dict.size() > 1)
      throw detail::CheckpointError(path.string() +
                                    ": base_optimizer_state has no single parameter's state");
    for (const auto& e : states.dict) add_state(p, *e.second, p.length);
  }
  return p;
}

}  // namespace

void check_state_count(const std::vector<std::string>& saved,
                       const std::vector<std::string>& here) {
  if (saved.size() != here.size())
    throw Error("zero load_checkpoint: the checkpoint's optimizer has " +
                std::to_string(saved.size()) + " state tensors per element, this one " +
                std::to_string(here.size()) + " (another optimizer type?)");
  if (saved.size() == 1 && (adagrad_state(saved) != adagrad_state(here)))
    throw Error("zero load_checkpoint: the checkpoint's optimizer keeps '" + saved[0] +
                "', this one '" + here[0] +
                "' (another optimizer type); load with load_optimizer_states = false to start "
                "the optimizer afresh");
}

FullOptim full_optim(const std::vector<c10::impl::GenericDict>& files,
                     const std::function<fs::path(int)>& where,
                     const std::vector<int64_t>& numels) {
  FullOptim f;
  std::vector<torch::Tensor> masters;
  std::vector<std::vector<torch::Tensor>> states;
  bool per_parameter = false;
  for (int r = 0; r < static_cast<int>(files.size()); ++r) {
    const fs::path path = where(r);
    auto d = get(files[static_cast<size_t>(r)], "optimizer_state_dict", path).toGenericDict();
    if (d.contains("fp32_flat_groups")) {  // stage 3: DeepSpeed's layout
      per_parameter = true;
      std::vector<torch::Tensor> groups;
      for (const auto& t : get(d, "fp32_flat_groups", path).toListRef())
        groups.push_back(t.toTensor().reshape({-1}));
      masters.push_back(torch::cat(groups));
    } else if (d.contains("fp32_flat")) {
      masters.push_back(get(d, "fp32_flat", path).toTensor());
    } else {  // stages 1-2: DeepSpeed's padded partition; this rank's elements are [begin, end)
      auto groups = get(d, "single_partition_of_fp32_groups", path).toList();
      const int64_t n = get(d, "end", path).toInt() - get(d, "begin", path).toInt();
      masters.push_back(groups.get(0).toTensor().narrow(0, 0, n));
    }
    f.step = get(d, "step", path).toInt();
    const auto st = rank_state(d, path);
    if (r == 0)
      for (const auto& e : st) f.state_names.push_back(e.first);
    if (states.size() < f.state_names.size()) states.resize(f.state_names.size());
    const auto ordered = state_in_order(st, f.state_names, path);
    for (size_t k = 0; k < ordered.size(); ++k) states[k].push_back(ordered[k]);
  }
  if (per_parameter) {
    const std::string what = files.empty() ? std::string() : where(0).string();
    f.master = detail::from_per_parameter(masters, numels, what);
    for (auto& s : states) f.state.push_back(detail::from_per_parameter(s, numels, what));
    return f;
  }
  f.master = torch::cat(masters);
  for (auto& s : states) f.state.push_back(torch::cat(s));
  return f;
}

void read_overlap(const detail::TorchFile& f, const Segments& v, const std::vector<Span>& spans,
                  int64_t lo, const torch::Tensor& dest) {
  const int64_t hi = lo + dest.numel();
  for (const auto& s : spans) {
    const int64_t a = std::max(lo, s.begin), b = std::min(hi, s.end);
    if (a >= b) continue;
    // v's elements [from, from + b - a), across its segments.
    int64_t from = s.at + (a - s.begin), out = a - lo, left = b - a, seg_start = 0;
    for (const auto& [t, used] : v.parts) {
      if (left == 0) break;
      if (from < seg_start + used) {
        const int64_t off = from - seg_start, n = std::min(left, used - off);
        f.read(*t, off, dest.narrow(0, out, n));
        from += n;
        out += n;
        left -= n;
      }
      seg_start += used;
    }
    if (left > 0)
      throw detail::CheckpointError(f.path() +
                                    ": holds fewer elements than its part of the "
                                    "flat order needs (a corrupt file)");
  }
}

void for_each_saved_part(const std::vector<fs::path>& files, const SavedOrder& saved, int64_t numel,
                         int64_t applied_steps,
                         const std::function<void(int, const SavedPart&)>& fn) {
  const auto& numels = saved.numels;
  const int world = static_cast<int>(files.size());
  auto check_length = [&](int r, const SavedPart& p, const Segments& v, int64_t need) {
    for (const auto& [t, used] : v.parts)
      if (used > t->tensor.numel())
        throw detail::CheckpointError(p.path.string() + ": holds a tensor of " +
                                      std::to_string(t->tensor.numel()) +
                                      " elements where its partition has " + std::to_string(used));
    if (need >= 0 && v.numel() != need)
      throw detail::CheckpointError(
          p.path.string() + ": rank " + std::to_string(r) + "'s stage-3 flat group has " +
          std::to_string(v.numel()) + " elements; the model's " + std::to_string(numels.size()) +
          " parameters over " + std::to_string(world) + " ranks need " + std::to_string(need) +
          " (another model, or a checkpoint of another world size?)");
  };
  int64_t at = 0;
  bool per_parameter = false;
  fs::path first;
  for (int r = 0; r < world; ++r) {
    SavedPart p = open_saved_part(files[static_cast<size_t>(r)], {r, numel, applied_steps});
    if (r == 0) {
      per_parameter = p.per_parameter;
      first = p.path;
    } else if (p.per_parameter != per_parameter) {
      throw detail::CheckpointError(p.path.string() + ": holds another layout than " +
                                    first.string());
    }
    if (p.per_parameter) {
      // Rank r holds elements [r*q, min((r+1)*q, n)) of each parameter of n, q = ceil(n/world).
      int64_t pos = 0;
      for (size_t j = 0; j < numels.size(); ++j) {
        const int64_t n = numels[j], offset = saved.engine_offsets[j];
        const int64_t q = detail::per_parameter_part(n, world);
        const int64_t lo = offset + std::min(n, r * q), hi = offset + std::min(n, (r + 1) * q);
        if (hi > lo) p.spans.push_back({lo, hi, pos});
        pos += q;
      }
      check_length(r, p, p.master, pos);
      for (const auto& s : p.state) check_length(r, p, s.second, pos);
    } else {
      // Its slice [at, at + length) of the saved flat order, parameter by parameter where they
      // lie in the engine's (one span when the orders agree).
      int64_t saved_offset = 0;
      for (size_t j = 0; j < numels.size(); ++j) {
        const int64_t a = std::max(at, saved_offset),
                      b = std::min(at + p.length, saved_offset + numels[j]);
        if (a < b) {
          const int64_t begin = saved.engine_offsets[j] + (a - saved_offset);
          if (!p.spans.empty() && p.spans.back().end == begin &&
              p.spans.back().at + (p.spans.back().end - p.spans.back().begin) == a - at)
            p.spans.back().end = begin + (b - a);
          else
            p.spans.push_back({begin, begin + (b - a), a - at});
        }
        saved_offset += numels[j];
      }
      if (at + p.length > saved_offset)  // the padding past the parameters
        p.spans.push_back({numel + (std::max(at, saved_offset) - saved_offset),
                           numel + (at + p.length - saved_offset),
                           std::max(at, saved_offset) - at});
      at += p.length;
      check_length(r, p, p.master, -1);
      for (const auto& s : p.state) check_length(r, p, s.second, -1);
    }
    fn(r, p);
  }
  if (!per_parameter && at != numel)
    throw Error("zero load_checkpoint: the checkpoint's optimizer state covers " +
                std::to_string(at) + " parameters, the model has " + std::to_string(numel));
}

}  // namespace dtrain::zero::ckpt
