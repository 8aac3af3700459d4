// Tensor codec: u8 dtype, u8 flags (1 defined, 2 requires_grad), u64 ndim, i64 sizes, then the
// contiguous CPU bytes.
#include <torch/torch.h>

#include "dtrain/codec.h"

namespace dtrain {

namespace {
constexpr std::uint8_t kDefined = 1;
constexpr std::uint8_t kRequiresGrad = 2;
}  // namespace

void Codec<at::Tensor>::encode(Encoder& out, const at::Tensor& t) {
  std::uint8_t flags = 0;
  if (!t.defined()) {
    out.put<std::uint8_t>(0);
    out.put<std::uint8_t>(flags);
    return;
  }
  flags = kDefined | (t.requires_grad() ? kRequiresGrad : 0);
  // Views with a pending conjugate/negation carry it in a bit, not in their bytes.
  at::Tensor c = t.detach().to(torch::kCPU).resolve_conj().resolve_neg().contiguous();
  out.put<std::uint8_t>(static_cast<std::uint8_t>(c.scalar_type()));
  out.put<std::uint8_t>(flags);
  out.write_size(static_cast<std::uint64_t>(c.dim()));
  for (int64_t s : c.sizes()) out.put<int64_t>(s);
  const std::size_t bytes = c.numel() * c.element_size();
  out.reserve(bytes);
  out.write(c.data_ptr(), bytes);
}

at::Tensor Codec<at::Tensor>::decode(Decoder& in) {
  auto dtype = in.get<std::uint8_t>();
  auto flags = in.get<std::uint8_t>();
  if ((flags & kDefined) == 0) return {};
  if (dtype >= static_cast<std::uint8_t>(c10::ScalarType::NumOptions)) {
    throw CodecError("dtrain codec: tensor dtype code " + std::to_string(dtype) +
                     " is not a torch dtype; the data is corrupt");
  }
  std::size_t ndim = in.read_count(sizeof(int64_t));
  std::vector<int64_t> sizes(ndim);
  const auto type = static_cast<c10::ScalarType>(dtype);
  // Check the byte count against what is left before allocating (no overflow either).
  unsigned __int128 bytes_needed = 0;
  try {
    bytes_needed = c10::elementSize(type);
  } catch (const c10::Error&) {  // Undefined, and any code without a size
    throw CodecError("dtrain codec: tensor dtype code " + std::to_string(dtype) +
                     " has no element size; the data is corrupt");
  }
  for (auto& s : sizes) {
    s = in.get<int64_t>();
    if (s < 0) throw CodecError("dtrain codec: tensor with a negative size; the data is corrupt");
    bytes_needed *= static_cast<std::uint64_t>(s);
    if (bytes_needed > in.remaining())
      bytes_needed = static_cast<unsigned __int128>(in.remaining()) + 1;
  }
  if (bytes_needed > in.remaining()) {
    throw CodecError("dtrain codec: a tensor's shape needs more bytes than the " +
                     std::to_string(in.remaining()) + " left; the data is truncated or corrupt");
  }
  if ((flags & kRequiresGrad) && !c10::isFloatingType(type) && !c10::isComplexType(type)) {
    throw CodecError(std::string("dtrain codec: a ") + c10::toString(type) +
                     " tensor marked requires_grad (only floating and complex tensors can be); "
                     "the data is corrupt");
  }
  at::Tensor t;
  try {
    t = torch::empty(sizes, torch::TensorOptions().dtype(type));
  } catch (const c10::Error&) {  // a dtype code no plain CPU tensor has (quantized, ...)
    throw CodecError(std::string("dtrain codec: a tensor of dtype ") + c10::toString(type) +
                     ", which the codec never writes; the data is corrupt");
  }
  const std::size_t bytes = t.numel() * t.element_size();
  detail::advise_huge_pages(t.data_ptr(), bytes);
  in.read(t.data_ptr(), bytes);
  if (flags & kRequiresGrad) t.set_requires_grad(true);
  return t;
}

}  // namespace dtrain
