// ZeRO checkpoints in DeepSpeed's layout, written atomically, loadable at another world size.
// One piece (~1800 lines): the writer and the readers of one layout, DeepSpeed's and dtrain's.
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
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "dtrain/checkpoint.h"
#include "dtrain/zero.h"
#include "zero/engine_impl.h"
#include "zero/pickle.h"
#include "zero/stage3_fetch.h"
#include "zero/stage3_layout.h"
#include "zero/torch_schedulers.h"

namespace fs = std::filesystem;

namespace dtrain::zero {
namespace {

using c10::IValue;

void write_file_synced(const fs::path& path, const std::vector<char>& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error("zero checkpoint: cannot create " + path.string() + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      throw Error("zero checkpoint: cannot write " + path.string() + ": " + std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    throw Error("zero checkpoint: cannot sync " + path.string() + ": " + std::strerror(errno));
}

void sync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::vector<char> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (!in || ec)
    throw UsageError("zero checkpoint: cannot read " + path.string() +
                     " (no such checkpoint file)");
  // In one piece of the file's size: growing a buffer byte by byte held up to twice the file
  // (every optimizer file of a resume passes here).
  std::vector<char> data(static_cast<size_t>(size));
  if (!in.read(data.data(), static_cast<std::streamsize>(size)) ||
      in.gcount() != static_cast<std::streamsize>(size))
    throw UsageError("zero checkpoint: cannot read " + path.string() + " (it changed while read)");
  return data;
}

detail::PyPtr load_file(const fs::path& path) {
  auto v = detail::torch_load(read_file(path), path.string());
  if (v->kind != detail::PyValue::Kind::Dict)
    throw detail::CheckpointError(path.string() + ": holds a " + v->describe() +
                                  ", not a checkpoint's dict");
  return v;
}

c10::impl::GenericDict load_dict(const fs::path& path) {
  return detail::to_ivalue(*load_file(path)).toGenericDict();
}

void save_file(const fs::path& path, const detail::PyValue& v);

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

IValue get(const c10::impl::GenericDict& d, const std::string& key, const fs::path& from) {
  auto it = d.find(key);
  if (it == d.end())
    throw Error("zero checkpoint: " + from.string() + " has no '" + key +
                "' (not a dtrain ZeRO checkpoint?)");
  return it->value();
}

std::vector<int64_t> ints(const IValue& v) {
  std::vector<int64_t> out;
  for (const auto& x : v.toListRef()) out.push_back(x.toInt());
  return out;
}

void save_file(const fs::path& path, const detail::PyValue& v) {
  write_file_synced(path, detail::torch_save(v));
}

// The model file's dict with the keys DeepSpeed's zero_to_fp32 reads: param_shapes as one
// group's OrderedDict of name -> torch.Size, shared_params (buffer_names is model_dict's), and
// `frozen`'s frozen_param_shapes and frozen_param_fragments (deepspeed_frozen_params).
detail::PyPtr deepspeed_model_file(const IValue& model,
                                   const std::pair<detail::PyPtr, detail::PyPtr>& frozen) {
  auto d = detail::from_ivalue(model);
  const auto dict = model.toGenericDict();
  const auto names = dict.at("param_names").toList();
  const auto shapes = dict.at("param_shapes").toList();
  auto group = detail::py_dict(/*ordered=*/true);
  for (size_t i = 0; i < names.size(); ++i)
    detail::py_set(group, names.get(i).toStringRef(), detail::py_size(ints(shapes.get(i))));
  for (auto& [k, v] : d->dict)
    if (k->s == "param_shapes") v = detail::py_list({group});
  detail::py_set(d, "shared_params", detail::py_dict());
  detail::py_set(d, "frozen_param_shapes", frozen.first);
  detail::py_set(d, "frozen_param_fragments", frozen.second);
  return d;
}

std::string optim_file(int rank) {
  return "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_optim_states.pt";
}
const char* kModelFile = "mp_rank_00_model_states.pt";
// The DeepSpeed release whose checkpoint layout dtrain writes (its optimizer files' ds_version,
// which DeepSpeed's loader parses and compares).
const char* kDeepSpeedVersion = "0.19.8";
// DeepSpeed's stage 3 writes one model file per rank.
std::string stage3_model_file(int rank) {
  return "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_model_states.pt";
}

// The model file's top-level keys DeepSpeed 0.19.8 (engine._common_checkpoint_state and its
// reserved metadata) or dtrain writes itself: what is not one of these is the client's.
bool own_key(const std::string& key) {
  static const std::set<std::string> keys = {
      "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
      "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd",
      "sparse_tensor_module_names", "skipped_steps", "global_steps", "global_samples",
      "dp_world_size", "mp_world_size", "ds_config", "ds_version", "checkpoint_parallel_dimensions",
      "universal_checkpoint_info",
      // dtrain's
      "param_names", "loss_scaler", "zero_stage"};
  return keys.count(key) > 0;
}

// A client_state value as the Python value DeepSpeed's torch.save would write.
detail::PyPtr py_from_json(const nlohmann::json& v, const std::string& key) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return detail::py_none();
    case nlohmann::json::value_t::boolean:
      return detail::py_bool(v.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return detail::py_int(v.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        throw UsageError("zero save_checkpoint: client_state '" + key +
                         "' holds an integer above 2^63 - 1; store it as a string");
      return detail::py_int(static_cast<int64_t>(v.get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return detail::py_float(v.get<double>());
    case nlohmann::json::value_t::string:
      return detail::py_str(v.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<detail::PyPtr> items;
      for (const auto& x : v) items.push_back(py_from_json(x, key));
      return detail::py_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto d = detail::py_dict();
      for (auto it = v.begin(); it != v.end(); ++it)
        detail::py_set(d, it.key(), py_from_json(it.value(), key));
      return d;
    }
    default:
      throw UsageError("zero save_checkpoint: client_state '" + key +
                       "' holds a binary value; store numbers, strings, lists or objects");
  }
}

// A Python value as JSON, or nullopt for what JSON cannot hold (a tensor, another object).
std::optional<nlohmann::json> json_from_py(const detail::PyValue& v) {
  using K = detail::PyValue::Kind;
  switch (v.kind) {
    case K::None:
      return nlohmann::json(nullptr);
    case K::Bool:
      return nlohmann::json(v.b);
    case K::Int:
      return nlohmann::json(v.i);
    case K::Float:
      return nlohmann::json(v.f);
    case K::Str:
      return nlohmann::json(v.s);
    case K::List:
    case K::Tuple: {
      auto out = nlohmann::json::array();
      for (const auto& x : v.items) {
        auto j = json_from_py(*x);
        if (!j) return std::nullopt;
        out.push_back(*j);
      }
      return out;
    }
    case K::Dict: {
      auto out = nlohmann::json::object();
      for (const auto& [k, x] : v.dict) {
        if (k->kind != K::Str && k->kind != K::Int) return std::nullopt;
        auto j = json_from_py(*x);
        if (!j) return std::nullopt;
        out[k->kind == K::Str ? k->s : std::to_string(k->i)] = *j;
      }
      return out;
    }
    default:
      return std::nullopt;
  }
}

// The client's keys of a model file (DeepSpeed's client_state, less DeepSpeed's own metadata).
nlohmann::json client_state_of(const detail::PyValue& model) {
  auto out = nlohmann::json::object();
  for (const auto& [k, v] : model.dict) {
    if (k->kind != detail::PyValue::Kind::Str || own_key(k->s)) continue;
    if (auto j = json_from_py(*v)) out[k->s] = *j;
  }
  return out;
}

// The model file with the caller's client_state added at the top level, as DeepSpeed adds it.
detail::PyPtr with_client_state(detail::PyPtr model, const nlohmann::json& client_state) {
  for (auto it = client_state.begin(); it != client_state.end(); ++it)
    detail::py_set(model, it.key(), py_from_json(it.value(), it.key()));
  return model;
}

std::string resolve_tag(const fs::path& dir, const std::string& tag) {
  if (!tag.empty()) return tag;
  std::ifstream in(dir / "latest");
  if (!in) return "";
  std::string t;
  std::getline(in, t);
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
  const bool bad = t == "." || t == ".." || std::any_of(t.begin(), t.end(), [](char ch) {
                     return ch == '/' || static_cast<unsigned char>(ch) < 0x20;
                   });
  if (bad)
    throw detail::CheckpointError((dir / "latest").string() +
                                  ": does not hold a tag (a directory name in " + dir.string() +
                                  "); give the tag instead");
  return t;
}

// The fp32 master (concatenated over the saved ranks) and each optimizer state, unpadded.
struct FullOptim {
  torch::Tensor master;
  std::vector<std::string> state_names;
  std::vector<torch::Tensor> state;
  int64_t step = 0;
};

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

// Refuses a checkpoint whose optimizer keeps another number of state tensors than this one's,
// or whose one state is Adagrad's on one side only (SGD's momentum is no sum of squares).
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

// `files`: every saved rank's optimizer file as a dict, in rank order; `where` names them;
// `numels`: the parameters' sizes in the flat order (for stage 3's per-parameter layout).
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

// ---- reading a rank's own part of the optimizer files (detail::TorchFile) -----------------
// The optimizer files are opened for reading on demand; of each saved rank's master and state
// a rank reads only the elements of the flat order it holds now (at another world size too),
// straight from the file into its own part: O(own part) memory, where holding every file and
// putting them together took O(model).

using detail::PyValue;

// A vector of elements spread over tensors of a file: the first `used` elements of each, in
// order (DeepSpeed's stage-3 sub-groups; a stage 1/2 partition without its padding).
struct Segments {
  std::vector<std::pair<const PyValue*, int64_t>> parts;
  int64_t numel() const {
    int64_t n = 0;
    for (const auto& p : parts) n += p.second;
    return n;
  }
};

// Elements [begin, end) of the flat order lie at `at` in such a vector.
struct Span {
  int64_t begin, end, at;
};

// Copies into `dest` (the flat order's elements [lo, lo + dest.numel())) what `spans` of `v`
// hold of them; the rest of dest is left as it is.
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

const PyValue& field(const PyValue& d, const std::string& key, const fs::path& from) {
  const PyValue* v = d.get(key);
  if (!v)
    throw Error("zero checkpoint: " + from.string() + " has no '" + key +
                "' (not a dtrain ZeRO checkpoint?)");
  return *v;
}

const PyValue* tensor_field(const PyValue& d, const std::string& key, const fs::path& from) {
  const PyValue& t = field(d, key, from);
  if (t.kind != PyValue::Kind::Tensor)
    throw detail::CheckpointError(from.string() + ": '" + key + "' is a " + t.describe() +
                                  ", not a tensor");
  return &t;
}

// One saved rank's optimizer file: where its master and state tensors are, not read yet.
struct SavedPart {
  std::unique_ptr<detail::TorchFile> file;
  fs::path path;
  std::string type;  // the optimizer's ("Adam", ..., kClientOptimizerType)
  int64_t step = 0;
  Segments master;
  std::vector<std::pair<std::string, Segments>> state;  // in the file's order
  bool per_parameter = false;  // stage 3's layout, else a contiguous slice of the flat order
  int64_t length = 0;          // contiguous: the slice's elements
  std::vector<Span> spans;     // set by the caller, who knows the other files

  // The state tensors in the order of `names` (rank 0's file's), each required.
  std::vector<const Segments*> state_in(const std::vector<std::string>& names) const {
    std::vector<const Segments*> out;
    for (const auto& n : names) {
      auto it =
          std::find_if(state.begin(), state.end(), [&](const auto& e) { return e.first == n; });
      if (it == state.end())
        throw detail::CheckpointError(path.string() + ": has no optimizer state '" + n +
                                      "' (rank 0's file has it)");
      out.push_back(&it->second);
    }
    return out;
  }
};

// A contiguous slice's `n` first elements of each of a dict's tensors, in its order.
void add_state(SavedPart& p, const PyValue& dict, int64_t n) {
  for (const auto& [k, v] : dict.dict) {
    if (k->kind != PyValue::Kind::Str || k->s == "step" || v->kind != PyValue::Kind::Tensor)
      continue;
    p.state.push_back({k->s, Segments{{{v.get(), n < 0 ? v->tensor.numel() : n}}}});
  }
}

// Where a saved rank's file sits among the others. DeepSpeed's own files say neither their
// slice of the flat order nor the step (dtrain's say both); they follow from these, as
// from_deepspeed reads them: stage 1-2's partitions are `P` elements each (the tensor's, the
// last rank's padded), and the step is the base optimizer's first state's, else its first
// param group's, else the steps DeepSpeed applied.
struct SavedRank {
  int rank = 0;
  int64_t numel = 0;          // the flat order's
  int64_t applied_steps = 0;  // the model file's global_steps - skipped_steps
};

// The name under which DeepSpeed's files hold optimizer state `name` of a `type` optimizer:
// Adagrad's sum is "exp_avg_sq" under DeepSpeedCPUAdagrad (offload_optimizer), "sum" under
// torch.optim.Adagrad; `has(n)` says whether the file holds n.
template <typename Has>
std::string deepspeed_state_name(const std::string& name, const std::string& type, Has has) {
  if (has(name) || type != "Adagrad") return name;
  return name == "sum" ? "exp_avg_sq" : name == "exp_avg_sq" ? "sum" : name;
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

// The parameters as a checkpoint holds them, in its order: each one's elements and where they
// lie in the engine's flat order (its offset there).
struct SavedOrder {
  std::vector<int64_t> numels, engine_offsets;
};

// The saved ranks' optimizer files (`files`, in rank order), one open at a time (a checkpoint
// of thousands of ranks needs one file descriptor, not thousands): each is opened, where its
// elements lie in the engine's flat order set (its parameters in the order `saved` lists them)
// and checked, and handed to `fn`; at the end the files are checked to cover the flat order
// exactly, as full_optim checks. Throws before `fn` sees a file found bad. `applied_steps`:
// SavedRank's.
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

// A DeepSpeed checkpoint as the dicts load_state reads: the module from the fp32 master
// (consolidated_state_dict), DeepSpeed's steps and scheduler position, and (stages 1-2, Adam or
// SGD) every rank's partition of the optimizer state from its base_optimizer_state.
// `names`, `numels`: the engine's parameters in its flat order.
// `ds_value`: the model file (at `model_path`) as read, `ds` that as a dict.
std::pair<c10::impl::GenericDict, std::vector<c10::impl::GenericDict>> from_deepspeed(
    const fs::path& dir, const std::string& tag, const c10::impl::GenericDict& ds,
    const PyValue& ds_value, const fs::path& model_path, const std::vector<std::string>& names,
    const std::vector<int64_t>& numels, const std::string& type,
    const std::vector<std::string>& state_names, bool optimizer);

// Why DeepSpeed's checkpoint in `ckpt` (its model file `model`, at `model_path`) cannot be read
// in parts (load_own_part's `deepspeed`); "" when it can: optimizer files of stages 1-3, rank
// 0's of one parameter group at stages 1-2, holding exactly the optimizer's `state_names`, and
// the engine's parameters (`names`, `numels`) in any order (saved_order places them). Anything
// else from_deepspeed reads whole (it also reads stage 0 and the other layouts or says why
// not). kStageZero: the checkpoint has no optimizer files.
constexpr const char* kStageZero = "stage 0";
// The parameters' names and shapes, per group: DeepSpeed's param_shapes (a list of
// OrderedDicts name -> torch.Size), or dtrain's older param_names + param_shapes lists.
using SavedGroups = std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>>;
SavedGroups saved_parameters(const PyValue& model, const fs::path& model_path);
// The module of a model file (as read, at `model_path`) from the fp32 master of the optimizer
// files beside it in `ckpt` (consolidated_state_dict's work, from a file read once).
torch::OrderedDict<std::string, torch::Tensor> consolidated(const PyValue& model_file,
                                                            const fs::path& model_path,
                                                            const fs::path& ckpt);
// DeepSpeed's checkpoint's parameters (its model file `model`) in its order, placed by name in
// the engine's flat order (`names`, `offsets`, `numels`); nullopt when they are not the
// engine's parameters (another name, count or size).
std::optional<SavedOrder> saved_order(const PyValue& model, const fs::path& model_path,
                                      const std::vector<std::string>& names,
                                      const std::vector<int64_t>& offsets,
                                      const std::vector<int64_t>& numels);
std::string why_not_streamed(const fs::path& ckpt, const PyValue& model, const fs::path& model_path,
                             const std::vector<std::string>& names,
                             const std::vector<int64_t>& numels,
                             const std::vector<std::string>& state_names, const std::string& type);

// The optimizer files of a checkpoint directory, in rank order (DeepSpeed names bf16 runs'
// files bf16_zero_pp_rank_*).
std::vector<fs::path> optim_files(const fs::path& ckpt, int world);

// Whether the model file's module holds `name` as an empty tensor (a stage-3 file in
// DeepSpeed's layout, whose parameters live in the optimizer files).
bool module_parameter_is_empty(const c10::impl::GenericDict& d, const std::string& name,
                               const fs::path& model_path) {
  auto module = get(d, "module", model_path).toGenericDict();
  auto it = module.find(name);
  return it != module.end() && it->value().isTensor() && it->value().toTensor().numel() == 0;
}

// A checkpoint's frozen parameters as DeepSpeed's zero_to_fp32 puts them together
// (_zero2_merge_frozen_params, _zero3_merge_frozen_params): name -> the whole parameter, in its
// saved dtype, for the names in `wanted` (every one when empty). `model` is the model file at
// `model_path`. A stage-3 checkpoint (`model_path` is rank 0's zero_pp_rank_0 file) holds each
// as every saved rank's piece in that rank's model file, the pieces concatenated and cut to the
// parameter's size; a stage-2 one whole in its one model file. Nothing where the file has no
// frozen_param_shapes (stages 0-1, and dtrain's checkpoints before they were written).
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

}  // namespace

namespace detail {

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

}  // namespace detail

namespace {

using detail::CheckpointError;
using detail::PyValue;

const PyValue& need(const PyValue& d, const std::string& key, const fs::path& from) {
  const PyValue* v = d.get(key);
  if (!v)
    throw CheckpointError(from.string() + ": has no '" + key +
                          "' (not a ZeRO checkpoint of DeepSpeed or dtrain?)");
  return *v;
}

std::vector<int64_t> shape_of(const PyValue& v) {
  std::vector<int64_t> out;
  for (const auto& x : v.items) out.push_back(x->i);
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

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::vector<fs::path> optim_files(const fs::path& ckpt, int world) {
  std::vector<fs::path> out;
  for (int r = 0; r < world; ++r) {
    fs::path p = ckpt / optim_file(r);
    if (!fs::exists(p) && fs::exists(ckpt / ("bf16_" + optim_file(r))))
      p = ckpt / ("bf16_" + optim_file(r));
    if (!fs::exists(p))
      throw CheckpointError((ckpt / optim_file(r)).string() +
                            " does not exist (the checkpoint of " + std::to_string(world) +
                            " ranks is incomplete)");
    out.push_back(p);
  }
  return out;
}

}  // namespace

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

namespace {

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

}  // namespace

void save_state_dict(const torch::OrderedDict<std::string, torch::Tensor>& dict,
                     const std::string& path) {
  auto out = detail::py_dict(/*ordered=*/true);
  for (auto& item : dict) detail::py_set(out, item.key(), detail::py_tensor(item.value()));
  auto tmp = path + ".tmp";
  save_file(tmp, *out);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp);
    throw Error("cannot write " + path + ": " + ec.message());
  }
}

torch::OrderedDict<std::string, torch::Tensor> load_state_dict_file(const std::string& path) {
  auto v = load_file(path);
  torch::OrderedDict<std::string, torch::Tensor> out;
  for (const auto& [k, x] : v->dict) {
    if (k->kind != PyValue::Kind::Str || x->kind != PyValue::Kind::Tensor)
      throw CheckpointError(path + ": not a state dict ({name: tensor}); it holds a " +
                            x->describe() + " under a " + k->describe() + " key");
    out.insert(k->s, x->tensor);
  }
  return out;
}

}  // namespace dtrain::zero
