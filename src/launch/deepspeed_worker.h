// One worker of `dtrain deepspeed`, as DeepSpeed 0.19.8's launch.py starts it: its rank, its
// LOCAL_RANK (RANK % LOCAL_SIZE), its argv (`--local_rank=N` appended), its variables, its core
// binding (the numactl command of deepspeed/utils/numa.py) and its log file.
//
// `dtrain deepspeed` gives the agent a worker shim as the program: `dtrain deepspeed-exec
// [DsExec's flags] -- PROGRAM ARGS` (DsExec). Two places turn that into DeepSpeed's worker with
// the functions below, so both give the same argv and environment:
//  - the shim itself (spawn: the agent fork+execs it per worker): it applies ds_worker() to its
//    own environment and binding and execs PROGRAM;
//  - the agent, when PROGRAM starts from a fork server (a libtorch program, as `dtrain run`
//    decides: fork_server_program()): the server loads PROGRAM once and forks each worker with
//    ds_worker()'s argv, environment and binding (forkserver/protocol.h); no shim runs.
// No libtorch. Thread-safe (no state).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/launch.h"

namespace dtrain::launch {

// The shim's flags: what DeepSpeed's launch.py gets from its runner (world info, port, the
// script's form) and what the agent's torchrun environment needs undone.
struct DsExec {
  std::vector<std::vector<int>> world;  // every node's slot ids, node order ("0,1/0,1,2")
  std::string master_port;
  std::string python;  // the interpreter; "": $DTRAIN_PYTHON, else python3
  // The agent's variables the launching shell did not hold (torchrun's contract): unset.
  std::vector<std::string> drop;
  // Non-empty: "<dir>/<YYYYmmddHHMMSS>"; each rank writes to "<rank_log>_rank<R>.log".
  std::string rank_log;
  bool no_local_rank = false;
  bool module = false;
  bool no_python = false;
  bool bind_cores = false;     // --bind_cores_to_rank
  std::string bind_core_list;  // --bind_core_list, as given ("" for none)
  std::string program;         // as given: the workers see it so in argv
  std::vector<std::string> args;
};

// "0,2" -> {0, 2}: a hostfile's or --include's slot list, a node of the shim's --world.
// UsageError(bad(item)) on an item that is not an integer.
std::vector<int> parse_slot_list(const std::string& text,
                                 const std::function<std::string(const std::string&)>& bad);

// `dtrain deepspeed-exec ARGS` (after the subcommand) back and forth. parse_ds_exec throws
// UsageError naming what is wrong.
std::vector<std::string> ds_exec_args(const DsExec& e);
DsExec parse_ds_exec(const std::vector<std::string>& args);

// The shim `o` runs when `o` is a `dtrain deepspeed` job (its program is this dtrain and its
// first argument deepspeed-exec), parsed; nullopt otherwise.
std::optional<DsExec> deepspeed_shim_of(const LaunchOptions& o);

// DeepSpeed's core binding of one local rank (deepspeed/utils/numa.py, get_numactl_cmd): the
// cores are --bind_core_list's, else 0..P-1 for the P physical cores of the machine (psutil's
// count); each of num_local_procs ranks gets len/num_local_procs consecutive ones, by LOCAL_RANK.
// Its memory goes to the NUMA node holding all of them (numactl -m; -p to the node's
// memory-only twin on a flat-HBM machine; -m over every copy of a fake-NUMA node).
struct DsNumactl {
  int cores_per_rank = 0;  // its OMP_NUM_THREADS
  std::vector<int> cpus;   // numactl -C
  char mem_flag = 0;       // 0, 'm' or 'p'
  std::vector<int> mem_nodes;
  // set_mempolicy's mode for mem_flag: MPOL_PREFERRED ('p'), MPOL_BIND ('m'); 0 for none.
  int mem_policy() const;
  // DeepSpeed's command: {"numactl", ["-m"|"-p", NODES,] "-C", "0-3,8"}.
  std::vector<std::string> command() const;
};
// `numa_cores`: each NUMA node's CPUs, as numactl --hardware lists them (numa_node_cpus());
// `physical_cores`: psutil.cpu_count(logical=False) (physical_core_count()). UsageError, in
// DeepSpeed's words, when a rank would get no core or the list is malformed.
DsNumactl ds_numactl(const std::string& bind_core_list, int num_local_procs, int local_rank,
                     const std::vector<std::vector<int>>& numa_cores, int physical_cores);
// This machine's NUMA nodes' CPUs (sysfs: what `numactl --hardware` prints), node order.
std::vector<std::vector<int>> numa_node_cpus();
// This machine's physical cores, counted as psutil 7 counts them (distinct core_cpus_list of
// every CPU, else /proc/cpuinfo's cores per package); 0 when it cannot tell.
int physical_core_count();
// Binds this process (and what it execs) as DsNumactl says: sched_setaffinity and
// set_mempolicy. False, errno set, when the kernel refuses.
bool apply_numactl(const DsNumactl& b);

// The worker at `position` (the agent's LOCAL_RANK) on node `node` (GROUP_RANK).
struct DsWorker {
  int rank = 0;
  int local_rank = 0;             // RANK % LOCAL_SIZE
  std::vector<std::string> argv;  // [python -u [-m]] PROGRAM [--local_rank=N] ARGS
  std::optional<DsNumactl> binding;
  std::string log_path;  // "": the agent's pipes
};
// UsageError when node/position do not fit the world.
DsWorker ds_worker(const DsExec& e, int node, int position);
// The worker's environment from the agent's (`env`, KEY=VALUE): the dropped names unset,
// DeepSpeed's variables set (CUDA_VISIBLE_DEVICES, MASTER_PORT, WORLD_SIZE, CROSS_RANK,
// CROSS_SIZE, LOCAL_SIZE, RANK, LOCAL_RANK) and, bound, OMP_NUM_THREADS unless it is still set.
std::vector<std::string> ds_worker_env(const std::vector<std::string>& env, const DsExec& e,
                                       int node, const DsWorker& w);

}  // namespace dtrain::launch
