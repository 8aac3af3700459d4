// A forked worker's /proc/<pid>/cmdline and /proc/<pid>/environ (see proc_identity.h).
//
// The kernel shows a process's arguments and environment from the address ranges
// mm->arg_start..arg_end and env_start..env_end, which execve sets and a fork copies. A worker
// forked from the server would show the server's: its command line with `${local_rank}`
// unsubstituted (dtrain deepspeed's --local_rank=N missing) and no RANK. prctl(PR_SET_MM,
// PR_SET_MM_MAP) moves those ranges without privileges (CAP_SYS_RESOURCE is needed only for
// its single-field forms): the map carries every field, so the others are set to their current
// values from /proc/self/stat and brk(0).
#include "launch/forkserver/proc_identity.h"

#include <fcntl.h>
#include <linux/prctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace dtrain::forkserver {
namespace {

// /proc/self/stat's fields by number (proc(5)): 26 startcode, 27 endcode, 28 startstack,
// 45 start_data, 46 end_data, 47 start_brk, 48 arg_start, 49 arg_end, 50 env_start, 51 env_end.
constexpr int kFields = 52;

bool read_stat(uint64_t (&field)[kFields]) {
  char buf[4096];
  const int fd = ::open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t n = 0;
  while (n < sizeof buf - 1) {
    const ssize_t r = ::read(fd, buf + n, sizeof buf - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += static_cast<size_t>(r);
  }
  ::close(fd);
  buf[n] = '\0';
  // Field 2, the name in parentheses, may hold spaces and parentheses: fields 3.. follow the
  // last ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return false;
  ++p;
  for (int i = 3; i < kFields; ++i) {
    while (*p == ' ') ++p;
    if (*p == '\0') return false;
    if (i == 3) {  // the state, a letter
      while (*p != ' ' && *p != '\0') ++p;
      continue;
    }
    uint64_t v = 0;
    const bool negative = *p == '-';
    if (negative) ++p;
    while (*p >= '0' && *p <= '9') v = v * 10 + static_cast<uint64_t>(*p++ - '0');
    if (*p != ' ' && *p != '\n' && *p != '\0') return false;
    field[i] = negative ? 0 : v;
  }
  return true;
}

size_t strings_size(const char* const* v, int n) {
  size_t size = 0;
  for (int i = 0; i < n; ++i) size += std::strlen(v[i]) + 1;
  return size;
}

char* copy_strings(char* to, const char* const* v, int n) {
  for (int i = 0; i < n; ++i) {
    const size_t len = std::strlen(v[i]) + 1;
    std::memcpy(to, v[i], len);
    to += len;
  }
  return to;
}

}  // namespace

bool show_in_proc(int argc, const char* const* argv, const char* const* envp) {
  if (argc <= 0 || argv == nullptr) return false;
  int envc = 0;
  while (envp != nullptr && envp[envc] != nullptr) ++envc;
  uint64_t f[kFields] = {};
  if (!read_stat(f)) return false;
  // Arguments and environment back to back, as execve lays them out (the kernel reads a
  // command line rewritten past its end on into the environment only when they touch).
  const size_t arg_size = strings_size(argv, argc);
  const size_t env_size = strings_size(envp, envc);
  void* mem = ::mmap(nullptr, arg_size + env_size + 1, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return false;
  char* const args = static_cast<char*>(mem);
  char* const env = copy_strings(args, argv, argc);
  char* const env_end = copy_strings(env, envp, envc);
  prctl_mm_map map{};
  map.start_code = f[26];
  map.end_code = f[27];
  map.start_stack = f[28];
  map.start_data = f[45];
  map.end_data = f[46];
  map.start_brk = f[47];
  map.brk = static_cast<uint64_t>(::syscall(SYS_brk, 0));
  map.arg_start = reinterpret_cast<uint64_t>(args);
  map.arg_end = reinterpret_cast<uint64_t>(env);
  map.env_start = reinterpret_cast<uint64_t>(env);
  map.env_end = reinterpret_cast<uint64_t>(env_end);
  map.exe_fd = static_cast<uint32_t>(-1);  // the executable stays
  if (::prctl(PR_SET_MM, PR_SET_MM_MAP, &map, sizeof map, 0) != 0) {
    ::munmap(mem, arg_size + env_size + 1);
    return false;
  }
  return true;
}

}  // namespace dtrain::forkserver
