// libdtrain_forkserver.so: the fork server of `dtrain run --start-method forkserver`.
//
// The agent starts the worker program once, with this library in LD_PRELOAD and
// DTRAIN_FORKSERVER=<its pid>:<spec fd>:<reply fd> in its environment. The dynamic loader maps and
// initialises every shared library the program needs (libtorch: ~0.6 s and ~0.9 CPU-s on
// this project's machines) and then calls __libc_start_main, which this library
// interposes. Here, with the libraries ready and before the program's own constructors
// and main, the process - the fork server - forks one child per local worker. Each child
// leads its own session, takes its rank's stdout/stderr and environment from the spec, waits until
// the agent (a child subreaper) has adopted it, arms PR_SET_PDEATHSIG, and continues into the real
// __libc_start_main: the program's constructors, then main, exactly as a fresh process
// would run them. The server reports each child's pid and exits.
//
// Safety rules:
//  - A child is only forked from a single-threaded server (fork copies the calling thread
//    only). If a library still has a thread after its pthread_atfork handlers ran, the
//    server fork+execs the program for each worker instead - the plain start - and says so
//    to the agent.
//  - At exit a forked child runs its atexit handlers, its program's static destructors, the
//    destructor functions of the program and of what it dlopen'ed, flushes stdio and the C++
//    streams, and ends with the exit status; it does not run the destructors of the
//    libraries the server initialised: freeing libtorch's registries would copy-on-write
//    ~12k pages (~0.5 CPU-s) per worker for nothing (Android's zygote children skip them too).
//  - Only the process DTRAIN_FORKSERVER names serves: a program started while the libraries
//    load inherits the variable and this library, and runs as it would without them.
//
// Warm mode (DTRAIN_FORKSERVER_WARM, started by a Tuner: src/tune/warm_fork_server.h): the
// server stays, accepting launches on a unix socket; each gets a launch server forked from it
// that forks the workers, stays their parent and relays their wait statuses (protocol.h).
//
// The library uses only libc (no C++ runtime): it is loaded into programs that may not have
// one.
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "launch/forkserver/proc_identity.h"
#include "launch/forkserver/protocol.h"
#include "launch/forkserver/spec.h"

extern char** environ;

namespace {

using MainFn = int (*)(int, char**, char**);
using StartFn = int (*)(MainFn, int, char**, void (*)(), void (*)(), void (*)(), void*);

MainFn g_main = nullptr;
void (*g_rtld_fini)() = nullptr;
volatile int g_status = 0;
volatile bool g_status_known = false;

void write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// False when the agent's end of the pipe is gone (with SIGPIPE ignored).
bool report(int fd, int32_t index, int32_t value) {
  dtrain_forkserver::Record r{index, value};
  const char* p = reinterpret_cast<const char*>(&r);
  for (size_t n = sizeof r; n > 0;) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

void (*g_pipe_handler)(int) = SIG_DFL;  // a warm launch server's workers get it back

[[noreturn]] void fail(int reply_fd, const char* what) {
  const int err = errno;
  dprintf(STDERR_FILENO, "dtrain fork server: %s: %s\n", what, strerror(err));
  report(reply_fd, dtrain_forkserver::kError, err);
  ::_exit(127);
}

int thread_count() {
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// --- exit of a forked child -------------------------------------------------

void record_status(int status, void*) {
  g_status = status;
  g_status_known = true;
}

// The loaded objects in load order (the program first), as dl_iterate_phdr lists them.
struct Objects {
  dl_phdr_info items[1024];
  size_t count = 0;
};
Objects g_server_objects;  // what was loaded when the server forked

bool loaded_by_server(const dl_phdr_info& info) {
  for (size_t i = 0; i < g_server_objects.count; ++i) {
    const dl_phdr_info& s = g_server_objects.items[i];
    if (s.dlpi_addr == info.dlpi_addr && s.dlpi_phdr == info.dlpi_phdr) return true;
  }
  return false;
}

int collect(dl_phdr_info* info, size_t, void* data) {
  auto* o = static_cast<Objects*>(data);
  if (o->count < sizeof o->items / sizeof o->items[0]) o->items[o->count++] = *info;
  return 0;
}

// One object's destructor functions (DT_FINI_ARRAY, then DT_FINI), as _dl_fini runs them.
void run_fini(const dl_phdr_info& info) {
  ElfW(Addr) fini_array = 0, fini = 0;
  size_t fini_size = 0;
  for (int i = 0; i < info.dlpi_phnum; ++i) {
    if (info.dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
    auto* dyn = reinterpret_cast<ElfW(Dyn)*>(info.dlpi_addr + info.dlpi_phdr[i].p_vaddr);
    for (; dyn->d_tag != DT_NULL; ++dyn) {
      if (dyn->d_tag == DT_FINI_ARRAY) fini_array = dyn->d_un.d_ptr;
      if (dyn->d_tag == DT_FINI_ARRAYSZ) fini_size = dyn->d_un.d_val;
      if (dyn->d_tag == DT_FINI) fini = dyn->d_un.d_ptr;
    }
  }
  // The loader leaves these two unrelocated (it adjusts only the tables it uses itself).
  if (fini_array) {
    auto* fns = reinterpret_cast<void (**)()>(info.dlpi_addr + fini_array);
    for (size_t i = fini_size / sizeof(void*); i-- > 0;) {
      if (fns[i] != nullptr && fns[i] != reinterpret_cast<void (*)()>(-1)) fns[i]();
    }
  }
  if (fini) reinterpret_cast<void (*)()>(info.dlpi_addr + fini)();
}

// What the skipped libstdc++ destructor (the last std::ios_base::Init) would do: flush the
// standard C++ streams - which keep their own buffers after sync_with_stdio(false). Only
// streams that were constructed: their storage is zero (no vtable pointer) until then.
void flush_streams(const char* flush_symbol, const char* const* names, size_t count) {
  using Flush = void* (*)(void*);
  auto flush = reinterpret_cast<Flush>(::dlsym(RTLD_DEFAULT, flush_symbol));
  if (flush == nullptr) return;  // no libstdc++
  for (size_t i = 0; i < count; ++i) {
    void* stream = ::dlsym(RTLD_DEFAULT, names[i]);
    void* vptr = nullptr;
    if (stream != nullptr) memcpy(&vptr, stream, sizeof vptr);
    if (vptr != nullptr) flush(stream);
  }
}

void flush_cxx_streams() {
  static const char* const narrow[] = {"_ZSt4cout", "_ZSt4cerr", "_ZSt4clog"};
  static const char* const wide[] = {"_ZSt5wcout", "_ZSt5wcerr", "_ZSt5wclog"};
  flush_streams("_ZNSo5flushEv", narrow, 3);
  flush_streams("_ZNSt13basic_ostreamIwSt11char_traitsIwEE5flushEv", wide, 3);
}

// Takes the place of the dynamic loader's destructor hook (_dl_fini) in a forked child: it
// runs after the program's static destructors and atexit handlers. It runs the destructor
// functions of the objects the worker loaded itself (dlopen), newest first, and the
// program's, but not those of the libraries the server had loaded.
void child_fini() {
  if (!g_status_known) {  // exit() before main: do everything the usual way
    if (g_rtld_fini) g_rtld_fini();
    return;
  }
  static Objects objects;
  objects.count = 0;
  ::dl_iterate_phdr(collect, &objects);
  for (size_t i = objects.count; i-- > 1;) {
    if (!loaded_by_server(objects.items[i])) run_fini(objects.items[i]);
  }
  if (objects.count > 0) run_fini(objects.items[0]);
  flush_cxx_streams();
  ::fflush(nullptr);
  ::_exit(g_status);
}

int child_main(int argc, char** argv, char** envp) {
  ::on_exit(record_status, nullptr);
  return g_main(argc, argv, envp);
}

// --- the spec ---------------------------------------------------------------

constexpr int kBitsPerWord = 8 * sizeof(unsigned long);
constexpr int kNodeMaskWords = 1024 / kBitsPerWord;  // NUMA nodes 0..1023

using dtrain_forkserver::RankSpec;

// Reads the spec from its memfd (spec.h parses it); returns the number of ranks, or -1. A
// warm spec (kMagicWarm) also carries the program's arguments (into *argc_out / *argv_out)
// and no fd numbers: the workers' fds are `fds` (stdout, stderr of each worker in turn).
int read_spec(int fd, RankSpec** out, int* agent_pid, bool warm = false, const int* fds = nullptr,
              int nfds = 0, int* argc_out = nullptr, char*** argv_out = nullptr) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) return -1;
  char* buf = static_cast<char*>(::malloc(static_cast<size_t>(st.st_size)));
  if (!buf) return -1;
  size_t got = 0;
  while (got < static_cast<size_t>(st.st_size)) {
    ssize_t n =
        ::pread(fd, buf + got, static_cast<size_t>(st.st_size) - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::free(buf);
      return -1;
    }
    got += static_cast<size_t>(n);
  }
  dtrain_forkserver::Spec spec;
  const bool ok = dtrain_forkserver::parse_spec(buf, got, warm, fds, nfds, &spec);
  ::free(buf);
  if (!ok) return -1;
  *out = spec.ranks;  // kept for the server's life, as are the arguments
  *agent_pid = spec.agent_pid;
  if (warm) {
    *argc_out = spec.argc;
    *argv_out = spec.argv;
  }
  return spec.n;
}

// The program's own preparation for its workers, where it has one: an exported
// `extern "C" void dtrain_forkserver_prepare(void)` runs here, in the server, once, before any
// worker is forked and before the program's constructors - so what every worker would otherwise
// load or build for itself at start-up is done once and shared (dtrain's runtime loads its CUDA
// plugin there on a GPU machine: libtorch_cuda, ~0.15 CPU-s and ~340 MB per process otherwise).
// It may load libraries but must not start threads (the workers would then be fork+exec'd) nor
// initialise CUDA's driver (a forked child cannot use it).
void prepare_program() {
  using Prepare = void (*)();
  if (auto fn = reinterpret_cast<Prepare>(::dlsym(RTLD_DEFAULT, "dtrain_forkserver_prepare"))) fn();
}

// --- the server -------------------------------------------------------------

// Whether the spec fd named in DTRAIN_FORKSERVER (<pid>:<spec fd>:<reply fd>) is the agent's
// memfd.
bool is_spec_memfd(const char* config) {
  int pid = 0, spec_fd = -1, reply_fd = -1;
  if (sscanf(config, "%d:%d:%d", &pid, &spec_fd, &reply_fd) != 3 || spec_fd < 0) return false;
  char link[64], target[256] = {0};
  snprintf(link, sizeof link, "/proc/self/fd/%d", spec_fd);
  ssize_t n = ::readlink(link, target, sizeof target - 1);
  static const char expected[] = "/memfd:dtrain-forkserver-spec";
  return n > 0 && strncmp(target, expected, sizeof expected - 1) == 0;
}

// Forking copies only this thread: with more, each worker starts afresh (fork + exec, only
// async-signal-safe calls in between). Libraries may stop their threads for a fork in
// pthread_atfork handlers (OpenBLAS does with its pool, which it starts while loading when
// OMP_NUM_THREADS > 1, and restarts on its next call): one throwaway fork runs those
// handlers; then count again. True: the workers must be fork+exec'd.
bool needs_exec_mode() {
  int threads = thread_count();
  if (threads > 1) {
    const pid_t probe = ::fork();
    if (probe == 0) ::_exit(0);
    if (probe > 0) {
      while (::waitpid(probe, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    // A joined thread leaves /proc/self/task a moment after pthread_join returns.
    const struct timespec tick = {0, 1000 * 1000};
    for (int i = 0; i < 20 && (threads = thread_count()) > 1; ++i) ::nanosleep(&tick, nullptr);
  }
  return threads != 1;
}

// Binds this process to a worker's CPUs and memory nodes (the spec's, protocol.h: `dtrain run
// --bind-cores-to-rank`, `dtrain deepspeed --bind_cores_to_rank`'s numactl -C/-m/-p), before the
// program runs; its threads inherit both. False when the kernel refuses (nothing to bind: true).
bool bind_worker(const RankSpec& rank) {
  if (rank.ncpus > 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < rank.ncpus; ++i) {
      if (rank.cpus[i] < 0 || rank.cpus[i] >= CPU_SETSIZE) return false;
      CPU_SET(rank.cpus[i], &set);
    }
    if (::sched_setaffinity(0, sizeof set, &set) != 0) return false;
  }
  if (rank.mem_policy != 0) {
    unsigned long mask[kNodeMaskWords] = {};
    for (int i = 0; i < rank.nnodes; ++i) {
      const int node = rank.nodes[i];
      if (node < 0 || node >= kNodeMaskWords * kBitsPerWord) return false;
      mask[node / kBitsPerWord] |= 1UL << (node % kBitsPerWord);
    }
    if (::syscall(SYS_set_mempolicy, rank.mem_policy, mask,
                  static_cast<unsigned long>(kNodeMaskWords * kBitsPerWord) + 1) != 0)
      return false;
  }
  return true;
}

// Whether CUDA's driver has been initialised in this process (cuInit): a child forked after that
// cannot use CUDA ("initialization error"). The driver is asked only if it is already loaded
// (RTLD_NOLOAD); cuCtxGetCurrent initialises nothing and answers CUDA_ERROR_NOT_INITIALIZED (3)
// before cuInit. Loading libtorch_cuda or libcudart does not initialise it.
bool cuda_initialised() {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (driver == nullptr) return false;
  using CtxGetCurrent = int (*)(void**);
  auto get = reinterpret_cast<CtxGetCurrent>(::dlsym(driver, "cuCtxGetCurrent"));
  void* ctx = nullptr;
  const bool initialised = get != nullptr && get(&ctx) != 3;
  ::dlclose(driver);
  return initialised;
}

// How the workers start (protocol.h): forked, unless that is unsafe.
int32_t start_mode() {
  if (needs_exec_mode()) return dtrain_forkserver::kModeExec;
  if (cuda_initialised()) return dtrain_forkserver::kModeExecCuda;
  return dtrain_forkserver::kModeFork;
}

// Forks the n workers and reports them. Plain (warm == false): the server exits once every
// worker is forked and the agent, a child subreaper, adopts them. Warm: this launch server
// stays their parent, reports each one's wait status as it exits, and exits after the last.
[[noreturn]] void fork_workers(int n, RankSpec* ranks, int agent_pid, int reply_fd, int32_t mode,
                               bool warm, StartFn real, int argc, char** argv, void (*init)(),
                               void (*fini)(), void (*rtld_fini)(), void* stack_end) {
  char self_path[4096];
  ssize_t len = ::readlink("/proc/self/exe", self_path, sizeof self_path - 1);
  if (len <= 0) fail(reply_fd, "cannot read /proc/self/exe");
  self_path[len] = '\0';
  report(reply_fd, dtrain_forkserver::kMode, mode);
  const bool exec_mode = mode != dtrain_forkserver::kModeFork;
  ::fflush(nullptr);  // nothing buffered may be written twice

  // Each worker waits for a byte from here before it goes on: the server writes them once it
  // has reported every pid. If the server dies first, the workers read EOF and exit - the
  // agent never has a worker it does not know.
  int go[2];
  if (::pipe2(go, O_CLOEXEC) != 0) fail(reply_fd, "pipe failed");
  const pid_t server = ::getpid();
  pid_t* pids = static_cast<pid_t*>(::calloc(static_cast<size_t>(n), sizeof(pid_t)));
  if (!pids) fail(reply_fd, "out of memory");
  for (int r = 0; r < n; ++r) {
    // Closed by the child once it leads its own session: only then is its pid reported.
    int session[2];
    if (::pipe2(session, O_CLOEXEC) != 0) fail(reply_fd, "pipe failed");
    const pid_t pid = ::fork();
    if (pid < 0) fail(reply_fd, "fork failed");
    if (pid == 0) {
      // Its own session, as torchrun 2.x starts workers (and so its own process group).
      if (::setsid() < 0) ::_exit(127);
      ::close(session[0]);
      ::close(session[1]);
      if (ranks[r].out_fd != STDOUT_FILENO) ::dup2(ranks[r].out_fd, STDOUT_FILENO);
      if (ranks[r].err_fd != STDERR_FILENO) ::dup2(ranks[r].err_fd, STDERR_FILENO);
      for (int k = 0; k < n; ++k) {
        if (ranks[k].out_fd > STDERR_FILENO) ::close(ranks[k].out_fd);
        if (ranks[k].err_fd > STDERR_FILENO) ::close(ranks[k].err_fd);
      }
      ::close(reply_fd);
      ::close(go[1]);
      char c;
      ssize_t got;
      do {
        got = ::read(go[0], &c, 1);
      } while (got < 0 && errno == EINTR);
      if (got != 1) ::_exit(127);
      ::close(go[0]);
      if (warm) {
        ::signal(SIGPIPE, g_pipe_handler);
        // The launch server stays our parent: we die with it (and it dies with the warm
        // server); the agent's guard kills us if the agent dies.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != server) ::_exit(127);
      } else {
        // The server exits once every worker is forked; the agent, a child subreaper, adopts
        // us. Only then does PR_SET_PDEATHSIG refer to the agent.
        const struct timespec pause = {0, 50 * 1000};
        for (int spins = 0; ::getppid() == server; ++spins) {
          if (spins > 200000) ::_exit(127);  // 10 s: the server is stuck
          ::nanosleep(&pause, nullptr);
        }
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != agent_pid) ::_exit(127);  // the agent is gone
      }
      if (!bind_worker(ranks[r])) {
        static const char msg[] =
            "dtrain fork server: cannot bind a worker to its CPUs or memory nodes "
            "(--bind-cores-to-rank)\n";
        write_all(STDERR_FILENO, msg, sizeof msg - 1);  // async-signal-safe: threads may exist
        ::_exit(127);
      }
      // The worker's own command line where the agent gave one (dtrain deepspeed's
      // --local_rank=N), else the server's.
      char** const wargv = ranks[r].argc > 0 ? ranks[r].argv : argv;
      const int wargc = ranks[r].argc > 0 ? ranks[r].argc : argc;
      if (exec_mode) {
        ::execve(self_path, wargv, ranks[r].envp);
        static const char msg[] = "dtrain fork server: cannot execute the program again\n";
        write_all(STDERR_FILENO, msg, sizeof msg - 1);  // async-signal-safe: threads exist
        ::_exit(127);
      }
      environ = ranks[r].envp;
      // ps and /proc/<pid>/{cmdline,environ} show the worker's, not the server's.
      dtrain::forkserver::show_in_proc(wargc, wargv, environ);
      g_rtld_fini = rtld_fini;
      // Continues as the program: constructors, main(), exit().
      ::_exit(real(child_main, wargc, wargv, init, fini, child_fini, stack_end));
    }
    // The session (and group) exists before the agent learns the pid, so -pid reaches the
    // worker. (A setpgid(pid, pid) here instead would make the child a group leader, and its
    // setsid fail.) EOF also when the child died first: the agent then reaps it.
    ::close(session[1]);
    char ignored;
    while (::read(session[0], &ignored, 1) < 0 && errno == EINTR) {
    }
    ::close(session[0]);
    pids[r] = pid;
    report(reply_fd, r, pid);
  }
  if (!report(reply_fd, dtrain_forkserver::kDone, 0) && warm) {
    // The agent gave up on this launch: its workers must not start (they read EOF and exit).
    for (int r = 0; r < n; ++r) ::kill(-pids[r], SIGKILL);
    ::_exit(1);
  }
  ::close(go[0]);
  for (int r = 0; r < n; ++r) write_all(go[1], "g", 1);
  if (!warm) ::_exit(0);
  ::close(go[1]);
  for (int r = 0; r < n; ++r) {
    if (ranks[r].out_fd > STDERR_FILENO) ::close(ranks[r].out_fd);
    if (ranks[r].err_fd > STDERR_FILENO) ::close(ranks[r].err_fd);
  }
  // Relay each worker's end to the agent (its waitpid cannot see them). No timeout: the
  // agent bounds its own waits and kills the workers' groups; we end with the last of them.
  for (int left = n; left > 0;) {
    int st = 0;
    const pid_t p = ::waitpid(-1, &st, 0);
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) break;
    for (int r = 0; r < n; ++r) {
      if (pids[r] == p) {
        report(reply_fd, dtrain_forkserver::kExitBase - r, st);
        pids[r] = 0;
        --left;
      }
    }
  }
  ::_exit(0);
}

[[noreturn]] void serve(const char* config, StartFn real, int argc, char** argv, void (*init)(),
                        void (*fini)(), void (*rtld_fini)(), void* stack_end) {
  int pid = 0, spec_fd = -1, reply_fd = -1, go_fd = -1;
  const int fields = sscanf(config, "%d:%d:%d:%d", &pid, &spec_fd, &reply_fd, &go_fd);
  if (fields < 3 || spec_fd < 0 || reply_fd < 0 || (fields == 4 && go_fd < 0)) {
    dprintf(STDERR_FILENO, "dtrain fork server: malformed DTRAIN_FORKSERVER='%s'\n", config);
    ::_exit(127);
  }
  prepare_program();  // a standby does it while it waits
  if (fields == 4) {
    // A standby (the agent's next attempt): the libraries are loaded; wait for the go-ahead,
    // after which the spec is in the memfd. EOF: the agent dropped us, leave quietly.
    char c;
    ssize_t got;
    do {
      got = ::read(go_fd, &c, 1);
    } while (got < 0 && errno == EINTR);
    ::close(go_fd);
    if (got != 1) ::_exit(0);
  }
  RankSpec* ranks = nullptr;
  int agent_pid = 0;
  const int n = read_spec(spec_fd, &ranks, &agent_pid);
  ::close(spec_fd);
  if (n <= 0) fail(reply_fd, "cannot read the workers' spec from the agent");
  // Nothing the program starts may inherit the agent's pipes.
  ::fcntl(reply_fd, F_SETFD, FD_CLOEXEC);
  for (int r = 0; r < n; ++r) {
    if (ranks[r].out_fd > STDERR_FILENO) ::fcntl(ranks[r].out_fd, F_SETFD, FD_CLOEXEC);
    if (ranks[r].err_fd > STDERR_FILENO) ::fcntl(ranks[r].err_fd, F_SETFD, FD_CLOEXEC);
  }
  ::dl_iterate_phdr(collect, &g_server_objects);
  fork_workers(n, ranks, agent_pid, reply_fd, start_mode(), false, real, argc, argv, init, fini,
               rtld_fini, stack_end);
}

// --- the warm server --------------------------------------------------------

// Receives one launch on an accepted connection: the byte and its fds. Returns the number
// of fds (<= max), or -1.
int receive_launch(int conn, int* fds, int max, char* byte_out) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 256)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t got;
  do {
    got = ::recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  if (got != 1) return -1;
  *byte_out = byte;
  int count = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const int k = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < k; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (count < max) {
        fds[count++] = fd;
      } else {
        ::close(fd);
      }
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) return -1;
  return count;
}

// The warm server: the program's libraries are loaded once; every launch an agent sends gets
// a launch server forked from here (single-threaded: this loop is the process's only thread).
// It ends with its parent (the Tuner's driver) or when the listening socket is shut down.
[[noreturn]] void serve_warm(const char* config, StartFn real, int argc, char** argv,
                             void (*init)(), void (*fini)(), void (*rtld_fini)(), void* stack_end) {
  int pid = 0, listen_fd = -1, parent = 0;
  if (sscanf(config, "%d:%d:%d", &pid, &listen_fd, &parent) != 3 || listen_fd < 0) {
    dprintf(STDERR_FILENO, "dtrain warm fork server: malformed DTRAIN_FORKSERVER_WARM='%s'\n",
            config);
    ::_exit(127);
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(0);  // the driver is already gone
  ::fcntl(listen_fd, F_SETFD, FD_CLOEXEC);
  prepare_program();
  ::dl_iterate_phdr(collect, &g_server_objects);
  const int32_t mode = start_mode();
  for (;;) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {  // launch servers that have ended
    }
    pollfd p{listen_fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 1000);
    if (ready < 0 && errno != EINTR) ::_exit(1);
    if (ready <= 0) continue;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) ::_exit(0);
    const int conn = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    const struct timeval limit = {5, 0};  // an agent sends at once; never hang on one
    ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    int fds[256];
    char what = 0;
    const int nfds = receive_launch(conn, fds, 256, &what);
    ::close(conn);
    if (nfds == 0 && what == 'Q') {
      // The driver is done: reap the launch servers still ending (5 s at most), then exit, so
      // none is left to init as a zombie.
      ::close(listen_fd);
      const struct timespec tick = {0, 5 * 1000 * 1000};
      for (int i = 0; i < 1000; ++i) {
        const pid_t r = ::waitpid(-1, nullptr, WNOHANG);
        if (r < 0 && errno == ECHILD) ::_exit(0);
        if (r == 0) ::nanosleep(&tick, nullptr);
      }
      ::_exit(0);
    }
    if (nfds < 2) {
      for (int i = 0; i < nfds; ++i) ::close(fds[i]);
      continue;
    }
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(listen_fd);
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // with the warm server; its workers with it
      const int spec_fd = fds[0], reply_fd = fds[1];
      // The agent gave up on us (it waits 10 s for this): start nothing.
      // A write to its closed pipe fails here (SIGPIPE ignored until the workers start).
      g_pipe_handler = ::signal(SIGPIPE, SIG_IGN);
      if (!report(reply_fd, dtrain_forkserver::kServerPid, ::getpid())) ::_exit(0);
      RankSpec* ranks = nullptr;
      int agent_pid = 0, wargc = 0;
      char** wargv = nullptr;
      const int n = read_spec(spec_fd, &ranks, &agent_pid, true, fds + 2, nfds - 2, &wargc, &wargv);
      ::close(spec_fd);
      if (n <= 0) fail(reply_fd, "cannot read the workers' spec from the agent");
      (void)argc;
      (void)argv;
      fork_workers(n, ranks, agent_pid, reply_fd, mode, true, real, wargc, wargv, init, fini,
                   rtld_fini, stack_end);
    }
    if (child < 0) {
      errno = errno ? errno : EAGAIN;
      report(fds[1], dtrain_forkserver::kError, errno);
    }
    for (int i = 0; i < nfds; ++i) ::close(fds[i]);
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int __libc_start_main(MainFn main, int argc,
                                                                        char** argv, void (*init)(),
                                                                        void (*fini)(),
                                                                        void (*rtld_fini)(),
                                                                        void* stack_end) {
  auto real = reinterpret_cast<StartFn>(::dlvsym(RTLD_NEXT, "__libc_start_main", "GLIBC_2.34"));
  if (!real) real = reinterpret_cast<StartFn>(::dlsym(RTLD_NEXT, "__libc_start_main"));
  if (!real) {
    dprintf(STDERR_FILENO, "dtrain fork server: cannot find __libc_start_main\n");
    ::_exit(127);
  }
  // The agent names the server by pid and hands it the spec memfd: a program that one of the
  // libraries starts while loading inherits the variable (and this library), and must just
  // run - as must a later process that happens to get the same pid.
  if (const char* warm = ::getenv("DTRAIN_FORKSERVER_WARM");
      warm != nullptr && std::atoi(warm) == ::getpid()) {
    g_main = main;
    char config_copy[128];
    snprintf(config_copy, sizeof config_copy, "%s", warm);
    ::unsetenv("DTRAIN_FORKSERVER_WARM");  // nothing a worker starts is a server
    serve_warm(config_copy, real, argc, argv, init, fini, rtld_fini, stack_end);
  }
  const char* config = ::getenv("DTRAIN_FORKSERVER");
  if (config == nullptr || std::atoi(config) != ::getpid() || !is_spec_memfd(config)) {
    return real(main, argc, argv, init, fini, rtld_fini, stack_end);
  }
  g_main = main;
  serve(config, real, argc, argv, init, fini, rtld_fini, stack_end);
}
