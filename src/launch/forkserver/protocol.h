// What the agent and the fork server (libdtrain_forkserver.so) say to each other.
//
// Agent -> server: a memfd, named by DTRAIN_FORKSERVER=<server pid>:<spec fd>:<reply fd>
// (the pid: only that process serves; anything it starts while loading just runs), holding
// little-endian u32s:
//   kMagic, number of workers, the agent's pid,
//   then per worker:
//     its stdout fd, its stderr fd (in the server);
//     the number of environment strings, and each string as (length, bytes) - the worker's
//     whole environment;
//     the number of argument strings, and each as (length, bytes) - the worker's own argv
//     (0: the server's: every worker runs the command line the server was started with);
//     the number of CPUs, and each CPU - the worker runs on those only (0: not bound);
//     a memory policy (0 none, else set_mempolicy's MPOL_BIND or MPOL_PREFERRED), the number
//     of NUMA nodes, and each node - the policy's nodes (numactl -m / -p).
// A standby server (started ahead of the attempt that will use it) gets a fourth field,
// DTRAIN_FORKSERVER=<pid>:<spec fd>:<reply fd>:<go fd>: it loads the program's libraries, then
// reads one byte from <go fd> before it reads the spec (written by then); EOF there: it exits 0.
// Server -> agent: Records on the reply pipe: {kMode, kModeFork|kModeExec|kModeExecCuda} first,
// then {worker index, pid} as each worker is forked, then {kDone, 0}; {kError, errno} on failure
// (the server exits 127 after it).
#pragma once

#include <cstdint>

namespace dtrain_forkserver {

constexpr uint32_t kMagic = 0x33465444;  // "DTF3" (DTF1: no argv, CPUs or memory policy)

struct Record {
  int32_t index;
  int32_t value;
};

constexpr int32_t kMode = -1;
constexpr int32_t kDone = -2;
constexpr int32_t kError = -3;
constexpr int32_t kModeFork = 0;  // workers are forked from the loaded program
constexpr int32_t kModeExec = 1;  // a library started a thread: workers are fork+exec'd
// CUDA's driver was initialised while loading (a forked child cannot use it): fork+exec'd too.
constexpr int32_t kModeExecCuda = 2;

// The warm server (DTRAIN_FORKSERVER_WARM=<its pid>:<listening unix socket fd>): one process
// that loads the program's libraries once and serves many launches (a Tuner's trials). An
// agent connects and sends one byte with SCM_RIGHTS fds [spec memfd, reply pipe, stdout and
// stderr of each worker]; the spec is kMagicWarm, number of workers, the agent's pid, argc,
// each argument as (length, bytes), then per worker its entry as above without the two fds. The
// server forks a launch server for it, which says {kServerPid, its pid} first, then what a fork
// server says; it stays the workers' parent (they cannot become the agent's children) and
// says {kExitBase - worker index, wait status} as each one exits, then exits itself.
constexpr uint32_t kMagicWarm = 0x34465444;  // "DTF4" (DTF2: environments only)
constexpr int32_t kServerPid = -4;
constexpr int32_t kExitBase = -1000;

}  // namespace dtrain_forkserver
