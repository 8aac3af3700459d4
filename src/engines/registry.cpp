// The engines, one line each, and what every engine does unless it says otherwise.
#include "engines/common.h"
#include "engines/engine.h"
#include "launch/options_internal.h"

namespace dtrain::engines {

// Each engine's file defines its accessor.
const Engine& local_engine();
const Engine& ssh_engine();
const Engine& slurm_engine();
const Engine& mpi_engine();
const Engine& spark_engine();
const Engine& ray_engine();

std::string quoted(const std::string& name) {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "lit" + string.
  std::string s = "\"";
  s += name;
  s += '"';
  return s;
}

const std::vector<const Engine*>& all() {
  // adopt() asks them in this order (ssh's flags before a Slurm step around them), and so does
  // task_from_env() (Slurm's variables before MPI's: srun can run mpirun's programs).
  static const std::vector<const Engine*> engines = {
      &local_engine(), &ssh_engine(),   &slurm_engine(),
      &mpi_engine(),   &spark_engine(), &ray_engine(),
  };
  return engines;
}

const Engine& named(const std::string& name) {
  for (const Engine* e : all())
    if (e->name() == name) return *e;
  throw_internal(__FILE__, __LINE__, "a registered engine", "no engine named '" + name + "'");
}

std::string cluster_engine_list(bool hints) {
  std::vector<std::string> names;
  for (const Engine* e : all())
    if (e->is_cluster()) names.push_back(hints ? e->listed() : quoted(e->name()));
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

const Engine& for_cluster(const ClusterOptions& c) {
  for (const Engine* e : all())
    if (e->is_cluster() && e->name() == c.engine) return *e;
  throw UsageError("ClusterOptions::engine: got '" + c.engine + "', expected " +
                   cluster_engine_list() +
                   "; with local_mode = false the Distributor needs the cluster's engine");
}

const Engine& for_job(const DistributorOptions& o) {
  return o.local_mode ? local_engine() : for_cluster(o.cluster);
}

std::string Engine::driver_address(const DistributorOptions&, const Placement&) const {
  return host_name_address();
}

int Engine::launch(LaunchOptions o) const { return run_agent(std::move(o)); }

Command Engine::workers_command(const JobRequest&) const {
  throw_internal(__FILE__, __LINE__, "runs_agents() == false",
                 "engine " + name() + " runs agents: the Distributor builds their command");
}

}  // namespace dtrain::engines
