// hvd's request line (see wire.h) and the kinds' names.
#include "horovod/wire.h"

#include <sstream>

#include "dtrain/error.h"

namespace dtrain::hvd::detail {
namespace {

std::string join_ints(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

std::vector<int64_t> split_ints(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) v.push_back(std::stoll(item));
  }
  return v;
}

}  // namespace

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kAllreduce:
      return "allreduce";
    case Kind::kAllgather:
      return "allgather";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAlltoall:
      return "alltoall";
    case Kind::kReducescatter:
      return "reducescatter";
    case Kind::kJoin:
      return "join";
    case Kind::kBarrier:
      return "barrier";
  }
  return "?";
}

const char* kind_upper(Kind k) {
  switch (k) {
    case Kind::kAllreduce:
      return "ALLREDUCE";
    case Kind::kAllgather:
      return "ALLGATHER";
    case Kind::kBroadcast:
      return "BROADCAST";
    case Kind::kAlltoall:
      return "ALLTOALL";
    case Kind::kReducescatter:
      return "REDUCESCATTER";
    case Kind::kJoin:
      return "JOIN";
    case Kind::kBarrier:
      return "BARRIER";
  }
  return "?";
}

std::string signature(const Request& r) {
  std::ostringstream s;
  s.precision(17);
  std::vector<int64_t> shape = r.tensor.defined() ? r.tensor.sizes().vec() : std::vector<int64_t>{};
  int dtype = r.tensor.defined() ? static_cast<int>(r.tensor.scalar_type()) : -1;
  s << static_cast<int>(r.kind) << '\t' << r.name << '\t' << dtype << '\t' << join_ints(shape)
    << '\t' << static_cast<int>(r.reduce.op) << '\t' << r.reduce.prescale_factor << '\t'
    << r.reduce.postscale_factor << '\t' << static_cast<int>(r.reduce.compression) << '\t' << r.root
    << '\t' << join_ints(r.splits) << '\t'
    << (!r.tensor.defined()  ? "-"
        : r.tensor.is_cuda() ? "cuda"
                             : "cpu");
  return s.str();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    size_t next = s.find(sep, pos);
    out.push_back(s.substr(pos, next - pos));
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return out;
}

Sig parse_sig(const std::string& line) {
  auto f = split(line, '\t');
  DTRAIN_ASSERT(f.size() == 12, "malformed hvd request line '" + line + "'");
  Sig s;
  s.seq = std::stoll(f[0]);
  s.kind = static_cast<Kind>(std::stoi(f[1]));
  s.name = f[2];
  s.dtype = std::stoi(f[3]);
  s.shape = split_ints(f[4]);
  s.op = std::stoi(f[5]);
  s.prescale = std::stod(f[6]);
  s.postscale = std::stod(f[7]);
  s.compression = std::stoi(f[8]);
  s.root = std::stoi(f[9]);
  s.splits = split_ints(f[10]);
  s.device = f[11];
  return s;
}

std::string strip_seq(const std::string& line) { return line.substr(line.find('\t') + 1); }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  s += join_ints(shape);
  s += ']';
  return s;
}

}  // namespace dtrain::hvd::detail
