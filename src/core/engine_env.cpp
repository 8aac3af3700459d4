// The engines' variables seen from a task (dtrain/engine_env.h). Reading them is each
// engine's own (src/engines/: slurm.cpp also holds Slurm's host lists and steps, mpi.cpp Open
// MPI's and MPICH's variables); here is what every engine shares.
#include "dtrain/engine_env.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "engines/engine.h"

namespace dtrain {

EnvLookup process_env() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

int derived_port(const std::string& job_id) {
  // FNV-1a: stable across builds and hosts (std::hash is not guaranteed to be).
  uint32_t h = 2166136261u;
  for (unsigned char c : job_id) {
    h ^= c;
    h *= 16777619u;
  }
  return 20000 + static_cast<int>(h % 12000u);
}

// Each engine reads its own variables (src/engines/), asked in the registry's order.
std::optional<EngineTask> detect_engine_task(const EnvLookup& env) {
  for (const engines::Engine* e : engines::all())
    if (auto t = e->task_from_env(env)) return t;
  return std::nullopt;
}

std::optional<WorkerEnv> engine_worker_env(const EnvLookup& env) {
  auto t = detect_engine_task(env);
  if (!t) return std::nullopt;
  WorkerEnv w;
  w.rank = t->rank;
  w.world_size = t->world_size;
  w.local_rank = t->local_rank;
  w.local_world_size = t->local_world_size;
  w.group_rank = t->node_rank;
  w.group_world_size = std::max(1, t->nnodes);
  w.role_rank = t->rank;
  w.role_world_size = t->world_size;
  w.master_addr = t->master_addr;
  w.master_port = t->master_port;
  w.run_id = t->engine + "-" + t->job_id;
  w.use_agent_store = false;  // no agent: rank 0 hosts the store
  return w;
}

}  // namespace dtrain
