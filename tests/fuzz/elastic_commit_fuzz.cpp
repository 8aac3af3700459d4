// ElasticState's commit reader (elastic/commit_reader.h): the bytes of a commit file as a
// crash, a full disk or another program may have left them.
#include <cstdint>
#include <string>

#include "elastic/commit_reader.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  dtrain::fuzz::refused_properly([&] {
    auto commit = dtrain::elastic::read_engine_commit(bytes, "fuzz.pt");
    for (const char* key : {"dtrain.elastic.step", "dtrain.elastic.epoch", "dtrain.elastic.offset",
                            "dtrain.elastic.dataset_size"}) {
      dtrain::fuzz::refused_properly(
          [&] { dtrain::elastic::metadata_int(commit.metadata, key, "fuzz.pt"); });
    }
  });
  return 0;
}
