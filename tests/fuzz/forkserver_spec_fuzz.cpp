// The fork server's spec (launch/forkserver/spec.h), cold and warm: parsed, every string
// and number touched, freed. Byte 0 bit 0: a warm spec (then bits 1-7: the number of fds handed
// over).
#include <cstdint>
#include <cstring>

#include "launch/forkserver/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool warm = data[0] & 1;
  int fds[256];
  const int nfds = data[0] >> 1;
  for (int i = 0; i < nfds; ++i) fds[i] = 100 + i;
  dtrain_forkserver::Spec spec;
  if (dtrain_forkserver::parse_spec(reinterpret_cast<const char*>(data + 1), size - 1, warm, fds,
                                    nfds, &spec)) {
    std::size_t total = 0;
    volatile int sink = 0;  // every number read once
    for (int r = 0; r < spec.n; ++r) {
      for (char** e = spec.ranks[r].envp; *e != nullptr; ++e) total += std::strlen(*e);
      for (int i = 0; i < spec.ranks[r].argc; ++i) total += std::strlen(spec.ranks[r].argv[i]);
      for (int i = 0; i < spec.ranks[r].ncpus; ++i) sink = sink + spec.ranks[r].cpus[i];
      for (int i = 0; i < spec.ranks[r].nnodes; ++i) sink = sink + spec.ranks[r].nodes[i];
    }
    for (int i = 0; i < spec.argc; ++i) total += std::strlen(spec.argv[i]);
    if (total > size) __builtin_trap();  // strings can only come from the input
    dtrain_forkserver::free_spec(&spec);
  }
  return 0;
}
