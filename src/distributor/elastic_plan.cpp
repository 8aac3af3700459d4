// ClusterOptions::{min_nodes, max_nodes}: which engines can run an elastic job, and the
// `dtrain run` flags that make one (see include/dtrain/distributor.h).
#include <sstream>
#include <string>

#include "dtrain/distributor.h"
#include "dtrain/error.h"

namespace dtrain::detail {

namespace {

std::string seconds_text(std::chrono::milliseconds ms) {
  std::ostringstream s;
  s << static_cast<double>(ms.count()) / 1000.0;
  return s.str();
}

}  // namespace

ElasticPlan plan_elastic(const DistributorOptions& o, int node_count) {
  const ClusterOptions& c = o.cluster;
  ElasticPlan plan;
  if (c.min_nodes == 0 && c.max_nodes == 0) return plan;
  const std::string given = "ClusterOptions::min_nodes = " + std::to_string(c.min_nodes) +
                            ", max_nodes = " + std::to_string(c.max_nodes);
  if (o.local_mode) {
    throw UsageError(given +
                     ": min_nodes and max_nodes count the nodes of a cluster job "
                     "(local_mode = false, an engine in ClusterOptions::engine); local mode runs "
                     "num_processes workers on this one machine. Leave them 0 (to restart failed "
                     "workers here, set DistributorOptions::max_restarts)");
  }
  if (c.min_nodes < 1) {
    throw UsageError(given +
                     ": min_nodes must be at least 1 (the fewest nodes the job runs "
                     "on) when max_nodes is set; give both, e.g. min_nodes = 1, max_nodes = " +
                     std::to_string(std::max(c.max_nodes, 2)));
  }
  if (c.max_nodes < 0) {
    throw UsageError(given + ": max_nodes must be >= min_nodes, or 0 for the engine's node count");
  }
  if (c.engine == "mpi") {
    throw UsageError(given +
                     ": engine \"mpi\" cannot run an elastic job: the MPI launcher "
                     "starts a fixed set of ranks once and no dtrain agent re-forms the group; "
                     "use engine \"ssh\" or \"slurm\", or leave min_nodes/max_nodes 0");
  }
  if (c.engine == "spark") {
    throw UsageError(given +
                     ": engine \"spark\" cannot run an elastic job: a barrier stage "
                     "runs all its tasks or none; use engine \"ssh\" or \"slurm\", or leave "
                     "min_nodes/max_nodes 0");
  }
  int max_nodes = c.max_nodes == 0 ? node_count : c.max_nodes;
  if (c.engine == "ssh" && max_nodes != node_count) {
    throw UsageError(given + ": engine \"ssh\" starts one agent on each of the " +
                     std::to_string(node_count) + " host(s), so max_nodes must be " +
                     std::to_string(node_count) +
                     " (or 0 for that); list the hosts the job may use");
  }
  if (c.engine == "slurm" && c.max_nodes != 0 && c.nodes != 1 && c.nodes != c.max_nodes) {
    throw UsageError(given + ", nodes = " + std::to_string(c.nodes) +
                     ": with engine \"slurm\" max_nodes replaces `nodes` (srun -N max_nodes); "
                     "leave nodes at 1 or set it to max_nodes");
  }
  if (c.min_nodes > max_nodes) {
    throw UsageError(given + ": min_nodes is more than max_nodes" +
                     (c.max_nodes == 0
                          ? " (0: the engine's " + std::to_string(node_count) + " node(s))"
                          : std::string()) +
                     "; the job needs min_nodes <= max_nodes");
  }
  if (o.cluster.last_call.count() < 0) {
    throw UsageError("ClusterOptions::last_call must be >= 0, got " +
                     std::to_string(c.last_call.count()) + " ms");
  }
  if (c.heartbeat_timeout.count() < 0) {
    throw UsageError(
        "ClusterOptions::heartbeat_timeout must be >= 0 (0: the agents' default), got " +
        std::to_string(c.heartbeat_timeout.count()) + " ms");
  }
  plan.min_nodes = c.min_nodes;
  plan.max_nodes = max_nodes;
  plan.elastic = c.min_nodes < max_nodes;
  if (!plan.elastic) return plan;  // MIN == MAX: a fixed-size job, as without them
  plan.run_args = {"--nnodes", std::to_string(c.min_nodes) + ":" + std::to_string(max_nodes)};
  // With a host list the launcher picks the c10d backend itself; under srun it is a flag.
  if (c.engine == "slurm") plan.run_args.insert(plan.run_args.end(), {"--rdzv-backend", "c10d"});
  std::string conf = "last_call_timeout=" + seconds_text(c.last_call);
  if (c.heartbeat_timeout.count() > 0)
    conf += ",heartbeat_timeout=" + seconds_text(c.heartbeat_timeout);
  plan.run_args.insert(plan.run_args.end(), {"--rdzv-conf", conf});
  // srun -N MAX, not MIN-MAX: for a range Slurm may give the minimum even when more nodes are
  // free (seen on the test cluster: -N 1-2 ran on one of two idle nodes).
  if (c.engine == "slurm") plan.srun_nodes = std::to_string(max_nodes);
  return plan;
}

}  // namespace dtrain::detail
