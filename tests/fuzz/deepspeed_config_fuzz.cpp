// A DeepSpeed config through the public entry point (zero_config.h: parse_config_text) and
// what dtrain derives from it (the memory estimate, the description `dtrain zero` prints).
// Byte 0: the data-parallel world size (1-256); the rest: the JSON text (a '{' is put in
// front when missing, so the input is always text, never a path to read).
#include <cstdint>
#include <string>

#include "dtrain/zero_config.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dtrain::fuzz::Input in(data, size);
  int world = in.byte() + 1;
  std::string text(in.rest());
  auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{') text.insert(0, "{");
  dtrain::fuzz::refused_properly([&] {
    auto config = dtrain::zero::parse_config_text(text, world);
    dtrain::zero::estimate_memory(config, 1000003);
    dtrain::zero::describe(config, 1000003);
  });
  return 0;
}
