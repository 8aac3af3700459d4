// Engine "ray": a Ray placement group of bundles, one dtrain agent per bundle run as a Ray task,
// by dtrain's Ray driver (python/dtrain/ray.py), one-shot or kept between run() calls
// (src/ray/ray_driver.h, dtrain/ray.h).
#include "core/params.h"
#include "engines/common.h"
#include "engines/engine.h"
#include "ray/ray_driver.h"

namespace dtrain::engines {
namespace {

// How long the first run() waits for a kept driver to connect (ray.init of a cold cluster).
constexpr std::chrono::seconds kDriverStart{300};

ray::Plan plan_of(const DistributorOptions& o) {
  const RayOptions& r = o.cluster.ray;
  return ray::plan(o.num_processes, o.use_gpu, r.processes_per_bundle, r.num_cpus_per_process,
                   r.num_gpus_per_process, r.strategy);
}

ray::Driver driver_of(const DistributorOptions& o) {
  const RayOptions& r = o.cluster.ray;
  ray::Driver d;
  d.address = ray::address(r.address);
  d.python = ray::python(r.python);
  d.placement_timeout = r.placement_timeout;
  d.term_timeout = o.term_timeout;
  d.driver_host = o.cluster.driver_addr;
  return d;
}

// The Ray head's host in an address ("ray://HOST:PORT", "HOST:PORT", "[V6]:PORT"); "" for
// "auto".
std::string head_host(std::string a) {
  if (a.rfind("ray://", 0) == 0) a = a.substr(6);
  a = a.substr(0, a.find('/'));
  if (a == "auto" || a == "local") return "";
  if (!a.empty() && a[0] == '[') return a.substr(1, a.find(']') - 1);
  const auto colon = a.rfind(':');
  return colon == std::string::npos ? a : a.substr(0, colon);
}

class Ray final : public Engine {
 public:
  std::string name() const override { return "ray"; }
  std::string listed() const override { return "\"ray\" (a Ray cluster)"; }
  std::string why_not_elastic() const override {
    return "a Ray placement group is reserved whole for the job (it does not grow or shrink with "
           "the cluster's nodes)";
  }
  // Every agent's output reaches the driver's console: only node 0's prints the whole failure
  // summary.
  bool shared_console() const override { return true; }

  Placement place(const DistributorOptions& o) const override {
    Placement p;
    p.elastic = detail::plan_elastic(o, 1);  // throws when min/max nodes are set
    p.nproc_per_node = plan_of(o).per_bundle;
    ray::address(o.cluster.ray.address);  // a UsageError now, not at the first run()
    return p;
  }

  // The local address that routes to the head (the nodes are on its network).
  std::string driver_address(const DistributorOptions& o, const Placement& p) const override {
    const std::string head = head_host(ray::address(o.cluster.ray.address));
    if (!head.empty()) {
      const Route r = route_to(head);
      if (!r.local.empty() && (!is_loopback_address(r.local) || r.target_loopback)) return r.local;
    }
    return Engine::driver_address(o, p);
  }

  Command agents_command(const JobRequest& r) const override {
    const DistributorOptions& o = r.options;
    const ray::Plan plan = plan_of(o);
    const ray::Driver d = driver_of(o);
    Command c;
    c.argv = o.cluster.ray.keep_driver
                 ? ray::kept_command(plan, d, o.cluster.ray.driver_idle_timeout, kDriverStart)
                 : ray::direct_command(plan, d);
    c.argv.push_back(r.launcher);
    return c;
  }

  std::optional<std::string> explain_exit(const ClusterOptions&, int exit_code) const override {
    return ray::explain_exit(exit_code);
  }

  // Processes of the job's size (CPUs and GPUs per process) the cluster's alive nodes hold
  // free now, asked of the kept driver.
  std::optional<Capacity> capacity(const DistributorOptions& o) const override {
    const ray::Plan plan = plan_of(o);
    const auto s = ray::slots(driver_of(o), plan.cpus, plan.gpus, o.cluster.ray.driver_idle_timeout,
                              kDriverStart);
    if (!s) return std::nullopt;
    return Capacity{s->total, s->free, true};
  }

  // An agent started by a Ray task (python/dtrain/ray.py sets DTRAIN_RAY_NODE): its flags give
  // the agent's node rank; the engine is Ray's, whose console every agent shares. The variable
  // says where its workers stand on their host, as Ray Train numbers them
  // (NODE_RANK:FIRST_LOCAL_RANK:LOCAL_WORLD_SIZE): bundles Ray placed on one node are one
  // host's workers.
  bool adopt(LaunchOptions& o, const RunArgs&, const EnvLookup& env) const override {
    const auto node = get(env, param::kRayNode.name);
    if (!node) return false;
    o.engine = name();
    const auto first = node->find(':');
    const auto second = node->find(':', first == std::string::npos ? first : first + 1);
    if (first == std::string::npos || second == std::string::npos) {
      throw UsageError(std::string(param::kRayNode.name) + " is '" + *node +
                       "', expected NODE_RANK:FIRST_LOCAL_RANK:LOCAL_WORLD_SIZE (dtrain's Ray "
                       "driver sets it; the agent and python/dtrain/ray.py must be one version)");
    }
    const char* who = "dtrain's Ray driver";
    o.host_rank = to_int(param::kRayNode.name, node->substr(0, first), who);
    o.first_local_rank =
        to_int(param::kRayNode.name, node->substr(first + 1, second - first - 1), who);
    o.host_world_size = to_int(param::kRayNode.name, node->substr(second + 1), who);
    if (o.host_world_size < o.first_local_rank + o.nproc_per_node) {
      throw UsageError(std::string(param::kRayNode.name) + " is '" + *node +
                       "': LOCAL_WORLD_SIZE " + std::to_string(o.host_world_size) +
                       " cannot hold local ranks " + std::to_string(o.first_local_rank) + ".." +
                       std::to_string(o.first_local_rank + o.nproc_per_node - 1) +
                       " (--nproc-per-node " + std::to_string(o.nproc_per_node) + ")");
    }
    return true;
  }

  std::string describe() const override {
    return "ray (one agent per bundle of a Ray placement group)";
  }
};

}  // namespace

const Engine& ray_engine() {
  static const Ray engine;
  return engine;
}

}  // namespace dtrain::engines
