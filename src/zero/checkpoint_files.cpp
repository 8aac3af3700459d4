// The files of a ZeRO checkpoint (checkpoint_files.h), and the public save_state_dict and
// load_state_dict_file.
#include "zero/checkpoint_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include "dtrain/checkpoint.h"
#include "dtrain/error.h"
#include "dtrain/zero.h"

namespace dtrain::zero::ckpt {

using detail::CheckpointError;

namespace {

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

std::vector<int64_t> ints(const IValue& v) {
  std::vector<int64_t> out;
  for (const auto& x : v.toListRef()) out.push_back(x.toInt());
  return out;
}

}  // namespace

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

void save_file(const fs::path& path, const detail::PyValue& v) {
  write_file_synced(path, detail::torch_save(v));
}

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

std::string stage3_model_file(int rank) {
  return "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_model_states.pt";
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

bool module_parameter_is_empty(const c10::impl::GenericDict& d, const std::string& name,
                               const fs::path& model_path) {
  auto module = get(d, "module", model_path).toGenericDict();
  auto it = module.find(name);
  return it != module.end() && it->value().isTensor() && it->value().toTensor().numel() == 0;
}

}  // namespace dtrain::zero::ckpt

namespace dtrain::zero {

using namespace ckpt;

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
