// What Slurm, Open MPI and MPICH put in a task's environment (engine_env.h), as any values:
// detect_engine_task, engine_worker_env and slurm_step read the variables through an
// EnvLookup, so the input fills a map. Input: pairs (name selector byte, value up to 64
// bytes) until it runs out.
#include <cstdint>
#include <map>
#include <string>

#include "dtrain/engine_env.h"
#include "fuzz/fuzz_support.h"

namespace {

const char* const kNames[] = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MPI_LOCALNRANKS",
    "MPI_LOCALRANKID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_NAMESPACE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURMD_NODENAME",
    "SLURM_JOBID",
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_LOCALID",
    "SLURM_NNODES",
    "SLURM_NODEID",
    "SLURM_NODELIST",
    "SLURM_NPROCS",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_STEPID",
    "SLURM_STEP_ID",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "HOSTNAME",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dtrain::fuzz::Input in(data, size);
  std::map<std::string, std::string> vars;
  while (!in.empty()) {
    const char* name = kNames[in.byte() % std::size(kNames)];
    vars[name] = std::string(in.bytes(64));
  }
  dtrain::EnvLookup env = [&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  dtrain::fuzz::refused_properly([&] { dtrain::detect_engine_task(env); });
  dtrain::fuzz::refused_properly([&] { dtrain::engine_worker_env(env); });
  dtrain::fuzz::refused_properly([&] { dtrain::slurm_step(env); });
  for (const auto& entry : vars) {
    const std::string& value = entry.second;  // (clang 14 cannot capture a structured binding)
    dtrain::fuzz::refused_properly([&] { dtrain::expand_hostlist(value); });
    dtrain::fuzz::refused_properly([&] { dtrain::expand_tasks_per_node(value); });
    dtrain::derived_port(value);
  }
  return 0;
}
