// The Distributor's codec (dtrain/codec.h) decoding bytes that are not what was encoded:
// arguments and results cross process boundaries, so a truncated or corrupt message must end
// in a CodecError, never in a huge allocation, a read past the end or a libtorch error.
// Byte 0 picks the type to decode; the rest is the message. Whatever decodes is encoded
// again and must decode to the same bytes.
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "dtrain/codec.h"
#include "fuzz/fuzz_support.h"

namespace {

template <typename T>
void round_trip(const char* data, std::size_t size) {
  dtrain::fuzz::refused_properly([&] {
    dtrain::Decoder in(data, size);
    T value = in.get<T>();
    dtrain::Encoder out;
    out.put(value);
    dtrain::Decoder again(out.bytes());
    dtrain::Encoder twice;
    twice.put(again.get<T>());
    if (twice.bytes() != out.bytes()) __builtin_trap();
  });
}

using StateDict = torch::OrderedDict<std::string, at::Tensor>;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const char* p = reinterpret_cast<const char*>(data) + 1;
  const std::size_t n = size - 1;
  switch (data[0] % 10) {
    case 0:
      round_trip<std::string>(p, n);
      break;
    case 1:
      round_trip<std::vector<std::int64_t>>(p, n);
      break;
    case 2:
      round_trip<std::vector<std::string>>(p, n);
      break;
    case 3:
      round_trip<std::map<std::string, std::vector<double>>>(p, n);
      break;
    case 4:
      round_trip<std::tuple<int, std::optional<std::string>, bool>>(p, n);
      break;
    case 5:
      round_trip<std::set<std::int32_t>>(p, n);
      break;
    case 6:
      round_trip<at::Tensor>(p, n);
      break;
    case 7:
      round_trip<StateDict>(p, n);
      break;
    case 8:
      round_trip<std::vector<at::Tensor>>(p, n);
      break;
    case 9:
      round_trip<std::map<int, std::pair<float, std::string>>>(p, n);
      break;
  }
  return 0;
}
