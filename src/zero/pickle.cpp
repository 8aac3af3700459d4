// torch.save's format for the subset checkpoints use (see pickle.h): a protocol-2 pickler that
// only names globals on torch.load(weights_only=True)'s allow-list, and an unpickler that reads
// any class as an opaque Object.
// One piece (~1000 lines): the writer and the readers (torch_load, TorchFile) share the opcode
// set, the zip layout and the allow-list of globals; apart, each would need the other's
// internals.
#include "zero/pickle.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace dtrain::zero::detail {
namespace {

PyPtr make(PyValue::Kind k) {
  auto p = std::make_shared<PyValue>();
  p->kind = k;
  return p;
}

// torch.<Name>Storage for each dtype a checkpoint holds.
const std::vector<std::pair<torch::Dtype, const char*>>& storage_names() {
  static const std::vector<std::pair<torch::Dtype, const char*>> n = {
      {torch::kFloat32, "FloatStorage"}, {torch::kFloat64, "DoubleStorage"},
      {torch::kFloat16, "HalfStorage"},  {torch::kBFloat16, "BFloat16Storage"},
      {torch::kInt64, "LongStorage"},    {torch::kInt32, "IntStorage"},
      {torch::kInt16, "ShortStorage"},   {torch::kInt8, "CharStorage"},
      {torch::kUInt8, "ByteStorage"},    {torch::kBool, "BoolStorage"}};
  return n;
}

// ---- writing ----------------------------------------------------------------------------

class Pickler {
 public:
  std::string out;
  std::vector<torch::Tensor> storages;  // record data/<i>: the i-th tensor's elements

  void op(char c) { out.push_back(c); }
  void raw(const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
  void u32(uint32_t v) {
    for (int k = 0; k < 4; ++k) out.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
  }
  void global(const std::string& module, const std::string& name) {
    op('c');
    out += module + "\n" + name + "\n";
  }
  void str(const std::string& s) {
    op('X');
    u32(static_cast<uint32_t>(s.size()));
    out += s;
  }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      u32(static_cast<uint32_t>(static_cast<int32_t>(v)));
      return;
    }
    op('\x8a');  // LONG1: 8 bytes, little-endian two's complement
    out.push_back(8);
    for (int k = 0; k < 8; ++k)
      out.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * k)) & 0xff));
  }
  void real(double d) {
    op('G');  // big-endian
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    for (int k = 7; k >= 0; --k) out.push_back(static_cast<char>((bits >> (8 * k)) & 0xff));
  }
  void ints_tuple(const std::vector<int64_t>& v) {
    op('(');
    for (auto x : v) integer(x);
    op('t');
  }
  void tensor(const torch::Tensor& t0) {
    auto t = t0.detach().to(torch::kCPU).contiguous();
    const char* storage = nullptr;
    for (const auto& [d, n] : storage_names())
      if (d == t.scalar_type()) storage = n;
    if (!storage)
      throw InternalError("zero checkpoint: no torch storage type for " +
                          std::string(c10::toString(t.scalar_type())));
    const std::string key = std::to_string(storages.size());
    storages.push_back(t);
    global("torch._utils", "_rebuild_tensor_v2");
    op('(');
    // persistent id ('storage', torch.<X>Storage, key, 'cpu', numel)
    op('(');
    str("storage");
    global("torch", storage);
    str(key);
    str("cpu");
    integer(t.numel());
    op('t');
    op('Q');
    integer(0);
    ints_tuple(t.sizes().vec());
    ints_tuple(t.strides().vec());
    op('\x89');  // requires_grad False
    global("collections", "OrderedDict");
    op(')');
    op('R');
    op('t');
    op('R');
  }
  void value(const PyValue& v) {
    using K = PyValue::Kind;
    switch (v.kind) {
      case K::None:
        op('N');
        return;
      case K::Bool:
        op(v.b ? '\x88' : '\x89');
        return;
      case K::Int:
        integer(v.i);
        return;
      case K::Float:
        real(v.f);
        return;
      case K::Str:
        str(v.s);
        return;
      case K::Bytes:
        op('B');
        u32(static_cast<uint32_t>(v.s.size()));
        out += v.s;
        return;
      case K::List:
        op(']');
        if (!v.items.empty()) {
          op('(');
          for (auto& x : v.items) value(*x);
          op('e');
        }
        return;
      case K::Tuple:
        if (v.items.empty()) {
          op(')');
          return;
        }
        op('(');
        for (auto& x : v.items) value(*x);
        op('t');
        return;
      case K::Dict:
        if (v.ordered) {
          global("collections", "OrderedDict");
          op(')');
          op('R');
        } else {
          op('}');
        }
        if (!v.dict.empty()) {
          op('(');
          for (auto& [k, x] : v.dict) {
            value(*k);
            value(*x);
          }
          op('u');
        }
        return;
      case K::Tensor:
        tensor(v.tensor);
        return;
      case K::Size: {
        global("torch", "Size");
        op('(');
        std::vector<int64_t> dims;
        for (auto& x : v.items) dims.push_back(x->i);
        ints_tuple(dims);
        op('t');
        op('R');
        return;
      }
      case K::Object: {
        const auto dot = v.s.rfind('.');
        if (dot == std::string::npos)
          throw InternalError("zero checkpoint: no module in the Python name " + v.s);
        global(v.s.substr(0, dot), v.s.substr(dot + 1));
        if (v.reference) return;
        // cls.__new__(cls, *args) (NEWOBJ), then BUILD with the state, as pickle writes a
        // plain object at protocol 2.
        value(*py_tuple(v.items));
        op('\x81');
        if (v.state) {
          value(*v.state);
          op('b');
        }
        return;
      }
    }
  }
};

// ---- reading ----------------------------------------------------------------------------

class MemoryAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit MemoryAdapter(const std::vector<char>& b) : b_(b) {}
  size_t size() const override { return b_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* = "") const override {
    if (pos >= b_.size()) return 0;
    n = std::min<size_t>(n, b_.size() - pos);
    std::memcpy(buf, b_.data() + pos, n);
    return n;
  }

 private:
  const std::vector<char>& b_;
};

class Unpickler {
 public:
  // `lazy`: storages are not read (TorchFile), their tensors are meta tensors.
  Unpickler(const std::string& data, caffe2::serialize::PyTorchStreamReader& zip,
            const std::string& where, bool lazy)
      : d_(data), zip_(zip), where_(where), lazy_(lazy) {}

  PyPtr run() {
    for (;;) {
      const char c = byte();
      switch (c) {
        case '\x80':
          byte();
          break;  // PROTO
        case '\x95':
          bytes(8);
          break;  // FRAME
        case '.':
          return pop();  // STOP
        case '(':
          marks_.push_back(stack_.size());
          break;
        case ')':
          push(make(PyValue::Kind::Tuple));
          break;
        case ']':
          push(make(PyValue::Kind::List));
          break;
        case '}':
          push(make(PyValue::Kind::Dict));
          break;
        case 't':
          push(seq(PyValue::Kind::Tuple, pop_mark()));
          break;
        case '\x85':
          push(seq(PyValue::Kind::Tuple, pop_n(1)));
          break;
        case '\x86':
          push(seq(PyValue::Kind::Tuple, pop_n(2)));
          break;
        case '\x87':
          push(seq(PyValue::Kind::Tuple, pop_n(3)));
          break;
        case 'l':
          push(seq(PyValue::Kind::List, pop_mark()));
          break;     // LIST
        case 'd': {  // DICT
          auto d = make(PyValue::Kind::Dict);
          auto items = pop_mark();
          for (size_t k = 0; k + 1 < items.size(); k += 2)
            d->dict.push_back({items[k], items[k + 1]});
          push(d);
          break;
        }
        case 'a': {
          auto x = pop();
          top()->items.push_back(x);
          break;
        }
        case 'e': {
          auto items = pop_mark();
          auto& list = top();
          list->items.insert(list->items.end(), items.begin(), items.end());
          break;
        }
        case 's': {
          auto v = pop();
          auto k = pop();
          set_item(top(), k, v);
          break;
        }
        case 'u': {
          auto items = pop_mark();
          for (size_t k = 0; k + 1 < items.size(); k += 2) set_item(top(), items[k], items[k + 1]);
          break;
        }
        case 'N':
          push(make(PyValue::Kind::None));
          break;
        case '\x88':
          push(py_bool(true));
          break;
        case '\x89':
          push(py_bool(false));
          break;
        case 'J':
          push(py_int(static_cast<int32_t>(le(4))));
          break;
        case 'K':
          push(py_int(static_cast<int64_t>(le(1))));
          break;
        case 'M':
          push(py_int(static_cast<int64_t>(le(2))));
          break;
        case '\x8a':
          push(py_int(long_int(le(1))));
          break;
        case '\x8b':
          push(py_int(long_int(le(4))));
          break;
        case 'I': {
          const std::string l = line();
          if (l == "00")
            push(py_bool(false));
          else if (l == "01")
            push(py_bool(true));
          else
            push(py_int(std::stoll(l)));
          break;
        }
        case 'L': {
          std::string l = line();
          if (!l.empty() && l.back() == 'L') l.pop_back();
          push(py_int(std::stoll(l)));
          break;
        }
        case 'G': {
          uint64_t bits = 0;
          for (int k = 0; k < 8; ++k) bits = (bits << 8) | static_cast<uint8_t>(byte());
          double dv;
          std::memcpy(&dv, &bits, 8);
          push(py_float(dv));
          break;
        }
        case 'F':
          push(py_float(std::stod(line())));
          break;
        case 'X':
          push(py_str(bytes(le(4))));
          break;
        case '\x8c':
          push(py_str(bytes(le(1))));
          break;
        case '\x8d':
          push(py_str(bytes(le(8))));
          break;
        case 'V':
          push(py_str(line()));
          break;
        case 'T':
          push(py_str(bytes(le(4))));
          break;
        case 'U':
          push(py_str(bytes(le(1))));
          break;
        case 'B':
          push(bytes_value(bytes(le(4))));
          break;
        case 'C':
          push(bytes_value(bytes(le(1))));
          break;
        case '\x8e':
          push(bytes_value(bytes(le(8))));
          break;
        case 'c': {
          const std::string module = line();
          push(global(module + "." + line()));
          break;
        }
        case '\x93': {  // STACK_GLOBAL
          auto name = pop();
          auto module = pop();
          push(global(module->s + "." + name->s));
          break;
        }
        case 'R': {
          auto args = pop();
          auto fn = pop();
          push(reduce(*fn, args));
          break;
        }
        case '\x81': {  // NEWOBJ
          auto args = pop();
          auto cls = pop();
          push(reduce(*cls, args));
          break;
        }
        case '\x92': {  // NEWOBJ_EX
          pop();        // kwargs
          auto args = pop();
          auto cls = pop();
          push(reduce(*cls, args));
          break;
        }
        case 'b': {  // BUILD
          auto state = pop();
          if (top()->kind == PyValue::Kind::Object) top()->state = state;
          break;
        }
        case 'Q':
          push(persistent(*pop()));
          break;
        case 'q':
          memo_[le(1)] = top();
          break;
        case 'r':
          memo_[le(4)] = top();
          break;
        case 'p':
          memo_[std::stoull(line())] = top();
          break;
        case '\x94':
          memo_[memo_.size()] = top();
          break;
        case 'h':
          push(memo(le(1)));
          break;
        case 'j':
          push(memo(le(4)));
          break;
        case 'g':
          push(memo(std::stoull(line())));
          break;
        case '0':
          pop();
          break;
        case '1':
          pop_mark();
          break;
        case '2':
          push(top());
          break;
        default: {
          std::ostringstream s;
          s << "unsupported pickle opcode 0x" << std::hex << (static_cast<int>(c) & 0xff)
            << " at byte " << std::dec << pos_ - 1 << " of data.pkl";
          fail(s.str());
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw CheckpointError(where_ + ": " + what);
  }
  char byte() {
    if (pos_ >= d_.size()) fail("data.pkl ends early (a truncated or corrupt file)");
    return d_[pos_++];
  }
  std::string bytes(uint64_t n) {
    if (n > d_.size() - pos_) fail("data.pkl ends early (a truncated or corrupt file)");
    std::string s = d_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  uint64_t le(int n) {
    uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= static_cast<uint64_t>(static_cast<uint8_t>(byte())) << (8 * k);
    return v;
  }
  int64_t long_int(uint64_t n) {
    if (n > 8) fail("an integer of " + std::to_string(n) + " bytes (more than 64 bits)");
    uint64_t v = 0;
    for (uint64_t k = 0; k < n; ++k)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(byte())) << (8 * k);
    if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t(0) << (8 * n);  // sign-extend
    return static_cast<int64_t>(v);
  }
  std::string line() {
    auto e = d_.find('\n', pos_);
    if (e == std::string::npos) fail("data.pkl ends early (a truncated or corrupt file)");
    std::string s = d_.substr(pos_, e - pos_);
    pos_ = e + 1;
    return s;
  }
  void push(PyPtr v) { stack_.push_back(std::move(v)); }
  PyPtr& top() {
    if (stack_.empty()) fail("malformed pickle (empty stack)");
    return stack_.back();
  }
  PyPtr pop() {
    if (stack_.empty()) fail("malformed pickle (empty stack)");
    auto v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  std::vector<PyPtr> pop_n(size_t n) {
    if (stack_.size() < n) fail("malformed pickle (empty stack)");
    std::vector<PyPtr> v(stack_.end() - static_cast<long>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    return v;
  }
  std::vector<PyPtr> pop_mark() {
    if (marks_.empty() || marks_.back() > stack_.size()) fail("malformed pickle (no mark)");
    const size_t m = marks_.back();
    marks_.pop_back();
    return pop_n(stack_.size() - m);
  }
  PyPtr memo(uint64_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) fail("malformed pickle (memo " + std::to_string(k) + " unset)");
    return it->second;
  }
  static PyPtr seq(PyValue::Kind k, std::vector<PyPtr> items) {
    auto p = make(k);
    p->items = std::move(items);
    return p;
  }
  PyPtr bytes_value(std::string b) {
    auto p = make(PyValue::Kind::Bytes);
    p->s = std::move(b);
    return p;
  }
  PyPtr global(const std::string& name) {
    auto p = make(PyValue::Kind::Object);
    p->s = name;
    p->b = true;  // a class or function, not an instance yet
    return p;
  }
  void set_item(const PyPtr& target, const PyPtr& k, const PyPtr& v) {
    if (target->kind == PyValue::Kind::Dict) {
      target->dict.push_back({k, v});
    } else if (target->kind == PyValue::Kind::Object) {  // a dict subclass: keep its items
      if (!target->state) target->state = make(PyValue::Kind::Dict);
      target->state->dict.push_back({k, v});
    } else {
      fail("malformed pickle (item set on a " + target->describe() + ")");
    }
  }
  PyPtr reduce(const PyValue& fn, const PyPtr& args) {
    const std::string& n = fn.s;
    const auto& a = args->items;
    if (n == "torch._utils._rebuild_tensor_v2" || n == "torch._utils._rebuild_tensor") {
      if (a.size() < 4 || a[0]->kind != PyValue::Kind::Tensor) fail("malformed tensor in data.pkl");
      std::vector<int64_t> size, stride;
      for (auto& x : a[2]->items) size.push_back(x->i);
      for (auto& x : a[3]->items) stride.push_back(x->i);
      auto t = make(PyValue::Kind::Tensor);
      int64_t need = a[1]->i;
      for (size_t k = 0; k < size.size(); ++k)
        if (size[k] > 0) need += (size[k] - 1) * stride[k];
      if (!size.empty() && std::all_of(size.begin(), size.end(), [](int64_t s) { return s > 0; }) &&
          need >= a[0]->tensor.numel())
        fail("a tensor reaches past its storage (a corrupt file)");
      t->tensor = a[0]->tensor.as_strided(size, stride, a[1]->i);
      t->storage = a[0]->storage;
      t->storage_numel = a[0]->storage_numel;
      return t;
    }
    // A tensor subclass (a Parameter saved with its class): rebuild the tensor inside.
    if (n == "torch._tensor._rebuild_from_type_v2" && a.size() >= 3) return reduce(*a[0], a[2]);
    if (n == "torch._utils._rebuild_parameter" ||
        n == "torch._utils._rebuild_parameter_with_state") {
      if (a.empty()) fail("malformed parameter in data.pkl");
      return a[0];
    }
    if (n == "collections.OrderedDict") {
      auto d = make(PyValue::Kind::Dict);
      d->ordered = true;
      if (!a.empty() && (a[0]->kind == PyValue::Kind::List || a[0]->kind == PyValue::Kind::Tuple))
        for (auto& kv : a[0]->items)
          if (kv->items.size() == 2) d->dict.push_back({kv->items[0], kv->items[1]});
      return d;
    }
    if (n == "torch.Size") {
      auto s = make(PyValue::Kind::Size);
      if (!a.empty()) s->items = a[0]->items;
      return s;
    }
    if (n == "builtins.set" || n == "builtins.frozenset" || n == "__builtin__.set") {
      auto l = make(PyValue::Kind::List);
      if (!a.empty()) l->items = a[0]->items;
      return l;
    }
    if (n == "_codecs.encode" && !a.empty()) return bytes_value(a[0]->s);
    // libtorch's own pickles (torch::pickle_save, dtrain's checkpoints before this format):
    // type tags and typed lists around plain values.
    if (n.rfind("torch.jit._pickle.", 0) == 0 && !a.empty()) return a[0];
    auto o = make(PyValue::Kind::Object);
    o->s = n;
    o->items = a;
    return o;
  }
  PyPtr persistent(const PyValue& pid) {
    const auto& a = pid.items;
    if (pid.kind != PyValue::Kind::Tuple || a.size() < 5 || a[0]->s != "storage")
      fail("a persistent id that is not a torch storage");
    const std::string key = a[2]->s;
    auto it = storages_.find(key);
    if (it != storages_.end()) return it->second;
    // torch.FloatStorage, ... (torch 2.x may also name torch.storage.UntypedStorage: bytes)
    std::string type = a[1]->s;
    if (type.rfind("torch.", 0) == 0) type = type.substr(6);
    torch::Dtype dtype = torch::kUInt8;
    bool known = type == "storage.UntypedStorage" || type == "UntypedStorage";
    for (const auto& [d, nm] : storage_names())
      if (type == nm) dtype = d, known = true;
    if (!known) fail("a storage of type " + a[1]->s + ", which dtrain does not read");
    const std::string record = "data/" + key;
    if (!zip_.hasRecord(record)) fail("the storage record " + record + " is missing");
    if (a[4]->kind != PyValue::Kind::Int || a[4]->i < 0)
      fail("a storage of " + a[4]->describe() + " elements (a corrupt file)");
    if (lazy_) {
      auto t = make(PyValue::Kind::Tensor);
      t->tensor = torch::empty({a[4]->i}, torch::TensorOptions().dtype(dtype).device(torch::kMeta));
      t->storage = record;
      t->storage_numel = a[4]->i;
      storages_[key] = t;
      return t;
    }
    at::DataPtr ptr;
    size_t n = 0;
    try {
      std::tie(ptr, n) = zip_.getRecord(record);
    } catch (const c10::Error& e) {
      fail("cannot read " + record + " (a truncated or corrupt file)");
    }
    const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t numel = static_cast<int64_t>(n) / elem;
    if (numel < a[4]->i) fail(record + " holds fewer elements than its tensor needs");
    auto t = make(PyValue::Kind::Tensor);
    // The record's buffer becomes the storage (no second copy of it).
    auto owner = std::make_shared<at::DataPtr>(std::move(ptr));
    void* data = owner->get();
    t->tensor = torch::from_blob(
        data, {numel}, [owner](void*) mutable { owner.reset(); },
        torch::TensorOptions().dtype(dtype));
    storages_[key] = t;
    return t;
  }

  const std::string& d_;
  caffe2::serialize::PyTorchStreamReader& zip_;
  std::string where_;
  bool lazy_ = false;
  size_t pos_ = 0;
  std::vector<PyPtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, PyPtr> memo_;
  std::map<std::string, PyPtr> storages_;
};

std::string first_line(const std::string& s) {
  auto e = s.find('\n');
  return e == std::string::npos ? s : s.substr(0, e);
}

// The file's value, its storages read (torch_load) or left in the file (`lazy`, TorchFile).
// `first` is the file's first byte; `zip` keeps the reader for TorchFile.
PyPtr unpickle(std::shared_ptr<caffe2::serialize::ReadAdapterInterface> in, char first,
               const std::string& where, bool lazy,
               std::unique_ptr<caffe2::serialize::PyTorchStreamReader>* keep) {
  if (static_cast<uint8_t>(first) == 0x80)
    throw CheckpointError(where +
                          ": torch.save's legacy (pre-1.6, not zip) format, which dtrain does not "
                          "read; load and save it again with a current torch");
  try {
    auto zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(std::move(in));
    if (!zip->hasRecord("data.pkl"))
      throw CheckpointError(where + ": a zip without data.pkl (not a torch.save file)");
    auto [ptr, n] = zip->getRecord("data.pkl");
    const std::string data(static_cast<const char*>(ptr.get()), n);
    auto v = Unpickler(data, *zip, where, lazy).run();
    if (keep) *keep = std::move(zip);
    return v;
  } catch (const CheckpointError&) {
    throw;
  } catch (const c10::Error& e) {
    throw CheckpointError(where + ": not a readable torch.save file (" +
                          first_line(e.what_without_backtrace()) +
                          "; a truncated, corrupt or foreign file?)");
  }
}

// pread of exactly n bytes at pos; false at the file's end.
bool pread_all(int fd, void* buf, size_t n, uint64_t pos) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(pos));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
    pos += static_cast<uint64_t>(got);
  }
  return true;
}

class FileAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  FileAdapter(int fd, uint64_t size) : fd_(fd), size_(size) {}
  size_t size() const override { return size_; }
  size_t read(uint64_t pos, void* buf, size_t n, const char* = "") const override {
    if (pos >= size_) return 0;
    n = static_cast<size_t>(std::min<uint64_t>(n, size_ - pos));
    return pread_all(fd_, buf, n, pos) ? n : 0;
  }

 private:
  int fd_;
  uint64_t size_;
};

}  // namespace

const PyValue* PyValue::get(const std::string& key) const {
  const PyValue* d = this;
  if (kind == Kind::Object && state && state->kind == Kind::Dict) d = state.get();
  if (d->kind != Kind::Dict) return nullptr;
  for (const auto& [k, v] : d->dict) {
    if (k->kind == Kind::Str && k->s == key) return v.get();
    if (k->kind == Kind::Int && std::to_string(k->i) == key) return v.get();
  }
  return nullptr;
}

int64_t PyValue::as_int(const std::string& what) const {
  if (kind == Kind::Int) return i;
  if (kind == Kind::Bool) return b ? 1 : 0;
  if (kind == Kind::Object && items.size() == 1 && items[0]->kind == Kind::Int) return items[0]->i;
  throw CheckpointError(what + " is a " + describe() + ", expected an integer");
}

std::string PyValue::describe() const {
  switch (kind) {
    case Kind::None:
      return "None";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::Str:
      return "str";
    case Kind::Bytes:
      return "bytes";
    case Kind::List:
      return "list";
    case Kind::Tuple:
      return "tuple";
    case Kind::Dict:
      return ordered ? "OrderedDict" : "dict";
    case Kind::Tensor:
      return "tensor";
    case Kind::Size:
      return "torch.Size";
    case Kind::Object:
      return "object " + s;
  }
  return "value";
}

PyPtr py_none() { return make(PyValue::Kind::None); }
PyPtr py_bool(bool v) {
  auto p = make(PyValue::Kind::Bool);
  p->b = v;
  return p;
}
PyPtr py_int(int64_t v) {
  auto p = make(PyValue::Kind::Int);
  p->i = v;
  return p;
}
PyPtr py_float(double v) {
  auto p = make(PyValue::Kind::Float);
  p->f = v;
  return p;
}
PyPtr py_str(std::string v) {
  auto p = make(PyValue::Kind::Str);
  p->s = std::move(v);
  return p;
}
PyPtr py_list(std::vector<PyPtr> items) {
  auto p = make(PyValue::Kind::List);
  p->items = std::move(items);
  return p;
}
PyPtr py_tuple(std::vector<PyPtr> items) {
  auto p = make(PyValue::Kind::Tuple);
  p->items = std::move(items);
  return p;
}
PyPtr py_dict(bool ordered) {
  auto p = make(PyValue::Kind::Dict);
  p->ordered = ordered;
  return p;
}
PyPtr py_tensor(torch::Tensor t) {
  auto p = make(PyValue::Kind::Tensor);
  p->tensor = std::move(t);
  return p;
}
PyPtr py_object(std::string cls, PyPtr state) {
  auto p = make(PyValue::Kind::Object);
  p->s = std::move(cls);
  p->state = std::move(state);
  return p;
}
PyPtr py_global(std::string name) {
  auto p = make(PyValue::Kind::Object);
  p->s = std::move(name);
  p->reference = true;
  return p;
}
PyPtr py_size(const std::vector<int64_t>& sizes) {
  auto p = make(PyValue::Kind::Size);
  for (auto s : sizes) p->items.push_back(py_int(s));
  return p;
}
void py_set(const PyPtr& dict, const std::string& key, PyPtr value) {
  dict->dict.push_back({py_str(key), std::move(value)});
}

PyPtr from_ivalue(const c10::IValue& v) {
  if (v.isNone()) return py_none();
  if (v.isBool()) return py_bool(v.toBool());
  if (v.isInt()) return py_int(v.toInt());
  if (v.isDouble()) return py_float(v.toDouble());
  if (v.isString()) return py_str(v.toStringRef());
  if (v.isTensor()) return py_tensor(v.toTensor());
  if (v.isTuple()) {
    std::vector<PyPtr> items;
    for (const auto& x : v.toTupleRef().elements()) items.push_back(from_ivalue(x));
    return py_tuple(std::move(items));
  }
  if (v.isList()) {
    std::vector<PyPtr> items;
    for (const auto& x : v.toListRef()) items.push_back(from_ivalue(x));
    return py_list(std::move(items));
  }
  if (v.isGenericDict()) {
    auto d = py_dict();
    for (const auto& e : v.toGenericDict())
      d->dict.push_back({from_ivalue(e.key()), from_ivalue(e.value())});
    return d;
  }
  throw InternalError("zero checkpoint: cannot save a " + v.tagKind());
}

c10::IValue to_ivalue(const PyValue& v) {
  using K = PyValue::Kind;
  switch (v.kind) {
    case K::None:
      return c10::IValue();
    case K::Bool:
      return v.b;
    case K::Int:
      return v.i;
    case K::Float:
      return v.f;
    case K::Str:
    case K::Bytes:
      return v.s;
    case K::Tensor:
      return v.tensor;
    case K::List:
    case K::Tuple:
    case K::Size:
    case K::Object: {
      // Typed lists where the elements allow it (the engine reads ints, doubles, strings).
      bool ints = true, doubles = true, strings = true;
      for (auto& x : v.items) {
        ints = ints && x->kind == K::Int;
        doubles = doubles && (x->kind == K::Float || x->kind == K::Int);
        strings = strings && x->kind == K::Str;
      }
      if (v.kind == K::Object && v.items.size() == 1 && v.items[0]->kind == K::Int)
        return v.items[0]->i;  // an enum
      if (!v.items.empty() && ints) {
        c10::List<int64_t> l;
        for (auto& x : v.items) l.push_back(x->i);
        return l;
      }
      if (!v.items.empty() && doubles) {
        c10::List<double> l;
        for (auto& x : v.items) l.push_back(x->kind == K::Int ? double(x->i) : x->f);
        return l;
      }
      if (!v.items.empty() && strings) {
        c10::List<std::string> l;
        for (auto& x : v.items) l.push_back(x->s);
        return l;
      }
      c10::impl::GenericList l(c10::AnyType::get());
      for (auto& x : v.items) l.push_back(to_ivalue(*x));
      return l;
    }
    case K::Dict: {
      c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
      for (const auto& [k, x] : v.dict) {
        std::string key = k->kind == K::Str ? k->s : k->kind == K::Int ? std::to_string(k->i) : "";
        d.insert_or_assign(key, to_ivalue(*x));
      }
      return d;
    }
  }
  return c10::IValue();
}

std::vector<char> torch_save(const PyValue& value) {
  Pickler p;
  p.op('\x80');
  p.op('\x02');
  p.value(value);
  p.op('.');
  std::vector<char> out;
  caffe2::serialize::PyTorchStreamWriter w([&](const void* data, size_t n) -> size_t {
    out.insert(out.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
    return n;
  });
  w.writeRecord("data.pkl", p.out.data(), p.out.size());
  w.writeRecord("byteorder", "little", 6);
  for (size_t k = 0; k < p.storages.size(); ++k) {
    const auto& t = p.storages[k];
    w.writeRecord("data/" + std::to_string(k), t.data_ptr(), t.numel() * t.element_size());
  }
  w.writeEndOfFile();
  return out;
}

PyPtr torch_load(const std::vector<char>& bytes, const std::string& where) {
  if (bytes.empty()) throw CheckpointError(where + ": the file is empty");
  return unpickle(std::make_shared<MemoryAdapter>(bytes), bytes[0], where, false, nullptr);
}

struct TorchFile::Impl {
  std::string path;
  int fd = -1;
  uint64_t size = 0;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  PyPtr value;
  std::map<std::string, uint64_t> offsets;  // record -> where its bytes start in the file

  ~Impl() {
    zip.reset();
    if (fd >= 0) ::close(fd);
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw CheckpointError(path + ": " + what);
  }
  uint64_t offset(const std::string& record) {
    auto it = offsets.find(record);
    if (it != offsets.end()) return it->second;
    uint64_t at = 0;
    try {
      at = zip->getRecordOffset(record);
    } catch (const c10::Error&) {
      fail("cannot read " + record + " (a truncated or corrupt file)");
    }
    return offsets[record] = at;
  }
  // Elements [first, first + n) of t's storage into buf.
  void read_storage(const PyValue& t, int64_t first, int64_t n, void* buf) {
    const uint64_t elem = t.tensor.element_size();
    if (first < 0 || first + n > t.storage_numel)
      fail("a tensor reaches past its storage (a corrupt file)");
    const uint64_t at = offset(t.storage) + static_cast<uint64_t>(first) * elem,
                   bytes = static_cast<uint64_t>(n) * elem;
    if (at + bytes > size || !pread_all(fd, buf, bytes, at))
      fail(t.storage + " ends early (a truncated or corrupt file)");
  }
};

TorchFile::TorchFile(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (impl_->fd < 0 || ::fstat(impl_->fd, &st) != 0)
    throw UsageError("zero checkpoint: cannot read " + path + " (" + std::strerror(errno) + ")");
  impl_->size = static_cast<uint64_t>(st.st_size);
  char first = 0;
  if (impl_->size == 0 || !pread_all(impl_->fd, &first, 1, 0))
    throw CheckpointError(path + ": the file is empty");
  impl_->value = unpickle(std::make_shared<FileAdapter>(impl_->fd, impl_->size), first, path, true,
                          &impl_->zip);
}

TorchFile::~TorchFile() = default;

const PyPtr& TorchFile::value() const { return impl_->value; }
const std::string& TorchFile::path() const { return impl_->path; }

void TorchFile::read(const PyValue& t, int64_t begin, const torch::Tensor& dest) const {
  if (t.kind != PyValue::Kind::Tensor || dest.dim() != 1)
    throw InternalError("TorchFile::read: needs a tensor and a 1-D destination");
  const int64_t n = dest.numel();
  if (begin < 0 || begin + n > t.tensor.numel())
    throw InternalError("TorchFile::read: elements [" + std::to_string(begin) + ", " +
                        std::to_string(begin + n) + ") of a tensor of " +
                        std::to_string(t.tensor.numel()));
  if (n == 0) return;
  if (t.storage.empty()) {
    dest.copy_(t.tensor.reshape({-1}).narrow(0, begin, n));
    return;
  }
  const auto& m = t.tensor;
  if (!m.is_contiguous()) {
    dest.copy_(load(t).reshape({-1}).narrow(0, begin, n));
    return;
  }
  const int64_t first = m.storage_offset() + begin;
  if (dest.device().is_cpu() && dest.is_contiguous() && dest.scalar_type() == m.scalar_type()) {
    impl_->read_storage(t, first, n, dest.data_ptr());
    return;
  }
  const int64_t chunk = std::min<int64_t>(n, int64_t(1) << 22);
  auto buf = torch::empty({chunk}, torch::TensorOptions().dtype(m.scalar_type()));
  for (int64_t k = 0; k < n; k += chunk) {
    const int64_t len = std::min(chunk, n - k);
    impl_->read_storage(t, first + k, len, buf.data_ptr());
    dest.narrow(0, k, len).copy_(buf.narrow(0, 0, len));
  }
}

torch::Tensor TorchFile::load(const PyValue& t) const {
  if (t.kind != PyValue::Kind::Tensor) throw InternalError("TorchFile::load: not a tensor");
  if (t.storage.empty()) return t.tensor;
  const auto& m = t.tensor;
  const auto options = torch::TensorOptions().dtype(m.scalar_type());
  if (m.numel() == 0) return torch::empty(m.sizes(), options);
  int64_t span = 1;  // the storage elements the tensor reaches
  for (int64_t k = 0; k < m.dim(); ++k) span += (m.size(k) - 1) * m.stride(k);
  auto buf = torch::empty({span}, options);
  impl_->read_storage(t, m.storage_offset(), span, buf.data_ptr());
  return buf.as_strided(m.sizes(), m.strides(), 0);
}

const PyPtr& TorchFile::load_all() {
  std::set<const PyValue*> seen;
  std::function<void(PyValue&)> walk = [&](PyValue& v) {
    if (!seen.insert(&v).second) return;
    if (v.kind == PyValue::Kind::Tensor && !v.storage.empty()) {
      v.tensor = load(v);
      v.storage.clear();
    }
    for (auto& x : v.items) walk(*x);
    for (auto& [k, x] : v.dict) {
      walk(*k);
      walk(*x);
    }
    if (v.state) walk(*v.state);
  };
  walk(*impl_->value);
  return impl_->value;
}

}  // namespace dtrain::zero::detail
