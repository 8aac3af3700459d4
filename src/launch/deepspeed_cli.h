// `dtrain deepspeed`: DeepSpeed's `deepspeed` launcher (0.19.8's flags) on dtrain's launcher,
// and its worker shim `dtrain deepspeed-exec` (src/launch/deepspeed_cli.cpp,
// docs/deepspeed_launcher.md).
//
// The job runs as `dtrain run` runs it (one agent per node, fast failure, no orphans, prefixed
// output, ssh hosts); each worker is `dtrain deepspeed-exec ... PROGRAM ARGS`, which turns the
// torchrun environment the agent set into the one DeepSpeed's launch.py gives (RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT,
// CUDA_VISIBLE_DEVICES; none of torchrun's own), appends `--local_rank=N` and execs PROGRAM.
// No libtorch (dtrain_core). Thread-safe functions (no state) except the two mains.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dtrain::launch {

// One host of DeepSpeed's resource pool after --include/--exclude: its slot (device) ids.
struct DsHost {
  std::string name;
  std::vector<int> slots;
};

// DeepSpeed's hostfile (`HOST slots=N` lines, `#` comments, blank lines), `lines` as read.
// Throws UsageError with DeepSpeed's wording: a bad line, a host given twice, no host at all.
std::vector<std::pair<std::string, int>> parse_ds_hostfile(const std::vector<std::string>& lines);

// DeepSpeed's --include/--exclude filter (NODE_SPEC[@NODE_SPEC...], NODE_SPEC =
// NAME[:SLOT[,SLOT...]]) over `pool` (host, slot count), in the pool's host order. Throws
// UsageError with DeepSpeed's wording for an unknown host or slot, both filters given, or a
// malformed spec.
std::vector<DsHost> ds_resource_filter(const std::vector<std::pair<std::string, int>>& pool,
                                       const std::string& include, const std::string& exclude);

// `dtrain deepspeed ARGS...` (args after the subcommand). Returns the exit code: 0, a failing
// worker's code, 2 for bad flags or a bad hostfile (one line saying what and what to do), 1
// otherwise.
int deepspeed_main(const std::vector<std::string>& args);

// `dtrain deepspeed-exec --world SLOTS [...] -- PROGRAM ARGS`: the worker shim (see above).
// Returns only on error.
int deepspeed_exec_main(const std::vector<std::string>& args);

}  // namespace dtrain::launch
