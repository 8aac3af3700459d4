// The Delta deletion vector reader (data/deletion_vector.h): a DV file's bytes, or the log's
// inline Z85 text, under a descriptor whose fields a damaged log may give any value.
// Input: byte 0 picks the form (bit 0 clear: inline 'i'; set: stored 'p', a DV file), then,
// little-endian, sizeInBytes (4 bytes), cardinality (4 bytes) and offset (4 bytes; 0xffffffff:
// absent), then the rest: the Z85 text or the DV file's bytes. The data file has kFileRows
// rows. tests/fuzz/make_seeds.py writes seeds from the vectors of the data tests' tables.
#include <cstdint>
#include <sstream>
#include <string>

#include "data/deletion_vector.h"
#include "fuzz/fuzz_support.h"

namespace {

constexpr int64_t kFileRows = int64_t{1} << 22;

uint32_t u32(dtrain::fuzz::Input& in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{in.byte()} << (8 * i);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace dd = dtrain::data::detail;
  dtrain::fuzz::Input in(data, size);
  const bool stored = in.byte() & 1;
  dd::DeletionVectorRef dv;
  dv.storage_type = stored ? "p" : "i";
  dv.size_in_bytes = u32(in);
  dv.cardinality = u32(in);
  if (const uint32_t offset = u32(in); offset != 0xffffffffu) dv.offset = offset;
  const std::string rest(in.rest());
  const std::string of = "the deletion vector of /fuzz/part-0.parquet";
  if (stored) {
    dv.path_or_inline = "/fuzz/deletion_vector.bin";
    std::istringstream file(rest);
    dtrain::fuzz::refused_properly([&] {
      dd::decode_deletion_vector(dv, &file, rest.size(), dv.path_or_inline, kFileRows, of);
    });
  } else {
    dv.path_or_inline = rest;
    dtrain::fuzz::refused_properly(
        [&] { dd::decode_deletion_vector(dv, nullptr, 0, "", kFileRows, of); });
    // The same text as a 'u' vector's name: a prefix and a Z85 uuid.
    dtrain::fuzz::refused_properly(
        [&] { dd::deletion_vector_file("/fuzz", {.storage_type = "u", .path_or_inline = rest}); });
  }
  return 0;
}
