#include "launch/gpus.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace dtrain::launch {

namespace {

// The child's side: dlopen the driver, count, write the count (or a negative code) and _exit.
[[noreturn]] void probe_driver(int fd) {
  int result = -1;  // no driver
  if (void* cuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    using Init = int (*)(unsigned);
    using Count = int (*)(int*);
    auto init = reinterpret_cast<Init>(::dlsym(cuda, "cuInit"));
    auto count = reinterpret_cast<Count>(::dlsym(cuda, "cuDeviceGetCount"));
    int n = 0;
    if (!init || !count) {
      result = -2;  // not a CUDA driver
    } else if (int rc = init(0); rc == 100 /* CUDA_ERROR_NO_DEVICE */) {
      result = 0;
    } else if (rc != 0) {
      result = -3;  // the driver failed to initialise
    } else if (count(&n) == 0) {
      result = n;
    } else {
      result = -3;
    }
  }
  (void)!::write(fd, &result, sizeof result);
  ::_exit(0);
}

int count_device_files() {
  int n = 0;
  while (std::filesystem::exists("/dev/nvidia" + std::to_string(n))) ++n;
  return n;
}

}  // namespace

int visible_limit(const char* v, int present) {
  if (!v) return -1;
  std::string s(v);
  int n = 0;
  size_t i = 0;
  while (i <= s.size()) {
    size_t comma = s.find(',', i);
    std::string item = s.substr(i, comma == std::string::npos ? std::string::npos : comma - i);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front())))
      item.erase(0, 1);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
    bool valid = false;
    if (item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0) {
      valid = true;  // a UUID: CUDA resolves it; assume it names a present device
    } else if (!item.empty() && item.find_first_not_of("0123456789") == std::string::npos) {
      valid = std::stoll(item) < present;
    }
    if (!valid) break;
    ++n;
    if (comma == std::string::npos) break;
    i = comma + 1;
  }
  return n < present ? n : present;
}

GpuCount count_gpus(int timeout_ms) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) == 0) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      probe_driver(fds[1]);
    }
    ::close(fds[1]);
    int result = -4;  // the probe did not answer
    if (pid > 0) {
      pollfd p{fds[0], POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) > 0) {
        int value = 0;
        if (::read(fds[0], &value, sizeof value) == static_cast<ssize_t>(sizeof value))
          result = value;
      }
      if (result == -4) ::kill(pid, SIGKILL);
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    ::close(fds[0]);
    if (result >= 0) return {result, "CUDA driver"};
  }
  // No usable driver: the device files, as far as CUDA_VISIBLE_DEVICES lets a process see them.
  const int files = count_device_files();
  const int limit = visible_limit(std::getenv("CUDA_VISIBLE_DEVICES"), files);
  const int n = limit < 0 ? files : limit;
  return {n, n > 0 ? "/dev/nvidia* (no CUDA driver library answered)"
                   : "no CUDA driver (libcuda.so.1) and no /dev/nvidia* device"};
}

}  // namespace dtrain::launch
