// Cluster engines behind one interface: how a job's processes get onto machines.
//
// An engine is one file under src/engines/ (local, ssh, slurm, mpi, spark) implementing Engine
// and one line in registry.cpp. It answers, for its three users:
//   - the Distributor (ClusterOptions, a driver process): check the engine's options and
//     place ranks on hosts (place), the address the nodes reach the driver at
//     (driver_address), the command that starts the job (agents_command + add_run_flags for
//     engines that run a dtrain agent per node; workers_command for those that start the
//     workers themselves), what an exit code means (explain_exit), its free room (capacity,
//     for Tune);
//   - `dtrain run` (LaunchOptions, the launcher): take the job when the environment or the
//     flags say it is this engine's (adopt: a Slurm step, a host list), what --dry-run says
//     and checks (describe, check_hosts), how the job starts from here (launch);
//   - a worker started by the engine without dtrain's environment (task_from_env:
//     `srun -n 4 prog`, `mpirun -np 4 prog`; dtrain/engine_env.h).
// Capabilities are questions (runs_agents, why_not_elastic, shared_console), so nothing
// outside src/engines/ compares an engine's name. Engines are stateless singletons, safe to
// use from any thread.
//
// Adding an engine: docs/ARCHITECTURE.md, "Adding an engine".
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/params.h"
#include "dtrain/distributor_options.h"
#include "dtrain/engine_env.h"
#include "dtrain/launch.h"

namespace dtrain {
struct RunArgs;
}

namespace dtrain::engines {

// The variable through which a function-mode worker finds its call (HOST:PORT:RUN_ID of the
// Distributor's store): every engine must bring it to the workers.
inline constexpr const char* kDistributorTaskVariable = param::kDistributorTask.name;

// A Distributor job's ranks on hosts, once its engine has checked the options.
struct Placement {
  int nproc_per_node = 0;          // workers per node; 0: each host its slots (ssh host file)
  std::vector<std::string> hosts;  // node 0 first, where the engine knows them up front (ssh)
  detail::ElasticPlan elastic;     // ClusterOptions::{min_nodes, max_nodes} resolved
};

// What the Distributor asks an engine to start.
struct JobRequest {
  const DistributorOptions& options;
  const Placement& placement;
  std::string launcher;  // the `dtrain` launcher (engines that run agents)
  std::string task;      // function mode: DTRAIN_DISTRIBUTOR_TASK's value; "" for a program
  std::string run_id;    // the run's --rdzv-id (unique per Distributor run)
};

// A process to start from the driver: its argv (the Distributor appends the rest) and the
// environment changes it gets.
struct Command {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // set
  std::vector<std::string> unset;          // not inherited
};

// An engine's room for worker processes, as far as it can tell (Tune sizes concurrency by it).
struct Capacity {
  int total_slots = 0;  // worker processes its machines hold
  int free_slots = 0;   // of them, not taken now
  // free_slots is counted now, net of the slots every running job holds (a Tune search's own
  // trials among them), so asking again as jobs come and go follows the cluster (spark's kept
  // application, ray). false: a count that running jobs do not change (local's cores, ssh's
  // host slots) or change only in part (slurm: a step takes one CPU per node from the idle
  // count, whatever number of workers it runs there).
  bool net_of_jobs = false;
};

// A way for the driver to run a command on one of a job's hosts (Tune keeps a warm fork server
// on each, src/tune/warm_hosts.h).
struct HostCommand {
  std::string host;               // as the job names it ("n1", "user@n1")
  std::vector<std::string> argv;  // runs the shell command appended as one more word there,
                                  // its stdin and stdout connected to the driver's
  std::string dtrain;             // the `dtrain` launcher's path on that host
};

// --dry-run's check of a job's hosts.
struct HostCheck {
  std::vector<std::string> why;  // per host: "" when usable, else why not
  std::string ok;                // what "usable" means (", reachable over ssh")
  bool marks_this_node = false;  // the plan marks LaunchOptions::node_rank as "this node"
};

// "\"NAME\"", as messages quote an engine.
std::string quoted(const std::string& name);

class Engine {
 public:
  virtual ~Engine() = default;

  // The name in ClusterOptions::engine and LaunchOptions::engine.
  virtual std::string name() const = 0;
  // How the name is listed in "expected ..." messages: "\"ssh\" (a host file or list)".
  virtual std::string listed() const { return quoted(name()); }

  // ---- capabilities ----
  // Usable as ClusterOptions::engine (false: local, which is DistributorOptions::local_mode).
  virtual bool is_cluster() const { return true; }
  // Whether a dtrain agent runs on each node (restarts, per-rank logs, the failure file,
  // rank-prefixed output, elastic membership). false: the engine starts the workers itself.
  virtual bool runs_agents() const { return true; }
  // "" when the engine can run an elastic job (min_nodes < max_nodes); else why not.
  virtual std::string why_not_elastic() const { return ""; }

  // ---- the Distributor (a driver process) ----
  // Checks this engine's options for the job `o` and places its ranks. Throws UsageError
  // naming the field and what to change.
  virtual Placement place(const DistributorOptions& o) const = 0;
  // plan_elastic's engine-specific checks (after the common ones): `given` opens the message;
  // node_count: the engine's nodes without elasticity; max_nodes: resolved (0 -> node_count).
  virtual void check_elastic(const ClusterOptions& c, const std::string& given, int node_count,
                             int max_nodes) const {}
  // An elastic plan's engine-specific part (the `dtrain run` flags are built already).
  virtual void finish_elastic(const ClusterOptions& c, detail::ElasticPlan& plan) const {}
  // The address the nodes reach the driver at when ClusterOptions::driver_addr is empty.
  // Default: this host's name resolved (a UsageError when that is only loopback).
  virtual std::string driver_address(const DistributorOptions& o, const Placement& p) const;
  // Engines with agents: the command up to and including the launcher (`srun ... dtrain`,
  // `spark-submit ... -- dtrain`, or just the launcher), and its environment.
  virtual Command agents_command(const JobRequest& r) const { return {{r.launcher}, {}, {}}; }
  // Engines with agents: this engine's flags for `dtrain run` (ssh: the hosts).
  virtual void add_run_flags(const JobRequest& r, std::vector<std::string>& argv) const {}
  // Engines without agents: the command that starts the workers, up to the program.
  virtual Command workers_command(const JobRequest& r) const;
  // What the job's exit code means when no worker reported a failure; nullopt: nothing known.
  virtual std::optional<std::string> explain_exit(const ClusterOptions& c, int exit_code) const {
    return std::nullopt;
  }
  // The job's hosts and how to run a command on each, for engines whose agents run on hosts
  // known up front that the driver reaches itself (ssh); `launcher`: the local `dtrain`.
  // nullopt when the engine places the processes itself (Spark's executors, Ray's placement
  // groups, Slurm's allocation, the MPI launcher).
  virtual std::optional<std::vector<HostCommand>> host_commands(const DistributorOptions& o,
                                                                const std::string& launcher) const {
    return std::nullopt;
  }
  // Room for workers now; nullopt when the engine cannot tell.
  virtual std::optional<Capacity> capacity(const DistributorOptions& o) const {
    return std::nullopt;
  }

  // ---- `dtrain run` (the launcher) ----
  // Takes the job when the flags or the environment make it this engine's (sets engine, hosts,
  // sizes, addresses in `o`); false when they do not. Asked in registry order.
  virtual bool adopt(LaunchOptions& o, const RunArgs& a, const EnvLookup& env) const {
    return false;
  }
  // --dry-run: how the engine starts the job, in a few words.
  virtual std::string describe() const = 0;
  // --dry-run: the hosts' check; nullopt when the job is this node's only.
  virtual std::optional<HostCheck> check_hosts(const LaunchOptions& o) const {
    return std::nullopt;
  }
  // Every agent's output reaches one console (srun's), so agents prefix it with their host.
  virtual bool shared_console() const { return false; }
  // LaunchOptions::ifname names an interface of this machine (ssh: of the hosts).
  virtual bool ifname_is_local() const { return true; }
  // Runs the job from here; returns `dtrain run`'s exit code. Default: this node's agent.
  virtual int launch(LaunchOptions o) const;

  // ---- a worker the engine started without dtrain's environment ----
  virtual std::optional<EngineTask> task_from_env(const EnvLookup& env) const {
    return std::nullopt;
  }
};

// ---- the registry (registry.cpp) ----
// Every engine, in the order adopt() and task_from_env() ask them.
const std::vector<const Engine*>& all();
// The engine named `name`; InternalError when there is none (names come from the registry).
const Engine& named(const std::string& name);
// ClusterOptions::engine's engine; UsageError listing the cluster engines when unknown.
const Engine& for_cluster(const ClusterOptions& c);
// A Distributor job's engine: local with local_mode, else for_cluster.
const Engine& for_job(const DistributorOptions& o);
// The cluster engines as a message lists them: "\"ssh\" (a host file or list), \"slurm\",
// \"mpi\" or \"spark\"" (hints false: "\"ssh\", \"slurm\", ...").
std::string cluster_engine_list(bool hints = true);

}  // namespace dtrain::engines
