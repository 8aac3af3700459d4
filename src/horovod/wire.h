// hvd's request line: how a rank announces a request in the negotiation (controller.h). One
// line per request, fields separated by '\t' (names may hold neither '\t' nor '\n'):
//   seq, kind, name, dtype, shape, op, prescale, postscale, compression, root, splits, device
// shape and splits as comma-separated integers; device the tensor's type ("cpu", "cuda"; "-"
// without a tensor), so a rank that has joined makes its zeros where the others' tensors are.
// encode/parse are exact inverses; every rank parses every rank's lines alike, so their tables
// agree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "horovod/controller.h"

namespace dtrain::hvd::detail {

// One request line, parsed.
struct Sig {
  int64_t seq = 0;
  Kind kind = Kind::kAllreduce;
  std::string name;
  int dtype = 0;
  std::vector<int64_t> shape;
  int op = 0;
  double prescale = 1, postscale = 1;
  int compression = 0;
  int root = 0;
  std::vector<int64_t> splits;
  std::string device;  // "cpu", "cuda", or "-" (no tensor)
};

// Request `r`'s line without its submission number (the negotiation puts "SEQ\t" first):
// what identifies a request across cycles (the response cache compares it).
std::string signature(const Request& r);
// Throws InternalError on a malformed line (every line comes from a peer's encode_request).
Sig parse_sig(const std::string& line);
// The line without its submission number: what must agree across ranks (for the kinds
// where shapes must be equal).
std::string strip_seq(const std::string& line);
std::vector<std::string> split(const std::string& s, char sep);
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace dtrain::hvd::detail
