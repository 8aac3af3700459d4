// ClusterOptions::{min_nodes, max_nodes}: the checks every engine shares, the engine's own
// (Engine::why_not_elastic, check_elastic, finish_elastic), and the `dtrain run` flags that
// make an elastic job (see include/dtrain/distributor_options.h).
#include <sstream>
#include <string>

#include "dtrain/distributor_options.h"
#include "dtrain/error.h"
#include "engines/engine.h"

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
  const engines::Engine& engine = engines::for_cluster(c);
  if (const std::string why = engine.why_not_elastic(); !why.empty()) {
    std::string elastic_engines;
    for (const engines::Engine* e : engines::all()) {
      if (!e->is_cluster() || !e->why_not_elastic().empty()) continue;
      elastic_engines += elastic_engines.empty() ? "engine " : " or ";
      elastic_engines += engines::quoted(e->name());
    }
    throw UsageError(given + ": engine " + engines::quoted(engine.name()) +
                     " cannot run an elastic job: " + why + "; use " + elastic_engines +
                     ", or leave min_nodes/max_nodes 0");
  }
  int max_nodes = c.max_nodes == 0 ? node_count : c.max_nodes;
  engine.check_elastic(c, given, node_count, max_nodes);
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
  std::string conf = "last_call_timeout=" + seconds_text(c.last_call);
  if (c.heartbeat_timeout.count() > 0)
    conf += ",heartbeat_timeout=" + seconds_text(c.heartbeat_timeout);
  plan.run_args.insert(plan.run_args.end(), {"--rdzv-conf", conf});
  engine.finish_elastic(c, plan);
  return plan;
}

}  // namespace dtrain::detail
