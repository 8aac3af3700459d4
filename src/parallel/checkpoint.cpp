#include "dtrain/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "dtrain/env.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"
#include "parallel/checkpoint_files.h"

namespace dtrain {

namespace {

// The archive layout (a TorchScript-style zip written by torch::serialize::OutputArchive):
//   format          string  kFormat: tells a dtrain checkpoint from any other torch archive
//   version         int     kVersion
//   parameters/     the model's parameters by their dotted names (named_parameters())
//   buffers/        the model's buffers likewise
//   optimizer/      Optimizer::save() output, when an optimizer was given
//   step, epoch, sampler_epoch, batch_in_epoch   int
//   metadata        string  JSON object of TrainingState::metadata
//   rng             uint8 tensor: the default CPU generator's state, when save_rng
constexpr const char* kFormat = "dtrain.checkpoint";
constexpr int64_t kVersion = 1;

std::string errno_text(int err) { return std::string(std::strerror(err)); }

// The caller's rank when SaveOptions leaves it out: the default group's, else the launcher's
// RANK, else 0 (a single process).
int resolve_rank(const std::optional<int>& given) {
  if (given) return *given;
  try {
    return default_group()->rank();
  } catch (const UsageError&) {
    // No group: fall through to the environment.
  }
  if (auto env = WorkerEnv::from_environ()) return env->rank;
  return 0;
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

// Closes a descriptor on every path out of a scope; the happy path closes it explicitly
// first to see close()'s error.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

void fsync_directory(const std::string& dir, const std::string& path) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    throw Error("save_checkpoint(" + path + "): cannot open directory " + dir +
                " to fsync it: " + errno_text(errno));
  }
  FdCloser closer{fd};
  if (::fsync(fd) != 0) {
    throw Error("save_checkpoint(" + path + "): fsync of directory " + dir +
                " failed: " + errno_text(errno));
  }
}

torch::serialize::OutputArchive build_archive(torch::nn::Module& model,
                                              torch::optim::Optimizer* optimizer,
                                              const TrainingState& state, bool save_rng) {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(std::string(kFormat)));
  archive.write("version", c10::IValue(kVersion));

  // Undefined entries (Linear without bias registers an undefined "bias") carry no data;
  // load skips them the same way.
  torch::serialize::OutputArchive params(archive.compilation_unit());
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (item.value().defined()) params.write(item.key(), item.value().detach());
  }
  archive.write("parameters", params);
  torch::serialize::OutputArchive buffers(archive.compilation_unit());
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    if (item.value().defined())
      buffers.write(item.key(), item.value().detach(), /*is_buffer=*/true);
  }
  archive.write("buffers", buffers);

  if (optimizer != nullptr) {
    torch::serialize::OutputArchive opt(archive.compilation_unit());
    optimizer->save(opt);
    archive.write("optimizer", opt);
  }

  archive.write("step", c10::IValue(state.step));
  archive.write("epoch", c10::IValue(state.epoch));
  archive.write("sampler_epoch", c10::IValue(state.sampler_epoch));
  archive.write("batch_in_epoch", c10::IValue(state.batch_in_epoch));
  archive.write("metadata", c10::IValue(nlohmann::json(state.metadata).dump()));

  if (save_rng) {
    auto gen = at::detail::getDefaultCPUGenerator();
    torch::Tensor rng;
    {
      // get_state() reads the engine; another thread drawing numbers must not tear it.
      std::lock_guard<std::mutex> lock(gen.mutex());
      rng = gen.get_state();
    }
    archive.write("rng", rng, /*is_buffer=*/true);
  }
  return archive;
}

// Writes the archive to `tmp` through a descriptor we own, so we can fsync it and see every
// write error (torch's own save_to(filename) does neither).
void write_file(torch::serialize::OutputArchive& archive, const std::string& tmp,
                const std::string& path, bool durable) {
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw Error("save_checkpoint(" + path + "): cannot create " + tmp + ": " + errno_text(errno) +
                " (is the directory writable?)");
  }
  FdCloser closer{fd};
  // The writer callback runs inside torch's zip writer, which cannot take a failure: a
  // short count makes it throw from its destructor (std::terminate), and an exception would
  // unwind through miniz's C code. So on the first error we remember errno, claim success and
  // drop the rest, and throw once save_to() has returned.
  int write_errno = 0;
  auto writer = [&](const void* data, size_t n) -> size_t {
    const char* p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < n && write_errno == 0) {
      ssize_t w = ::write(fd, p + done, n - done);
      if (w > 0) {
        done += static_cast<size_t>(w);
      } else if (w < 0 && errno == EINTR) {
        continue;
      } else {
        write_errno = (w < 0) ? errno : EIO;
      }
    }
    return n;
  };
  try {
    archive.save_to(writer);
  } catch (const c10::Error& e) {
    if (write_errno != 0) {
      throw Error("save_checkpoint(" + path + "): writing " + tmp +
                  " failed: " + errno_text(write_errno));
    }
    throw Error("save_checkpoint(" + path + "): serializing failed: " + e.what_without_backtrace());
  }
  if (write_errno != 0) {
    throw Error("save_checkpoint(" + path + "): writing " + tmp +
                " failed: " + errno_text(write_errno));
  }
  // The data must be on disk before the rename makes it the checkpoint, or a power cut
  // could leave PATH naming an empty file.
  if (durable && ::fsync(fd) != 0) {
    throw Error("save_checkpoint(" + path + "): fsync of " + tmp + " failed: " + errno_text(errno));
  }
  closer.fd = -1;
  if (::close(fd) != 0) {
    throw Error("save_checkpoint(" + path + "): closing " + tmp + " failed: " + errno_text(errno));
  }
}

int64_t read_int(torch::serialize::InputArchive& archive, const char* key,
                 const std::string& path) {
  c10::IValue v;
  if (!archive.try_read(key, v) || !v.isInt()) {
    throw Error("load_checkpoint(" + path + "): the checkpoint has no integer '" + key +
                "'; the file is damaged");
  }
  return v.toInt();
}

// Reads every defined tensor of `named` (the model's parameters or buffers) from `archive`
// and checks names and shapes before anything is copied, so a mismatch leaves the model as
// it was.
std::vector<std::pair<torch::Tensor, torch::Tensor>> match_tensors(
    torch::serialize::InputArchive& archive,
    const torch::OrderedDict<std::string, torch::Tensor>& named, bool is_buffer,
    const std::string& path) {
  const char* what = is_buffer ? "buffer" : "parameter";
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs;
  std::set<std::string> expected;
  for (const auto& item : named) {
    if (!item.value().defined()) continue;
    expected.insert(item.key());
    torch::Tensor saved;
    if (!archive.try_read(item.key(), saved, is_buffer)) {
      throw Error("load_checkpoint(" + path + "): the model's " + what + " '" + item.key() +
                  "' is missing from the checkpoint (was it saved from a different model?)");
    }
    if (saved.sizes() != item.value().sizes()) {
      throw Error("load_checkpoint(" + path + "): " + what + " '" + item.key() + "' has shape " +
                  shape_text(saved.sizes()) + " in the checkpoint but " +
                  shape_text(item.value().sizes()) + " in the model");
    }
    pairs.emplace_back(item.value(), saved);
  }
  for (const auto& key : archive.keys()) {
    if (!expected.count(key)) {
      throw Error("load_checkpoint(" + path + "): the checkpoint has a " + what + " '" + key +
                  "' that the model does not have (was it saved from a different model?)");
    }
  }
  return pairs;
}

// libtorch 1.13's Optimizer::load() restores the per-parameter state but drops the saved
// param groups' options (lr, betas, weight decay...), which Python's load_state_dict()
// restores. A resumed run whose lr was changed by a schedule would silently diverge, so we
// read them back from the layout Optimizer::save() writes (torch/optim/serialize.h):
// param_groups/param_groups/<i>/options, through the options' own virtual serialize().
void restore_group_options(torch::serialize::InputArchive& opt,
                           torch::optim::Optimizer& optimizer) {
  torch::serialize::InputArchive groups;
  if (!opt.try_read("param_groups", groups)) return;  // a custom optimizer's own format
  auto& live = optimizer.param_groups();
  for (size_t i = 0; i < live.size(); ++i) {
    torch::serialize::InputArchive group;
    torch::serialize::InputArchive options;
    if (!groups.try_read("param_groups/" + std::to_string(i), group) ||
        !group.try_read("options", options)) {
      continue;
    }
    live[i].options().serialize(options);
  }
}

}  // namespace

bool save_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer, const TrainingState& state,
                     const SaveOptions& options) {
  if (path.empty()) throw UsageError("save_checkpoint: the path is empty");
  if (options.writer_rank >= 0 && resolve_rank(options.rank) != options.writer_rank) return false;

  torch::serialize::OutputArchive archive =
      build_archive(model, optimizer, state, options.save_rng);

  // A name of our own per process, so two writers never share a temp file, and a crashed
  // save leaves PATH.tmp.<pid>, which latest_checkpoint() does not match (no ".pt" end).
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    write_file(archive, tmp, path, options.durable);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      throw Error("save_checkpoint(" + path + "): renaming " + tmp +
                  " to it failed: " + errno_text(errno));
    }
  } catch (...) {
    ::unlink(tmp.c_str());  // best effort: the previous checkpoint at `path` is untouched
    throw;
  }
  // Make the rename itself durable.
  if (options.durable) {
    std::string dir = std::filesystem::path(path).parent_path().string();
    fsync_directory(dir.empty() ? "." : dir, path);
  }
  return true;
}

TrainingState load_checkpoint(const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer* optimizer, const LoadOptions& options) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      throw UsageError("load_checkpoint: no checkpoint at " + path + " (" + errno_text(err) + ")");
    }
    throw Error("load_checkpoint: cannot access " + path + ": " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) throw UsageError("load_checkpoint: " + path + " is not a regular file");

  // Tensors land on the model's device, whichever device wrote them: a checkpoint written on
  // a GPU loads on a CPU-only machine (and the optimizer's state sits where its parameters do).
  torch::Device device(torch::kCPU);
  for (const auto& p : model.parameters(/*recurse=*/true)) {
    if (p.defined()) {
      device = p.device();
      break;
    }
  }
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path, device);
  } catch (const c10::Error& e) {
    throw Error("load_checkpoint: " + path + " is not a dtrain checkpoint (not a torch archive: " +
                e.what_without_backtrace() + ")");
  }
  c10::IValue format;
  if (!archive.try_read("format", format) || !format.isString() ||
      format.toStringRef() != kFormat) {
    throw Error("load_checkpoint: " + path + " is not a dtrain checkpoint (no '" + kFormat +
                "' marker)");
  }
  int64_t version = read_int(archive, "version", path);
  if (version < 1 || version > kVersion) {
    throw Error("load_checkpoint: " + path + " has checkpoint format version " +
                std::to_string(version) + "; this dtrain reads versions up to " +
                std::to_string(kVersion) + " (upgrade dtrain)");
  }

  TrainingState state;
  state.step = read_int(archive, "step", path);
  state.epoch = read_int(archive, "epoch", path);
  state.sampler_epoch = read_int(archive, "sampler_epoch", path);
  state.batch_in_epoch = read_int(archive, "batch_in_epoch", path);
  c10::IValue meta;
  if (!archive.try_read("metadata", meta) || !meta.isString()) {
    throw Error("load_checkpoint(" + path +
                "): the checkpoint has no metadata; the file is damaged");
  }
  try {
    state.metadata =
        nlohmann::json::parse(meta.toStringRef()).get<std::map<std::string, std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw Error("load_checkpoint(" + path +
                "): the metadata is not a JSON object of strings: " + e.what());
  }

  torch::serialize::InputArchive params_archive;
  torch::serialize::InputArchive buffers_archive;
  if (!archive.try_read("parameters", params_archive) ||
      !archive.try_read("buffers", buffers_archive)) {
    throw Error("load_checkpoint(" + path + "): the checkpoint has no model; the file is damaged");
  }
  auto params =
      match_tensors(params_archive, model.named_parameters(/*recurse=*/true), false, path);
  auto buffers = match_tensors(buffers_archive, model.named_buffers(/*recurse=*/true), true, path);

  if (optimizer != nullptr) {
    torch::serialize::InputArchive opt;
    if (!archive.try_read("optimizer", opt)) {
      throw Error(
          "load_checkpoint(" + path +
          "): the checkpoint has no optimizer state (it was saved without one); pass nullptr "
          "to load only the model");
    }
    try {
      optimizer->load(opt);
      restore_group_options(opt, *optimizer);
    } catch (const c10::Error& e) {
      throw Error(
          "load_checkpoint(" + path +
          "): the optimizer state does not fit this optimizer: " + e.what_without_backtrace());
    }
  }

  {
    torch::NoGradGuard no_grad;
    for (auto& [dst, src] : params) dst.copy_(src);
    for (auto& [dst, src] : buffers) dst.copy_(src);
  }

  if (options.load_rng) {
    torch::Tensor rng;
    if (archive.try_read("rng", rng, /*is_buffer=*/true)) {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      try {
        gen.set_state(rng.cpu());  // the archive was mapped to the model's device
      } catch (const c10::Error& e) {
        throw Error("load_checkpoint(" + path +
                    "): the saved RNG state is invalid: " + e.what_without_backtrace());
      }
    }
  }
  return state;
}

namespace detail {

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir,
                                                              const std::string& prefix) {
  namespace fs = std::filesystem;
  std::vector<std::pair<int64_t, std::string>> found;
  std::vector<std::string> names;  // parallel to found, for the tie-break
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return found;  // a missing directory has no checkpoints yet
  const std::string suffix = ".pt";
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() + suffix.size()) continue;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    // Only PREFIX<digits>.pt: temp files (PATH.tmp.<pid>) and other names are not checkpoints.
    if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (!it->is_regular_file(ec)) continue;
    found.emplace_back(std::stoll(digits), (fs::path(dir) / name).string());
  }
  // Newest first; ties (ckpt_7.pt vs ckpt_007.pt) go to the smaller name, so the order is stable.
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  return found;
}

}  // namespace detail

std::optional<std::string> latest_checkpoint(const std::string& dir, const std::string& prefix) {
  auto all = detail::list_checkpoints(dir, prefix);
  if (all.empty()) return std::nullopt;
  return all.front().second;
}

// PyTorch's Module.state_dict recursion: a module's own parameters, then its own buffers, then
// each child's under "<child>.".
static void add_state(StateDict& out, const torch::nn::Module& m, const std::string& prefix) {
  for (const auto& item : m.named_parameters(/*recurse=*/false))
    if (item.value().defined()) out.insert(prefix + item.key(), item.value().detach());
  for (const auto& item : m.named_buffers(/*recurse=*/false))
    if (item.value().defined()) out.insert(prefix + item.key(), item.value().detach());
  for (const auto& child : m.named_children())
    add_state(out, *child.value(), prefix + child.key() + ".");
}

StateDict state_dict(const torch::nn::Module& model) {
  StateDict out;
  add_state(out, model, "");
  return out;
}

void load_state_dict(torch::nn::Module& model, const StateDict& dict, bool strict) {
  std::vector<std::pair<std::string, torch::Tensor>> targets;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (item.value().defined()) targets.emplace_back(item.key(), item.value());
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) targets.emplace_back(item.key(), item.value());
  }
  // Every check before the first copy: a dict that does not fit leaves the model as it was.
  std::vector<std::pair<torch::Tensor*, const torch::Tensor*>> copies;
  for (auto& [name, target] : targets) {
    const torch::Tensor* source = dict.find(name);
    if (source == nullptr) {
      if (strict) {
        throw UsageError("load_state_dict: the state dict has no entry '" + name +
                         "' that the model has; pass strict = false to load a subset");
      }
      continue;
    }
    if (!source->defined() || source->sizes() != target.sizes()) {
      std::ostringstream msg;
      msg << "load_state_dict: '" << name << "' has shape "
          << (source->defined() ? source->sizes() : c10::IntArrayRef{}) << " in the state dict but "
          << target.sizes() << " in the model";
      throw UsageError(msg.str());
    }
    copies.emplace_back(&target, source);
  }
  if (strict && copies.size() != dict.size()) {
    for (const auto& item : dict) {
      bool known = false;
      for (const auto& t : targets) known = known || t.first == item.key();
      if (!known) {
        throw UsageError("load_state_dict: the state dict has an entry '" + item.key() +
                         "' that the model does not; pass strict = false to ignore it");
      }
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target->copy_(*source);
}

}  // namespace dtrain
