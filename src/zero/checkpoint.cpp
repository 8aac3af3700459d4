// ZeRO checkpoints in DeepSpeed's layout, written atomically, loadable at another world size.
//   DIR/latest                                       the tag, e.g. "global_step100"
//   DIR/TAG/mp_rank_00_model_states.pt               rank 0: the module (full), steps, scheduler
//   DIR/TAG/zero_pp_rank_<r>_mp_rank_00_optim_states.pt   rank r: its slice of the fp32 master
//                                                    parameters and of the optimizer state
// Files are pickles of dicts of tensors (torch::pickle_save: Python's torch.load reads them).
// Each rank's optimizer file holds the elements [r*P, min((r+1)*P, numel)) of the flat
// (unpadded) parameter order, whatever the stage, so a load at another world size
// concatenates the files and takes its own new slice.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "dtrain/zero.h"
#include "zero/engine_impl.h"
#include "zero/stage3_fetch.h"

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
  if (!in)
    throw UsageError("zero checkpoint: cannot read " + path.string() +
                     " (no such checkpoint file)");
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

c10::impl::GenericDict load_dict(const fs::path& path) {
  auto v = torch::pickle_load(read_file(path));
  if (!v.isGenericDict())
    throw Error("zero checkpoint: " + path.string() + " does not hold a dict");
  return v.toGenericDict();
}

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

std::string optim_file(int rank) {
  return "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_optim_states.pt";
}
const char* kModelFile = "mp_rank_00_model_states.pt";

std::string resolve_tag(const fs::path& dir, const std::string& tag) {
  if (!tag.empty()) return tag;
  std::ifstream in(dir / "latest");
  if (!in) return "";
  std::string t;
  std::getline(in, t);
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
  return t;
}

// The fp32 master (concatenated over the saved ranks) and each optimizer state, unpadded.
struct FullOptim {
  torch::Tensor master;
  std::vector<std::string> state_names;
  std::vector<torch::Tensor> state;
  int64_t step = 0;
};

// `files`: every saved rank's optimizer file as a dict, in rank order; `where` names them.
FullOptim full_optim(const std::vector<c10::impl::GenericDict>& files,
                     const std::function<fs::path(int)>& where) {
  FullOptim f;
  std::vector<torch::Tensor> masters;
  std::vector<std::vector<torch::Tensor>> states;
  for (int r = 0; r < static_cast<int>(files.size()); ++r) {
    const fs::path path = where(r);
    auto d = get(files[static_cast<size_t>(r)], "optimizer_state_dict", path).toGenericDict();
    masters.push_back(get(d, "fp32_flat", path).toTensor());
    f.step = get(d, "step", path).toInt();
    auto st = get(d, "state", path).toGenericDict();
    if (r == 0)
      for (auto& e : st) f.state_names.push_back(e.key().toStringRef());
    if (states.size() < f.state_names.size()) states.resize(f.state_names.size());
    for (size_t k = 0; k < f.state_names.size(); ++k)
      states[k].push_back(get(st, f.state_names[k], path).toTensor());
  }
  f.master = torch::cat(masters);
  for (auto& s : states) f.state.push_back(torch::cat(s));
  return f;
}

FullOptim read_full_optim(const fs::path& ckpt, int saved_world) {
  std::vector<c10::impl::GenericDict> files;
  for (int r = 0; r < saved_world; ++r) files.push_back(load_dict(ckpt / optim_file(r)));
  return full_optim(files, [&](int r) { return ckpt / optim_file(r); });
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
  if (build) {
    auto d = new_dict();
    c10::Dict<std::string, torch::Tensor> module_dict;
    for (auto& item : module_.named_parameters(true))
      module_dict.insert(item.key(), item.value().detach().clone());
    for (auto& item : module_.named_buffers(true))
      if (item.value().defined()) module_dict.insert(item.key(), item.value().detach().clone());
    d.insert("module", module_dict);
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
    d.insert("global_samples", global_steps_ * config_.train_batch_size);
    auto sched = new_dict();
    sched.insert("last_batch_iteration", scheduler_.iteration());
    d.insert("lr_scheduler", sched);
    d.insert("loss_scaler", c10::List<double>(scaler_.state()));
    d.insert("dp_world_size", static_cast<int64_t>(world_));
    d.insert("mp_world_size", static_cast<int64_t>(1));
    d.insert("zero_stage", static_cast<int64_t>(config_.zero.stage));
    d.insert("ds_config", config_.raw.dump());
    d.insert("ds_version", std::string("dtrain-zero-1"));
    out = d;
  }
  if (policy_.parameters() && !was_gathered) release_parameters();
  bytes_this_step_ = bytes_before;
  return out;
}

IValue EngineImpl::optim_state() {
  torch::NoGradGuard ng;
  torch::Tensor w = update_target();
  const int64_t begin = std::min<int64_t>(rank_ * part_, numel_),
                end = std::min<int64_t>((rank_ + 1) * part_, numel_);
  const int64_t local = policy_.optimizer() ? 0 : begin;  // where [begin, end) lies in w
  auto slice = [&](const torch::Tensor& t) {
    return t.narrow(0, local, end - begin).to(torch::kCPU, master_dtype_, false, true);
  };
  auto o = new_dict();
  o.insert("zero_stage", static_cast<int64_t>(config_.zero.stage));
  o.insert("partition_count", static_cast<int64_t>(world_));
  o.insert("rank", static_cast<int64_t>(rank_));
  o.insert("numel", numel_);
  o.insert("begin", begin);
  o.insert("end", end);
  o.insert("fp32_flat", slice(w));
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

void EngineImpl::save_checkpoint(const std::string& dir_s, const std::string& tag) {
  if (tag.empty() || tag.find('/') != std::string::npos)
    throw UsageError("zero save_checkpoint: tag must be a non-empty name without '/', got '" + tag +
                     "'");
  const fs::path dir(dir_s), tmp = dir / ("." + tag + ".tmp"), final_dir = dir / tag;
  if (rank_ == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    fs::remove_all(tmp, ec);
    if (!fs::create_directories(tmp, ec) && ec)
      throw Error("zero save_checkpoint: cannot create " + tmp.string() + ": " + ec.message());
  }
  group_->barrier();
  // Rank 0: the module (stage 3 gathers it for the save).
  IValue model = model_state(rank_ == 0);
  if (rank_ == 0) write_file_synced(tmp / kModelFile, torch::pickle_save(model));
  // Every rank: its slice of the master and the optimizer state.
  write_file_synced(tmp / optim_file(rank_), torch::pickle_save(optim_state()));
  sync_dir(tmp);
  group_->barrier();
  if (rank_ == 0) {
    std::error_code ec;
    const fs::path old = dir / ("." + tag + ".old");
    fs::remove_all(old, ec);
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fs::remove_all(old, ec);
    std::string t = tag;
    write_file_synced(dir / "latest.tmp", std::vector<char>(t.begin(), t.end()));
    fs::rename(dir / "latest.tmp", dir / "latest");
    sync_dir(dir);
  }
  group_->barrier();
}

std::string EngineImpl::load_checkpoint(const std::string& dir_s, const std::string& tag_in,
                                        const LoadCheckpointOptions& opts) {
  const fs::path dir(dir_s);
  std::string tag = resolve_tag(dir, tag_in);
  if (tag.empty()) return "";
  const fs::path ckpt = dir / tag, model_path = ckpt / kModelFile;
  if (!fs::exists(model_path))
    throw UsageError("zero load_checkpoint: " + model_path.string() + " does not exist");
  auto d = load_dict(model_path);
  const int saved_world = static_cast<int>(get(d, "dp_world_size", model_path).toInt());
  std::vector<c10::impl::GenericDict> optims;
  if (opts.load_optimizer_states) {
    for (int r = 0; r < saved_world; ++r) optims.push_back(load_dict(ckpt / optim_file(r)));
  }
  load_state(d, optims, opts, model_path.string());
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
  for (auto& item : module_.named_buffers(true)) {
    auto it = module_dict.find(item.key());
    if (it != module_dict.end() && item.value().defined())
      item.value().detach().copy_(it->value().toTensor());
  }
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
    auto f = full_optim(optims, [&](int r) {
      return model_path.filename() == kModelFile
                 ? model_path.parent_path() / optim_file(r)
                 : fs::path(where + " (optimizer partition " + std::to_string(r) + ")");
    });
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
    if (f.state.size() != state.size())
      throw Error("zero load_checkpoint: the checkpoint's optimizer has " +
                  std::to_string(f.state.size()) + " state tensors per element, this one " +
                  std::to_string(state.size()) + " (another optimizer type?)");
    for (size_t k = 0; k < state.size(); ++k) state[k].copy_(mine(f.state[k]));
    opt_step_ = f.step;
  } else if (master_.defined()) {
    master_.copy_(policy_.mine(full, rank_, part_));
  }
  if (opts.load_lr_scheduler_states) {
    auto s = get(d, "lr_scheduler", model_path).toGenericDict();
    scheduler_.set_iteration(get(s, "last_batch_iteration", model_path).toInt());
  }
  auto ls = get(d, "loss_scaler", model_path).toDoubleList();
  scaler_.set_state(std::vector<double>(ls.begin(), ls.end()));
  global_steps_ = get(d, "global_steps", model_path).toInt();
  skipped_steps_ = get(d, "skipped_steps", model_path).toInt();
  micro_steps_ = global_steps_ * config_.gradient_accumulation_steps;
  if (flat_grads_.defined()) flat_grads_.zero_();
  if (grad_part_.defined()) grad_part_.zero_();
}

}  // namespace detail

torch::OrderedDict<std::string, torch::Tensor> consolidated_state_dict(const std::string& dir_s,
                                                                       const std::string& tag_in) {
  const fs::path dir(dir_s);
  std::string tag = resolve_tag(dir, tag_in);
  if (tag.empty())
    throw UsageError("zero to-fp32: " + (dir / "latest").string() +
                     " does not exist; give the tag (global_step<N>)");
  const fs::path ckpt = dir / tag, model_path = ckpt / kModelFile;
  if (!fs::exists(model_path))
    throw UsageError("zero to-fp32: " + model_path.string() + " does not exist");
  auto d = load_dict(model_path);
  auto module_dict = get(d, "module", model_path).toGenericDict();
  auto names = get(d, "param_names", model_path).toList();
  auto shapes = get(d, "param_shapes", model_path).toList();
  const int saved_world = static_cast<int>(get(d, "dp_world_size", model_path).toInt());
  auto f = read_full_optim(ckpt, saved_world);
  std::map<std::string, torch::Tensor> params;
  int64_t off = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    auto shape = shapes.get(i).toIntVector();
    int64_t n = 1;
    for (auto s : shape) n *= s;
    params[names.get(i).toStringRef()] = f.master.narrow(0, off, n).view(shape).clone();
    off += n;
  }
  torch::OrderedDict<std::string, torch::Tensor> out;
  for (auto& e : module_dict) {
    const auto& k = e.key().toStringRef();
    auto it = params.find(k);
    out.insert(k, it != params.end() ? it->second : e.value().toTensor());
  }
  return out;
}

void save_state_dict(const torch::OrderedDict<std::string, torch::Tensor>& dict,
                     const std::string& path) {
  c10::Dict<std::string, torch::Tensor> d;
  for (auto& item : dict) d.insert(item.key(), item.value());
  auto tmp = path + ".tmp";
  write_file_synced(tmp, torch::pickle_save(d));
  fs::rename(tmp, path);
}

torch::OrderedDict<std::string, torch::Tensor> load_state_dict_file(const std::string& path) {
  auto v = torch::pickle_load(read_file(path));
  if (!v.isGenericDict()) throw Error(path + ": not a state dict (a pickled {name: tensor} dict)");
  torch::OrderedDict<std::string, torch::Tensor> out;
  for (auto& e : v.toGenericDict()) out.insert(e.key().toStringRef(), e.value().toTensor());
  return out;
}

}  // namespace dtrain::zero
