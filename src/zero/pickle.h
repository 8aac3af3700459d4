// torch.save's file format for checkpoints, written and read by our own code for the subset
// checkpoints use, so that:
//   - Python's torch.load(f, weights_only=True) (torch 2.x's default) reads what dtrain writes:
//     only globals on its allow-list appear (torch._utils._rebuild_tensor_v2, torch.*Storage,
//     collections.OrderedDict, torch.Size); libtorch's torch::pickle_save writes TorchScript
//     type tags (torch.jit._pickle.restore_type_tag) that it refuses;
//   - dtrain reads what DeepSpeed writes (torch.save of dicts holding tensors, enums and other
//     Python objects), where libtorch's unpickler stops with an internal assert on an unknown
//     class. An unknown class becomes a PyValue of kind Object (its name and arguments), so the
//     keys around it stay readable.
// The container is the zip torch.save writes (caffe2's PyTorchStreamWriter/Reader): data.pkl,
// one record per storage under data/, version. Pickle protocol 2, as torch.save's default.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/error.h"

namespace dtrain::zero::detail {

// A checkpoint file that cannot be read: what() is one line naming the file and what is wrong.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

struct PyValue;
using PyPtr = std::shared_ptr<PyValue>;

// A Python value of the subset: None, bool, int, float, str, bytes, list, tuple, dict (in
// insertion order; `ordered` for collections.OrderedDict), a tensor, torch.Size, or an object
// of another class (Object: `name` is "module.Class", `items` its constructor arguments, `state`
// what BUILD gave it).
struct PyValue {
  enum class Kind { None, Bool, Int, Float, Str, Bytes, List, Tuple, Dict, Tensor, Size, Object };
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // Str, Bytes; Object: its class
  std::vector<PyPtr> items;
  std::vector<std::pair<PyPtr, PyPtr>> dict;
  bool ordered = false;
  torch::Tensor tensor;
  PyPtr state;             // Object
  bool reference = false;  // Object: the global `s` itself (torch.float16), not an instance of it
  // A tensor of a TorchFile, not read yet: its storage record ("data/<key>") and that storage's
  // elements; `tensor` is then a meta tensor (sizes, strides, storage offset and dtype only).
  std::string storage;
  int64_t storage_numel = 0;

  // Dict lookup by a str (or int, given as its decimal text) key; nullptr when absent or when
  // this is no dict.
  const PyValue* get(const std::string& key) const;
  // The value as an int: Int, Bool, or an Object made from one int (a Python enum such as
  // DeepSpeed's ZeroStageEnum). Throws CheckpointError naming `what` otherwise.
  int64_t as_int(const std::string& what) const;
  std::string describe() const;  // "dict", "tensor", "object deepspeed...LossScaler", ...
};

PyPtr py_none();
PyPtr py_bool(bool v);
PyPtr py_int(int64_t v);
PyPtr py_float(double v);
PyPtr py_str(std::string v);
PyPtr py_list(std::vector<PyPtr> items = {});
PyPtr py_tuple(std::vector<PyPtr> items = {});
PyPtr py_dict(bool ordered = false);  // add entries with py_set
PyPtr py_tensor(torch::Tensor t);     // saved from the CPU; a view saves its own elements only
PyPtr py_size(const std::vector<int64_t>& sizes);  // torch.Size
// An instance of the Python class `cls` ("module.Class") made as pickle makes a plain object:
// cls.__new__(cls), then its __dict__ set to `state` (a dict). Only for files that opt in to
// them: torch.load(weights_only=True) refuses a class not on its allow-list.
PyPtr py_object(std::string cls, PyPtr state);
// A module-level Python global ("torch.float16") as a value.
PyPtr py_global(std::string name);
void py_set(const PyPtr& dict, const std::string& key, PyPtr value);
// A c10::IValue (dicts with str or int keys, lists, tuples, tensors, scalars, strings, None) as
// a PyValue; the other way: Dict keys become str (an int key as its decimal text), Object and
// Size become their arguments / a list of ints.
PyPtr from_ivalue(const c10::IValue& v);
c10::IValue to_ivalue(const PyValue& v);

// torch.save(value) as bytes.
std::vector<char> torch_save(const PyValue& value);
// torch.load(bytes); `where` (the file) names errors: a truncated, corrupt or foreign file is a
// CheckpointError of one line.
PyPtr torch_load(const std::vector<char>& bytes, const std::string& where);

// A torch.save file read on demand, so that a large one is never held whole: opening it reads
// the zip's directory and the pickle (data.pkl) only. The tensors of value() are not read (see
// PyValue::storage); read() copies a range of one's elements from the file into a destination
// with pread at its record's offset (torch.save stores records uncompressed; torch.load's
// mmap=True relies on the same). Errors as torch_load's: a CheckpointError of one line naming
// the file; UsageError when the file cannot be opened. Not thread-safe.
//
//   TorchFile f(path);
//   const PyValue* t = f.value()->get("weight");
//   auto part = torch::empty({100});
//   f.read(*t, 1000, part);  // elements [1000, 1100) of t, row-major
class TorchFile {
 public:
  explicit TorchFile(const std::string& path);
  ~TorchFile();
  TorchFile(const TorchFile&) = delete;
  TorchFile& operator=(const TorchFile&) = delete;

  const PyPtr& value() const;
  const std::string& path() const;
  // Elements [begin, begin + dest.numel()) of the tensor `t` of value() (in its row-major
  // order) into `dest`, of any dtype (converted) and device; straight into dest's memory when
  // it is a contiguous CPU tensor of t's dtype, else through a buffer of at most 4M elements.
  // A `t` already in memory (not of a TorchFile) is copied from. REQUIRES: t is a Tensor.
  void read(const PyValue& t, int64_t begin, const torch::Tensor& dest) const;
  // The whole of `t` as a CPU tensor of its own.
  torch::Tensor load(const PyValue& t) const;
  // Reads every tensor of value() in place (value() then is what torch_load gives).
  const PyPtr& load_all();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::zero::detail
