// What the cluster engines (Slurm, Open MPI, MPICH) tell a task about its place in a job.
//
// `srun -n 4 prog` and `mpirun -np 4 prog` start programs without dtrain's (torchrun's)
// worker environment. init_process_group() then calls engine_worker_env(), which derives
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the
// engine's own variables. `dtrain run` inside a Slurm step uses slurm_step() to find the
// node list, its node rank and the number of nodes. Libtorch-free (dtrain::core).
//
// Precedence: RANK and WORLD_SIZE present -> the launcher's contract (dtrain/env.h), none of
// this. Else SLURM_PROCID (inside a step) -> Slurm; else OMPI_COMM_WORLD_RANK -> Open MPI;
// else PMI_RANK -> MPICH (Hydra). MASTER_ADDR / MASTER_PORT, when set, always win.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/env.h"

namespace dtrain {

// Reads one environment variable; nullptr when unset. The default reads the process's
// environment; tests pass a map.
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup process_env();

// A task's place in a job started by an engine.
struct EngineTask {
  std::string engine;  // "slurm", "openmpi" or "mpich"
  int rank = 0;        // global rank
  int world_size = 1;
  int local_rank = 0;        // rank among the job's tasks on this node
  int local_world_size = 1;  // the job's tasks on this node
  int node_rank = 0;  // this node's index (Slurm: in the step's node list; MPI: 0 when unknown)
  int nnodes = 1;     // nodes of the job (MPI: 1 when every rank is local, else 0 = unknown)
  std::vector<std::string> hosts;  // the step's hosts in node order (Slurm only)
  std::string master_addr;         // rank 0's host, reachable from every node
  int master_port = 29500;         // the store's port: MASTER_PORT, else derived from the job id
  std::string job_id;              // the engine's id of this job (and step)
};

// Expands a Slurm host list: "n[1-3,7],gpu[08-10]-a,login" -> n1 n2 n3 n7 gpu08-a gpu09-a
// gpu10-a login (zero padding kept). Throws UsageError on a malformed list.
std::vector<std::string> expand_hostlist(const std::string& list);

// Expands SLURM_TASKS_PER_NODE: "2(x3),1" -> 2 2 2 1. Throws UsageError when malformed.
std::vector<int> expand_tasks_per_node(const std::string& spec);

// The store port every task of one job derives alike from the job's id: 20000 + a hash
// mod 12000 (below Linux's ephemeral range 32768-60999), so two jobs sharing a node rarely
// collide and no task has to tell the others. Set MASTER_PORT to choose it yourself.
int derived_port(const std::string& job_id);

// The task's place from the engine's variables, or nullopt when no engine started it.
// Throws UsageError when an engine's variables are inconsistent, or when ranks of an MPI
// job span several nodes and no MASTER_ADDR says where rank 0 is (the message says how to
// set it).
std::optional<EngineTask> detect_engine_task(const EnvLookup& env = process_env());

// The worker contract for a task an engine started: rank, sizes, MASTER_ADDR/PORT from
// detect_engine_task(), and use_agent_store = false (no agent: rank 0 hosts the store).
std::optional<WorkerEnv> engine_worker_env(const EnvLookup& env = process_env());

// A Slurm job step seen from one of its tasks (for `dtrain run` under srun).
struct SlurmStep {
  std::string job_id;              // SLURM_JOB_ID
  std::string step_id;             // SLURM_STEP_ID
  std::vector<std::string> hosts;  // SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), expanded
  int node_rank = 0;               // index of SLURMD_NODENAME in hosts (else SLURM_NODEID)
  int nnodes = 1;                  // SLURM_STEP_NUM_NODES (else SLURM_NNODES)
  int ntasks = 1;                  // SLURM_STEP_NUM_TASKS (else SLURM_NTASKS)
  std::string node_name;           // SLURMD_NODENAME
};

// The step this process runs in, or nullopt outside a step (no SLURM_JOB_ID, or a batch
// script's shell, which has no SLURM_STEP_ID). Throws UsageError when the variables are
// inconsistent (the message names them).
std::optional<SlurmStep> slurm_step(const EnvLookup& env = process_env());

}  // namespace dtrain
