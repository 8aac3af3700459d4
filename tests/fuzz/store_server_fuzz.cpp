// The store server's request handling (both TCPStore protocols, the token) fed bytes from
// three clients at once, in pieces of any size, as the epoll loop would feed them.
// Input: byte 0 bit 0 = the store has a token ("fuzz-token"); then chunks, each a header
// byte (bits 0-1: the client, 0-2, or 3 = close and reopen client 0; bits 2-7: length - 1)
// and that many bytes.
#include <cstdint>
#include <string>

#include "fuzz/fuzz_support.h"
#include "store/core.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dtrain::fuzz::Input in(data, size);
  dtrain::store::Core::Options options;
  if (in.byte() & 1) options.token = "fuzz-token";
  options.max_unauthenticated_request = 64;
  // Replies go only to open clients.
  bool open[3] = {true, true, true};
  dtrain::store::Core core(options, [&](int id, std::string) {
    if (id < 0 || id > 2 || !open[id]) std::abort();
  });
  for (int id = 0; id < 3; ++id) core.open(id);
  while (!in.empty()) {
    std::uint8_t header = in.byte();
    int id = header & 3;
    if (id == 3) {
      core.close(0);
      core.open(0);
      open[0] = true;
      continue;
    }
    std::size_t n = (header >> 2) + 1;
    std::string chunk;
    for (std::size_t i = 0; i < n && !in.empty(); ++i) chunk += static_cast<char>(in.byte());
    if (!open[id]) continue;
    dtrain::fuzz::refused_properly([&] {
      if (core.receive(id, chunk)) {
        core.close(id);
        open[id] = false;
      }
    });
  }
  return 0;
}
