// Delta log replay (data/delta_log.h, LogReplay): commit files as a damaged log or a broken
// writer may leave them. Input: the commits of versions 0, 1, ... separated by NUL bytes
// (JSON text never holds a raw NUL), each one JSON action per line; the snapshot at the last
// version; then every inline deletion vector it names, decoded. A checkpoint's rows reach the
// same LogReplay::apply after Arrow's Parquet reader (not fuzzed here: that is Arrow's).
// tests/fuzz/make_seeds.py writes seeds from the logs of the data tests' tables.
#include <cstdint>
#include <string>
#include <string_view>

#include "data/deletion_vector.h"
#include "data/delta_log.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace dd = dtrain::data::detail;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  dd::LogReplay replay("/fuzz/table");
  int64_t version = -1;
  const bool replayed = dtrain::fuzz::refused_properly([&] {
    while (true) {
      const size_t end = text.find('\0');
      replay.apply_commit(text.substr(0, end),
                          "/fuzz/table/_delta_log/" + std::to_string(++version) + ".json");
      if (end == std::string_view::npos) break;
      text.remove_prefix(end + 1);
    }
  });
  if (!replayed) return 0;
  dd::DeltaSnapshot snap;
  if (!dtrain::fuzz::refused_properly([&] { snap = replay.snapshot(version); })) return 0;
  for (const auto& f : snap.files) {
    if (!f.deletion_vector || f.deletion_vector->storage_type != "i") continue;
    dtrain::fuzz::refused_properly([&] {
      dd::decode_deletion_vector(*f.deletion_vector, nullptr, 0, "", int64_t{1} << 22,
                                 "the deletion vector of " + f.path);
    });
  }
  return 0;
}
