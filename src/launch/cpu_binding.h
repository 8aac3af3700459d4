// CPU binding of the workers (`dtrain run --bind-cores-to-rank [--bind-core-list LIST]`, the
// DeepSpeed launcher's flags): each local rank runs on its own share of the node's cores, with
// OMP_NUM_THREADS set to that share unless the user set it.
//
// With a LIST (DeepSpeed's syntax: "0-7,16-23", ascending, no overlap) the logical CPUs are
// split as DeepSpeed splits them: len/nproc consecutive entries per rank. Without one, the
// node's physical cores (those this agent may run on, sched_getaffinity, grouped by
// /sys/devices/system/cpu/cpuN/topology) are split evenly and each rank gets every logical CPU
// of its cores - its hyperthreads too, so a rank's communication thread does not take a core
// from another rank. (DeepSpeed takes CPUs 0..P-1 for P physical cores: the same cores where the
// kernel numbers hyperthread siblings last, as on most Intel hosts, but not where siblings are
// adjacent.) Each worker applies its set itself before the program runs (spawn: before exec;
// the fork server: in the forked child), from DTRAIN_BIND_CPUS in its environment.
#pragma once

#include <string>
#include <vector>

namespace dtrain::launch {

// "0-3,8" -> {0, 1, 2, 3, 8}. UsageError (naming `flag`) on bad syntax, descending or
// overlapping ranges.
std::vector<int> parse_cpu_list(const std::string& flag, const std::string& text);
// {0, 1, 2, 3, 8} -> "0,1,2,3,8" (any list of numbers in this form: CPUs, GPUs, slots).
std::string cpu_list_string(const std::vector<int>& cpus);

struct CpuBinding {
  std::vector<std::vector<int>> cpus;  // per local rank: the logical CPUs it is bound to
  int cores_per_rank = 0;              // its OMP_NUM_THREADS
};

// The binding of `nproc` local ranks: over `core_list` when it is not empty, else over the
// physical cores this process may run on (see above). UsageError when a rank would get no core
// or the list names a CPU this process may not run on.
CpuBinding bind_cores(int nproc, const std::vector<int>& core_list);

// The logical CPUs this process may run on (sched_getaffinity), ascending.
std::vector<int> allowed_cpus();

}  // namespace dtrain::launch
