// Host files (`host slots=N` lines) and -H lists (`host1:2,host2`) as `dtrain run`,
// horovodrun and the Distributor read them (launch/options_internal.h). The input is the
// file's contents (read through a memfd) and, split at its first newline, a -H list.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "fuzz/fuzz_support.h"
#include "launch/options_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  int fd = ::memfd_create("hostfile", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size())) {
    std::string path = "/proc/self/fd/" + std::to_string(fd);
    dtrain::fuzz::refused_properly([&] { dtrain::parse_hostfile(path, 1); });
  }
  ::close(fd);
  dtrain::fuzz::refused_properly(
      [&] { dtrain::parse_host_list(text.substr(0, text.find('\n')), 2); });
  return 0;
}
